"""Lecture 6 section 10's drawing: the mbarrier trace of ``reference.simulators.mbarrier.run_pingpong`` as a timeline.

One row per barrier, one column per action in the order the model ran them: a triangle where a phase completes
(an arrival, or the copy engine landing a TMA load) labelled with the new phase count, a circle where an agent's
wait passes, labelled with the parity it waited for. Colours: the agent that acted.
"""
from __future__ import annotations

COLORS = {"producer": "tab:green", "WG0": "tab:blue", "WG1": "tab:orange"}


def barrier_timeline(ax, events, rows=None, title=""):
    """Draw ``events`` (``reference.simulators.mbarrier.Event``) on ``ax``; ``rows``: the barrier names to show, top down."""
    rows = rows or sorted({e.barrier for e in events if e.barrier})
    y = {name: i for i, name in enumerate(rows)}
    for e in events:
        if e.barrier not in y:
            if e.action == "issue":
                ax.axvline(e.step, color=COLORS[e.agent], lw=0.6, alpha=0.35)
            continue
        yy = y[e.barrier]
        if e.action == "wait":
            ax.plot(e.step, yy, "o", ms=9, mfc="white", mec=COLORS[e.agent])
            ax.text(e.step, yy, str(e.parity), ha="center", va="center", fontsize=6, color=COLORS[e.agent])
        else:
            ax.plot(e.step, yy, "^", ms=9, color=COLORS[e.agent])
            ax.text(e.step, yy - 0.42, str(e.phase_after), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("action (model order); thin lines: a consumer issues a matmul round", fontsize=7)
    ax.set_title(title, fontsize=8)
    for name, c in COLORS.items():
        ax.plot([], [], "s", color=c, label=name)
    ax.plot([], [], "o", mfc="white", mec="k", label="wait passes (parity)")
    ax.plot([], [], "^", color="k", label="arrive / TMA lands (phases done)")
    ax.legend(fontsize=6, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.18))
