# %% [markdown]
# # Lecture 5b — Timing and profiling a kernel
#
# **Learning objectives.** After this lecture you can:
#
# 1. Explain why a GPU timing needs a warm-up and a synchronise, and spot a timing that skipped either.
# 2. Choose between `triton.testing.do_bench`, CUDA events and CUDA-graph replay, and say what each includes.
# 3. Measure with the cache flushed between calls, and report a median over rotated rounds instead of one number.
# 4. Estimate where a kernel sits on the roofline from its bytes, its FLOPs and the measured copy bandwidth.
# 5. Read the key lines of an Nsight Compute (`ncu`) profile: duration, memory throughput, registers, occupancy.
#
# A kernel is fast only if a measurement says so, and a GPU makes measuring easy to get wrong: the host returns
# before the kernel has run, the first call compiles, the second finds its data in the cache, and two runs of
# the same thing differ. This lecture takes the course's own method apart, one rule at a time: each rule is
# first shown with a CPU timer on this machine, then with numbers measured on an H200 by
# `benchmarks/course/bench_primer.py` (the kernels of lecture 5a) and read from `benchmarks/results/`.
#
# **Reading path:** lecture 5a → this lecture → assignment `a3_triton`.

# %%
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from lectures._exercise import check_guess
from lectures._plots import RESULTS, load_results, not_run, setup
from reference.triton import DEVICE, INTERPRET
from reference.triton import primer

plt = setup()
rng = np.random.default_rng(0)
runs = [r for _, r in load_results("*-primer.json") if isinstance(r, dict) and "timers" in r]
gpu = runs[0] if runs else None
if gpu is None:
    not_run("GPU primer benchmark", "<gpu>-primer.json", "python3 -m benchmarks.course.bench_primer")
else:
    print(f"GPU numbers: {gpu['meta']['gpu']}, torch {gpu['meta']['torch']}, Triton {gpu['meta']['triton']}")

# %% [markdown]
# ## 1. Synchronise: the host does not wait
#
# **The idea.** A kernel launch puts work in the GPU's queue and returns at once; the host goes on while the GPU
# works. A host clock read right after the launch measures the *launch*, not the kernel. `torch.cuda.synchronize()`
# (or `event.synchronize()`) waits until the queue has drained; only then does a clock reading cover the work.
#
# The same thing on a CPU: hand the work to a worker thread, which returns a future at once, as a launch does.

# %%
a = rng.standard_normal((200, 200))


def work():
    for _ in range(5):
        a @ a


with ThreadPoolExecutor(1) as pool:
    pool.submit(work).result()                  # warm-up
    t = time.perf_counter(); fut = pool.submit(work); t_launch = time.perf_counter() - t
    fut.result()                                # "synchronise"
    t = time.perf_counter(); pool.submit(work).result(); t_sync = time.perf_counter() - t
print(f"submit only: {t_launch * 1e3:.3f} ms   submit + wait: {t_sync * 1e3:.3f} ms  "
      f"(the first number says nothing about the work)")

# %% [markdown]
# On the H200, the primer's vector add over 3 x 256 MiB (`x`, `y` read, `out` written):
#
# **Predict, then run.** At the copy bandwidth measured in the same run, how many milliseconds must this add
# take at the least? (bytes / bandwidth)

# %%
guess = None  # your answer, in ms
if gpu is not None:
    large, copy = gpu["timers"]["large"], gpu["ceilings"]["copy_bytes_per_s"]
    check_guess(guess, large["bytes"] / copy * 1e3, what=f"ms to move {large['bytes'] / 2**20:.0f} MiB at "
                f"{copy / 1e12:.2f} TB/s")
    print(f"host clock, no synchronise : {large['host_no_sync_ms']:.3f} ms  <- faster than memory allows: the launch")
    print(f"host clock, synchronised   : {large['host_sync_ms']:.3f} ms")
    print(f"do_bench (CUDA events)     : {large['do_bench_ms']:.3f} ms")

