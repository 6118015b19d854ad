"""The score histogram ``grade-all`` writes beside its CSV: how many students got each tenth of the required
score (the last bar holds exactly 100%), drawn with matplotlib's file-only Agg backend (no display needed)."""
from __future__ import annotations

BINS = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]


def counts(percents) -> list:
    """Students per bar: ``[0, 10)``, ..., ``[80, 90)``, ``[90, 100)``, and ``100`` alone (full marks)."""
    out = [0] * (len(BINS))
    for p in percents:
        p = min(100.0, max(0.0, float(p)))
        out[len(BINS) - 1 if p >= 100.0 else int(p // 10)] += 1
    return out


def write_histogram(rows, path, title: str) -> str:
    """PNG of the ``percent`` column of grade-all's rows at ``path``; returns the path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = counts(r["percent"] for r in rows)
    labels = [f"{lo}-{lo + 10}" for lo in BINS[:-1]] + ["100"]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    bars = ax.bar(range(len(c)), c, color="#4472c4")
    ax.bar_label(bars, labels=[str(n) if n else "" for n in c])
    ax.set_xticks(range(len(c)), labels, rotation=0, fontsize=8)
    ax.set_xlabel("percent of the required points")
    ax.set_ylabel("students")
    flagged = sum(1 for r in rows if r.get("flags"))
    ax.set_title(f"{title}: {len(rows)} submission(s), {flagged} flagged")
    ax.set_ylim(0, max(c + [1]) * 1.15)
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))      # whole students
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
