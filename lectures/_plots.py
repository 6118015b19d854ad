"""Small plotting and file helpers shared by the lectures (no algorithms here: those live in ``reference``)."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np


def repo_root() -> Path:
    """The course repository's root, whatever the working folder: the folder above this package (``make setup``
    installs it in place, editable), else the working folder or the first of its parents that holds
    ``benchmarks/results`` (a copy installed elsewhere, run from inside the repository)."""
    here, cwd = Path(__file__).resolve().parent.parent, Path.cwd().resolve()
    for cand in (here, cwd, *cwd.parents):
        if (cand / "benchmarks" / "results").is_dir():
            return cand
    return here


ROOT = repo_root()
RESULTS = ROOT / "benchmarks" / "results"


def setup():
    """Embed figures as PNG (renders on GitHub) with a compact style; returns ``plt``."""
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
        set_matplotlib_formats("png")
    except ImportError:  # plain python (no IPython): draw off-screen
        matplotlib.use("Agg")
    plt.rcParams.update({"figure.dpi": 90, "figure.figsize": (7, 3.4), "axes.grid": True, "grid.alpha": 0.3,
                         "axes.spines.top": False, "axes.spines.right": False, "font.size": 10})
    np.set_printoptions(precision=4, suppress=True, linewidth=110)
    return plt


def load_results(pattern: str, *, exclude=("smoke",)) -> list[tuple[Path, dict]]:
    """``[(path, parsed json), ...]`` for ``benchmarks/results/<pattern>``, skipping smoke-test files."""
    out = []
    for p in sorted(RESULTS.glob(pattern)):
        if any(x in p.name for x in exclude):
            continue
        try:
            out.append((p, json.loads(p.read_text())))
        except (OSError, json.JSONDecodeError) as e:
            print(f"could not read {p.relative_to(ROOT)}: {e}")
    return out


def not_run(what: str, pattern: str, command: str = "make bench"):
    print(f"{what}: benchmarks/results/{pattern} is not there yet -- the benchmark has not been run on this "
          f"checkout, so no numbers are shown (none are invented). Run `{command}` on a GPU to produce it.")


def tile_grid(ax, visited, title="", cmap="Blues", annotate=False):
    """Show a (Tr, Tc) array of visit orders (0 = skipped) as coloured tiles."""
    visited = np.asarray(visited)
    shown = np.ma.masked_where(visited == 0, visited)
    ax.imshow(shown, cmap=cmap, vmin=0, vmax=max(1, visited.max()), aspect="equal")
    ax.set_xticks(range(visited.shape[1]))
    ax.set_yticks(range(visited.shape[0]))
    ax.set_xlabel("key/value block j")
    ax.set_ylabel("query block i")
    ax.grid(False)
    ax.set_title(title)
    if annotate:
        for (i, j), v in np.ndenumerate(visited):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                        color="white" if v > 0.6 * visited.max() else "black")


def gantt(ax, sched, title="", label=lambda t: f"b{t.batch} q{t.q_block}"):
    """Draw a ``reference.simulators.scheduling.Schedule`` as one row of boxes per worker."""
    colours = plt.cm.tab10.colors
    for w, tl in enumerate(sched.timeline):
        for start, end, t in tl:
            ax.barh(w, end - start, left=start, color=colours[t.batch % 10], edgecolor="black", height=0.7)
            if end - start >= 1 and label is not None:
                ax.text((start + end) / 2, w, label(t), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(sched.n_workers))
    ax.set_yticklabels([f"SM {w}" for w in range(sched.n_workers)])
    ax.invert_yaxis()
    ax.set_xlabel("time (key blocks processed)")
    ax.set_title(f"{title}  loads={sched.loads}, makespan={sched.makespan}")