# %% [markdown]
# ## 2. Warm up: the first call compiles
#
# **The idea.** The first launch of a Triton kernel for a new set of constexprs and argument properties runs
# the compiler (Python to PTX to machine code), then loads the module; later launches find it in the cache.
# An autotuned kernel's first call also times every config. Torch has first-call costs too (CUDA context,
# cuBLAS handles). So every timer runs the function a few times before it starts the clock.

# %%
if gpu is not None:
    fc = gpu["first_call"]
    print(f"{gpu['meta']['gpu']}: first call {fc['first_ms']:.0f} ms (compile + load), warm call "
          f"{fc['warm_ms'] * 1e3:.0f} us: {fc['first_ms'] / fc['warm_ms']:,.0f} times longer")
    print(f"the autotuned matmul's first call (compile and time 4 configs): "
          f"{gpu['sweeps']['matmul']['autotuned']['first_call_s']:.2f} s")

# %% [markdown]
# (The interpreter compiles nothing, so on this CPU a first call is only a little slower than the next; lecture
# 5a's section 6 runs the compiler itself, for sm_90a, and takes seconds.)

# %% [markdown]
# ## 3. Three GPU timers: `do_bench`, CUDA events, CUDA graphs
#
# **The idea.** A CUDA *event* is a timestamp the GPU writes when it reaches that point of its queue, so
# `e0.record(); fn(); e1.record(); e1.synchronize(); e0.elapsed_time(e1)` is GPU time between the two marks.
# What lies between them matters:
#
# * **events around one call**: if the GPU was idle, `e0` is written at once and the GPU then waits for the
#   host to finish launching `fn`: the launch's host time (tens of microseconds for a Triton launch from
#   Python, lecture 9) lands inside;
# * **`triton.testing.do_bench(fn)`**: runs `fn` for about 25 ms to warm up, then about 100 ms of calls, each
#   between two events and each after zeroing a 256 MB buffer (an L2 flush, section 4); the GPU is still busy
#   with the flush when the host launches `fn`, so the launch is hidden; it returns the median (ask for it:
#   `return_mode="median"`);
# * **CUDA graph replay**: capture the calls once (`torch.cuda.CUDAGraph`), then replay the graph: the GPU
#   runs the captured launches with no Python in between, as a serving engine does.
#
# The table: the primer's add, small (3 x 4 MiB: it fits in the H200's L2) and large (3 x 256 MiB), each
# method a median of 50 calls (`do_bench`: of its ~100 ms of calls).

# %%
LABELS = {"host_no_sync_ms": "host clock, no sync", "host_sync_ms": "host clock + sync",
          "events_ms": "events, one call", "events_flush_ms": "events, L2 flushed first",
          "do_bench_ms": "do_bench (median)", "graph_ms": "CUDA graph replay"}
if gpu is not None:
    t = gpu["timers"]
    print(f"{'method':26s} {'small (us)':>11s} {'large (us)':>11s}  large, GB/s")
    for k, label in LABELS.items():
        print(f"{label:26s} {t['small'][k] * 1e3:11.1f} {t['large'][k] * 1e3:11.1f}  "
              f"{t['large']['bytes'] / t['large'][k] / 1e6:10.0f}")
    print(f"small add: events around one call / do_bench = {t['small']['events_ms'] / t['small']['do_bench_ms']:.1f}x;"
          f" large add: {t['large']['events_ms'] / t['large']['do_bench_ms']:.2f}x")
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    for ax, size in zip(axes, ("small", "large")):
        ax.barh(list(LABELS.values()), [t[size][k] * 1e3 for k in LABELS], color="tab:blue")
        ax.set_xlabel("microseconds"); ax.set_title(f"vector add, {size}: {t[size]['bytes'] / 2**20:.0f} MiB moved",
                                                    fontsize=9)
    axes[1].set_yticklabels([])
    plt.tight_layout()

