"""The threats the grader defends against (docs/design.md §6): one registry of ids, names, attacks, what the grader
guarantees and what it does not. The grader's modules name threats only through it (``threats.T17`` or
``from .threats import T17``, ``ZEROING``, ``explain``), never as strings, and docs/design.md §6's table is
``markdown_table()`` (``tests/test_autograder_threats.py`` checks both).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Threat:
    id: str
    name: str            # what a flag's explanation says the submission did
    attack: str
    guarantee: str       # what the grader does, and so guarantees
    limit: str           # what it does not guarantee
    zeroing: bool        # a flag of this threat zeroes every test of the flagged task(s)


NONE_KNOWN = "none known"
ZERO, KEEP = True, False     # a flag of the threat zeroes the flagged task(s) / only its effect on the score counts


def _row(zeroing: bool, name: str, attack: str, guarantee: str, limit: str = NONE_KNOWN) -> tuple:
    return name, attack, guarantee, limit, zeroing


# one row per threat, numbered in order (the first row is T1): _row(zeroing, name, attack, guarantee[, limit])
_ROWS = (
    _row(ZERO, "tried to write files or forge output", "write or forge the results file, print fake score lines",
               "the submission runs in a child process; only the parent writes results, and the score comes from "
               "the parent's own comparisons, never from the child's output", "nothing the child prints is read as "
               "a result, so there is nothing left to forge"),
    _row(ZERO, "tried to read files, hidden cases or expected outputs", "read expected outputs or hidden cases, or "
               "the instructor's solution", "expected outputs exist only in the parent; hidden inputs come from a "
               "secret seed; the course checkout is hidden from the child (an empty filesystem over it where the OS "
               "allows, an audit hook in any case)", "without namespaces only the audit hook stands (the result "
               "JSON says so)"),
    _row(ZERO, "tampered with libraries or the grader (monkeypatching, introspection)", "monkeypatch "
               "`numpy.allclose`, `torch.testing`, the checker", "comparisons happen in the parent, on raw arrays; "
               "patches in the child are detected and flagged", "the child's own Python state is the submission's: "
               "only what the parent judges counts"),
    _row(ZERO, "used pickling hooks", "return a malicious pickle", "results travel as `.npy` with "
               "`allow_pickle=False` (or as raw buffers)"),
    _row(KEEP, "replayed cached answers", "cache or replay answers (keyed on an input hash, an id, a call count)",
               "fresh inputs on every call, the first case repeated with fresh values; outputs of timed calls are "
               "checked again", "a timed rep is checked on a sample of its elements (whole on two reps per case)"),
    _row(KEEP, "modified its inputs", "mutate the inputs (zero them, return them)", "the child gets copies; inputs "
               "are checked to be unchanged after the call"),
    _row(KEEP, "returned uninitialised memory", "return uninitialised memory that happens to hold the reference "
               "result", "the reference never runs in the child; output buffers are poisoned before calls"),
    _row(KEEP, "computed only part of the output", "compute only part of the output (the first tile, the first row)",
               "error over the full tensor, ragged shapes, non-uniform inputs, every tiled function's correctness "
               "tests span >= 2 tiles plus a ragged tail", "a bug that shows only on shapes no hidden generator "
               "draws"),
    _row(KEEP, "returned NaN/Inf or a constant", "NaN/Inf, or a constant output that passes a loose tolerance",
               "NaN positions must match; relative error on non-degenerate data"),
    _row(ZERO, "the answer was not computed by the required implementation (a library function, or torch doing a "
               "Triton part's work)", "call a library instead of implementing it (`F.scaled_dot_product_attention`, "
               "`torch.softmax`, `reference.*`, `flash_attn`, `np` on the full N x N in a \"tiled\" task), or compute "
               "the answer with torch and let a Triton kernel only copy it", "a static scan of imports and names, "
               "run-time traps, the op audit of every graded call of a Triton part (a compute op on input-derived "
               "data, or input data escaping to NumPy/Python, is the verdict, naming the op and the line), a memory "
               "check for tiling", "the op audit sees torch's dispatcher: a way around it that the static scan and "
               "the traps do not know can compute unseen (see the host-code policy below)"),
    _row(ZERO, "a forbidden call was caught by try/except (still recorded)", "try/except falling back to a "
               "forbidden function",
               "run-time traps report to the parent before raising, so catching the exception does not hide it"),
    _row(KEEP, "returned lower precision than asked", "lower precision than asked", "the output dtype is checked; "
               "cases that fail at lower precision"),
    _row(ZERO, "hid work from the timer (threads/streams)", "do the work on a side CUDA stream or thread so that "
               "timing misses it", "the device clock counts every kernel, copy and fill of the call on every "
               "stream; device-wide synchronise before the clock stops; the parent's clock bounds the child's "
               "clocks", "a side stream is not a flag by itself (only its effect on the time counts)"),
    _row(ZERO, "returned an array subclass or lazy object", "return a lazy tensor subclass", "`type(out)` must be "
               "exactly `np.ndarray` / `torch.Tensor`"),
    _row(ZERO, "patched timers", "patch timers (`time.perf_counter`, `torch.cuda.Event`, the profiler)", "the "
               "harness's clocks are in the patch snapshot (patched: T3/T15); a child's time longer than the "
               "parent's go-to-done clock is not believed"),
    _row(ZERO, "timed calls returned wrong (cached) results", "do all the work on the first call, then return "
               "cached results", "every timed call is checked on fresh inputs", "as T5: sampled checks on most "
               "timed reps"),
    _row(ZERO, "process tricks (fork, signals, floods, processes left running)", "denial of service by process "
               "tricks: fork bomb, signals to the grader, disk or stdout flood, processes that outlive grading; "
               "(a7) starting programs during a compile-only check", "process calls refused below Python (audit "
               "hook), rlimits, output truncation, a PID namespace (every descendant dies with the child), leftover "
               "processes killed; the flag needs positive evidence (a trapped call, a flood, a process left "
               "behind). A crash, hang, OOM or CUDA fault is a failed test with a diagnosis, never this flag; the "
               "next test runs in a fresh child", "a hang costs the case's time limit, and the task's other tests "
               "are skipped; in the interpreter a write past a buffer that does not crash corrupts the child "
               "silently (each function after a Triton part gets a fresh child, so only the same function's later "
               "tests can pay for it)"),
    _row(ZERO, "network, environment or file-system escape", "reach the network, read secrets from the environment, "
               "leave files for the next submission", "a scrubbed environment, per-submission temporary and Triton "
               "cache directories, no network where the OS allows", "network isolation needs unprivileged user "
               "namespaces (the result JSON says)"),
    _row(KEEP, "behaved differently when checked", "tell a check run from the graded run (poisoned buffers, timing, "
               "call counts) and behave differently", "no second run: every correctness call is audited, so there "
               "is no unaudited answer to switch to", "timed repetitions run unaudited: detecting the audit by "
               "timing can buy speed points only"),
    _row(KEEP, "(the grader's own failure) accused an honest student", "(the grader's own failure) accuse an honest "
               "student", "a flag needs positive evidence (an op, a call, an import, a file); a crash or a wrong "
               "answer is never evidence; correct unusual submissions score full over 200 seeds of every hidden "
               "generator", "only the bundled unusual submissions are tested over many seeds"),
    _row(KEEP, "(the grader's own failure) speed points that depend on the machine", "(the grader's own failure) "
               "speed points that depend on concurrent gradings or on the GPU model", "the student's and the "
               "reference's times come from the same run, in the same kind of process, on the same inputs; timed "
               "reps hold their GPU's timing lane exclusively (`gpu_lane.py`) and are timed by the device's clock "
               "(`device_clock.py`: host load does not enter it); thresholds are set from device-clock ratios "
               "measured on an H200; `benchmarks/grader/speed_stability.py` grades one submission alone and inside "
               "`grade-all -j 4` and a copy doing 3x the kernel work, which must lose its speed points", "H100 "
               "thresholds are still to be measured (`notes/speed_calibration.md`); a grading's load-time GPU work "
               "(top-level cells) runs outside the lane; processes that name one GPU differently (an index here, a "
               "UUID there) do not share a lane"),

)
THREATS = tuple(Threat(f"T{i}", *row) for i, row in enumerate(_ROWS, start=1))

BY_ID = {t.id: t for t in THREATS}
ZEROING = frozenset(t.id for t in THREATS if t.zeroing)
T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15, T16, T17, T18, T19, T20, T21 = (
    t.id for t in THREATS)


def explain(threat_id: str) -> str:
    """A flag's explanation: what a submission flagged with ``threat_id`` did."""
    t = BY_ID.get(threat_id)
    return t.name if t else ""


def markdown_table() -> str:
    """docs/design.md §6's threat table, one row per threat."""
    rows = ["| id | attack | what the grader guarantees | what it does not |", "|---|---|---|---|"]
    rows += [f"| {t.id} | {t.attack} | {t.guarantee} | {t.limit} |" for t in THREATS]
    return "\n".join(rows)