# %% [markdown]
# **What to observe.** For the large add every synchronised method agrees to within the launch and the
# synchronise that the host clock also counts: the kernel dwarfs them. For the small one they do not: events
# around one call, like the host clock, report mostly the launch, a few times the kernel's own time (the ratio
# printed under the table). `do_bench` and the graph see the kernel itself (the graph adds its own small launch
# per replay). The rule: time a small kernel with `do_bench` or a graph, never with one pair of events around
# one eager call; and report which.
#
# ## 4. Flush the cache: hot and cold data
#
# **The idea.** A second call on the same inputs finds them in the cache (the H100/H200's L2 holds 50 MB), so a
# loop over one small input measures the cache, not memory. `do_bench` evicts it by writing 256 MB before each
# call; benchmarks that need HBM traffic can also rotate over several input sets larger than L2
# (`benchmarks._common.graph_ms` does). The CPU shows the same effect with its own caches: sum a 256 KiB array
# while it is hot, and again after writing 64 MiB of something else:

# %%
small_arr = rng.standard_normal(32 * 1024)          # 256 KiB: fits in this CPU's L2
evict = np.empty(8 * 2**20)                          # 64 MiB: larger than its last-level cache


def median_us(fn, flush: bool, reps: int = 200) -> float:
    ts = []
    for _ in range(reps):
        if flush:
            evict.fill(1.0)                          # outside the timed region, like do_bench's flush
        t = time.perf_counter_ns(); fn(); ts.append(time.perf_counter_ns() - t)
    return statistics.median(ts) / 1e3


small_arr.sum()
hot, cold = median_us(small_arr.sum, False), median_us(small_arr.sum, True)
print(f"sum of 256 KiB: hot {hot:.1f} us, after a flush {cold:.1f} us ({cold / hot:.1f}x)")

# %% [markdown]
# **What to observe.** The cold time is the honest one for a kernel whose inputs come from memory each time (a
# layer of a model sees fresh activations); the hot time is right only when the data really stays in the cache
# between uses. State which one you measured.
#
# ## 5. Noise: medians, repeats and rotated rounds
#
# **The idea.** Clocks drift (a GPU boosts and throttles with temperature and power), other processes run, and a
# kernel right after a heavy one can start on a hot chip. So: take the **median** of many calls (not the mean,
# which one slow call moves; not the minimum, which rewards luck), **repeat** the whole measurement, and when
# comparing kernels time them in **rotated rounds**, so each is timed in every position of the order. The
# course's benchmarks do it with `benchmarks._common.rotated_rounds`, whose order rule is this: rounds
# alternate between the listed and the reversed order, and every second round rotates it by one more place, so
# each kernel is timed twice in every position and behind at least two different ones.

# %%
def rotated_rounds(fns: dict, rounds: int, timer) -> dict:
    """``{name: [timer(fn) of each round]}``, the functions taken in the order rule above."""
    names, out = list(fns), {k: [] for k in fns}
    for i in range(rounds):
        order = names if i % 2 == 0 else names[::-1]
        shift = (i // 2) % len(names)
        for name in order[shift:] + order[:shift]:
            out[name].append(timer(fns[name]))
    return out


order = []
rotated_rounds({k: k for k in ("add", "softmax", "matmul")}, 6, lambda name: order.append(name) or 0.0)
for i in range(6):
    print(f"round {i}: {' -> '.join(order[3 * i:3 * i + 3])}")

# %% [markdown]
# On the H200, the small add timed by `do_bench` ten times in a row (each already a median of about a thousand
# calls),
# and three kernels in six rotated rounds:
#
# **Predict, then run.** Ten medians of the same kernel, same inputs, same process: how far is the largest above
# the smallest, in percent?

# %%
guess = None  # your answer, in percent
if gpu is not None:
    noise = gpu["noise"]["do_bench_ms"]
    check_guess(guess, (max(noise) / min(noise) - 1) * 100, rel=0.5, what="largest over smallest median - 1 (%)")
    print("the ten medians (us):", [f"{v * 1e3:.2f}" for v in noise])
    rounds = gpu["rounds"]["rounds"]
    for k, v in rounds.items():
        print(f"{k:8s} rounds (ms): {' '.join(f'{x:.4f}' for x in v)}   median {statistics.median(v):.4f}, "
              f"spread {(max(v) / min(v) - 1) * 100:.1f}%")

# %% [markdown]
# **What to observe.** One median in ten moved far more than a third while the others agree to a few percent:
# had that been the only measurement, the kernel would have looked much slower than it is. Over rounds, the
# memory-bound kernels are steady to a percent or two while the matmul (compute-bound, and so sensitive to the
# clock) moves by more than ten percent. Two versions whose difference is smaller than this spread are not
# known to differ: repeat before claiming a speed-up.
#
# ## 6. The roofline: how fast could it be?
#
# **The idea.** A kernel moves bytes and does FLOPs. With a memory bandwidth `B` and a compute rate `P`, it takes
# at least `max(bytes / B, FLOPs / P)`. Its arithmetic intensity `I = FLOPs / byte` says which term wins: below
# the ridge `P / B` it is memory-bound and its best possible rate is `I x B`; above it, compute-bound at `P`.
# Measure both ceilings on the machine instead of quoting a datasheet: the course's `copy_bandwidth` (a large
# device-to-device copy, bytes read plus bytes written per second) and a large `torch.matmul`.
#
# **Predict, then run.** The fp16 4096 x 4096 x 4096 matmul reads `A` and `B` and writes `C` (2 bytes an
# element) and does `2 n^3` FLOPs. What is its arithmetic intensity, in FLOP per byte?

# %%
guess = None  # your answer, FLOP / byte
n_mm = 4096
check_guess(guess, 2 * n_mm ** 3 / (3 * n_mm ** 2 * 2), what="arithmetic intensity of the 4096^3 fp16 matmul")
if gpu is not None:
    B, P = gpu["ceilings"]["copy_bytes_per_s"], gpu["ceilings"]["torch_bf16_matmul_tflops"] * 1e12
    print(f"measured ceilings: copy {B / 1e12:.2f} TB/s, bf16 matmul {P / 1e12:.0f} TFLOP/s, ridge {P / B:.0f} FLOP/B")
    fig, ax = plt.subplots(figsize=(6, 3.3))
    ii = np.logspace(-2, 4, 200)
    ax.loglog(ii, np.minimum(ii * B, P) / 1e12, "k-", label="roofline (measured ceilings)")
    # FLOP per byte moved: the add does 1 FLOP per 12 bytes (fp32 x, y read, out written); the softmax about 4
    # (subtract, exp, add, divide) per 4 bytes (fp16 in and out); the matmul 2 n^3 over its 3 n^2 fp16 elements
    intensity = {"add": 1 / 12, "softmax": 1.0}
    for k, v in gpu["rounds"]["rounds"].items():
        ms, nbytes, flops = statistics.median(v), gpu["rounds"]["bytes"][k], gpu["rounds"]["flops"][k]
        inten = flops / nbytes if flops else intensity[k]
        rate = inten * nbytes / (ms * 1e-3)
        ax.plot(inten, rate / 1e12, "o", label=f"{k}: {nbytes / (ms * 1e-3) / B:.0%} of copy bandwidth"
                if not flops else f"{k}: {flops / (ms * 1e-3) / P:.0%} of the matmul ceiling")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)"); ax.set_ylabel("TFLOP/s"); ax.legend(fontsize=7)
    ax.set_title(f"{gpu['meta']['gpu']}: the primer's kernels on the roofline", fontsize=9)
    plt.tight_layout()

# %% [markdown]
# **What to observe.** The add and the softmax sit far left of the ridge: their measure is the fraction of copy
# bandwidth they reach (the add all of it, the one-row softmax most of it), and no amount of arithmetic tuning
# can lift them above the sloped line. The matmul sits right of the ridge: its measure is TFLOP/s against
# torch's matmul. This is how the course reports every kernel: a decode kernel as a fraction of copy bandwidth
# (lecture 7), an attention forward in TFLOP/s (lectures 5 and 6).
#
# ## 7. Reading an Nsight Compute profile
#
# **The idea.** A timer says how long; a profiler says why. `ncu` replays one kernel launch many times, reading
# hardware counters each time, and reports them by section. The course runs it on a chosen region of a program
# (`benchmarks._common.profile_once` brackets it with `cudaProfilerStart/Stop`) and keeps the CSV:
#
# ```
# ncu --csv --clock-control none --profile-from-start off --section SpeedOfLight \
#     --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -k regex:softmax_row \
#     python3 -m benchmarks.course.bench_primer --ncu-region
# ```
#
# Here: the primer's one-row softmax on 8192 x 4096 fp16, launched with 4 and with 16 warps per program.

# %%
import csv  # noqa: E402

ncu_path = RESULTS / "h200-softmax-ncu.csv"
launches = {}
if not ncu_path.exists():
    not_run("ncu profile of the softmax", ncu_path.name, "the ncu command above")
else:
    with open(ncu_path, newline="") as f:
        for row in csv.DictReader(f):
            if row["Metric Name"]:
                launches.setdefault(row["ID"], {})[row["Metric Name"]] = (row["Metric Value"], row["Metric Unit"])
    SHOW = ("Duration", "DRAM Throughput", "Memory Throughput", "L2 Hit Rate", "Block Size", "Registers Per Thread",
            "Theoretical Occupancy", "Achieved Occupancy", "Waves Per SM")

    def shown(value: str, unit: str) -> str:
        if unit == "byte/s":                     # ncu writes bytes per second in full: show TB/s
            return f"{float(value.replace(',', '')) / 1e12:.2f} TB/s"
        return f"{value} {unit}".strip()

    print(f"{'metric':24s}" + "".join(f"{'launch ' + i:>22s}" for i in launches))
    for m in SHOW:
        print(f"{m:24s}" + "".join(f"{shown(*launches[i].get(m, ('-', ''))):>22s}" for i in launches))


def metric(launch: str, name: str) -> float:
    """A metric of one launch as a number (ncu writes thousands separators)."""
    return float(launches[launch][name][0].replace(",", ""))

# %% [markdown]
# How to read it:
#
# * **Duration** is the kernel alone on the GPU, with no launch and no event in it: a little shorter than
#   `do_bench`'s median for the same launch (section 3's table).
# * **DRAM Throughput** (%) is the fraction of the memory system's peak that the kernel kept busy, and the
#   *Memory Throughput* in bytes per second is what reached DRAM. A memory-bound kernel should be near the top,
#   less what its ramp-up and tail cost (a large share for one launch of a few tens of microseconds).
# * **L2 Hit Rate**: the softmax reads each element once, so its hits are mostly the writes, which the L2
#   absorbs and writes back later (some of them after the kernel ends).
# * **Registers Per Thread** and **Occupancy**: more warps per program each hold fewer elements, but the
#   registers per thread and the warps per SM decide how many programs share an SM at a time; the profile's
#   rules (not shown) name the limit ("occupancy is limited by the number of required registers").
#
# **Predict, then run.** The kernel must move 64 MiB in and 64 MiB out. From ncu's Duration of the 4-warp
# launch, what bandwidth in TB/s did it achieve, counted by the bytes it must move?

# %%
guess = None  # your answer, in TB/s
if launches:
    first, second = sorted(launches)[:2]
    must_move = 2 * 8192 * 4096 * 2
    achieved = must_move / (metric(first, "Duration") * 1e-9)
    check_guess(guess, achieved / 1e12, what="bytes it must move / ncu Duration (TB/s)")
    print(f"ncu's own DRAM bytes/s: {metric(first, 'Memory Throughput') / 1e12:.2f} TB/s "
          "(part of the output was still in L2 when the kernel ended)")
    print(f"16 warps instead of 4: Duration {metric(second, 'Duration') / metric(first, 'Duration'):.2f}x, "
          f"achieved occupancy {metric(first, 'Achieved Occupancy'):.0f}% -> "
          f"{metric(second, 'Achieved Occupancy'):.0f}%")

# %% [markdown]
# **What to observe.** Counted by the bytes it must move, the softmax reaches about the copy bandwidth of
# section 3; the 16-warp launch is slower, which lecture 5a's `num_warps` sweep (the same kernel in
# `h200-primer.json`, below) shows too. More warps raised the occupancy (fewer registers per thread: each
# thread holds 8 elements of a 4096-column row instead of 32) but did not help: the row's max and sum must now
# be combined across 16 warps, through shared memory and barriers, twice per row. Occupancy is a means, not a
# goal; the duration decides.

# %%
if gpu is not None:
    sm = gpu["sweeps"]["softmax"]
    print(f"softmax {sm['shape']} {sm['dtype']}, do_bench:",
          ", ".join(f"{r['num_warps']} warps {r['gbps'] / 1e3:.2f} TB/s" for r in sm["rows"]))

# %% [markdown]
# ## 8. Exercise: time your own kernel
#
# Below, `time_kernel` follows this lecture's rules: warm-up calls, a synchronise around each timed call (on a
# GPU; a CPU call is synchronous), the median of many calls, and several rounds rotated between the functions
# compared (section 5's `rotated_rounds`). On a GPU, replace its inner timer by `triton.testing.do_bench` (it also flushes L2).
#
# 1. Set `mine` to your `softmax` from a3 (copy the cells that define it, or import your notebook's code) —
#    until then it is the primer's one-row softmax.
# 2. Run the cell; then report one metric and explain it in a sentence: elements per second, or (on a GPU) the
#    fraction of copy bandwidth, `2 x bytes / median time / copy bandwidth`.
#
# **Predict, then run.** On this CPU, under the interpreter, is the Triton softmax `"faster"` or `"slower"` than
# `torch.softmax`?

# %%
def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_kernel(fns: dict, reps: int = 5, rounds: int = 2, warmup: int = 2) -> dict:
    """``{name: median ms}`` over ``rounds`` rotated rounds, each round the median of ``reps`` synchronised calls."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()

    def one(fn):
        ts = []
        for _ in range(reps):
            sync(); t = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3

    return {k: statistics.median(v) for k, v in rotated_rounds(fns, rounds, one).items()}


mine = primer.softmax_rows        # <- your a3 softmax here
xs = torch.randn(16, 1000, device=DEVICE)
assert torch.allclose(mine(xs), torch.softmax(xs, -1), atol=1e-5), "check correctness before timing"
ms = time_kernel({"mine": lambda: mine(xs), "torch": lambda: torch.softmax(xs, -1)})
guess = None  # "faster" or "slower"
check_guess(guess, "slower" if ms["mine"] > ms["torch"] else "faster", what="the Triton softmax, on this machine")
for k, v in ms.items():
    print(f"{k:6s}: {v:.3f} ms, {xs.numel() / (v * 1e-3) / 1e6:8.1f} M elements/s, "
          f"{2 * xs.numel() * 4 / (v * 1e-3) / 1e9:7.2f} GB/s (read + write)")
print("(interpreter)" if INTERPRET else "")

# %% [markdown]
# **What to observe.** Under the interpreter every program runs in Python, one after the other, so the Triton
# kernel is much slower than torch's compiled CPU softmax: the CPU timings check your method, not your kernel.
# On a GPU the same method (with `do_bench` inside) ranks kernels; the grader times a3's softmax against the
# course's fused softmax this way, and the rounds and medians are why its speed points do not flip between two
# gradings.
