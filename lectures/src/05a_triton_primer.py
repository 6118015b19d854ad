# %% [markdown]
# # Lecture 5a — A Triton primer: from a vector add to a tiled matmul
#
# **Learning objectives.** After this lecture you can:
#
# 1. Write and launch a Triton kernel: program ids, blocks of offsets, a grid of `cdiv(n, BLOCK)` programs.
# 2. Implement masked loads and stores for a ragged tail, and say what an unmasked store overwrites.
# 3. Build a tiled matmul with `tl.dot`, and explain what `num_warps`, `num_stages` and autotune change.
# 4. Use the interpreter to debug a kernel: `TRITON_INTERPRET=1`, `tl.device_print` and `tl.static_assert`.
# 5. Read the PTX of a kernel compiled for sm_90a on a CPU and find its masked loads.
#
# Lecture 5 placed FlashAttention's loops on thread blocks and warps and read the course's Triton kernels.
# Before you write your own in assignment `a3_triton`, this lecture builds up the language one idea at a time,
# on kernels small enough to read in full: a vector add, a one-row softmax, a tiled matmul. Everything runs on
# your CPU in Triton's interpreter; what only a GPU can tell (speed) is read from a results file measured on an
# H200, and what the compiler makes of a kernel is compiled here for the H200, without one.
#
# **Reading path:** lecture 5 → this lecture → lecture 5b (timing and profiling) → assignment `a3_triton`
# (its warm-up kernel is not graded: write it first).

# %%
import inspect
import math
import re

import numpy as np
import torch

from lectures._exercise import check_guess
from lectures._plots import load_results, not_run, setup
from reference.triton import DEVICE, INTERPRET  # noqa: E402  (sets TRITON_INTERPRET=1 when there is no GPU)

import triton  # noqa: E402  (after reference.triton: the interpreter switch must come first)
import triton.language as tl  # noqa: E402

from reference.triton import primer  # noqa: E402
from reference.triton.primer_ptx import ptx  # noqa: E402

plt = setup()
torch.manual_seed(0)
print("Triton", triton.__version__, "|", "interpreter on the CPU" if INTERPRET else "compiled for the GPU",
      "| tensors live on", DEVICE)


def show(jit_fn):
    """Print the source of a ``@triton.jit`` function (the object wraps the Python function as ``.fn``)."""
    print(inspect.getsource(getattr(jit_fn, "fn", jit_fn)))


# %% [markdown]
# ## 1. The first kernel: a vector add
#
# **The idea.** A Triton kernel is written for *one program*, and a launch runs a grid of programs, each on one
# thread block of the GPU. The program asks which one it is, `tl.program_id(0)`, and from that computes the
# **block** of elements it owns: `offs = pid * BLOCK + tl.arange(0, BLOCK)` is a vector of `BLOCK` indices. The
# tensors arrive as pointers to their first element, so `x_ptr + offs` is a block of addresses; `tl.load` reads
# them all, arithmetic works on whole blocks, and `tl.store` writes a block back. `BLOCK` is a `tl.constexpr`:
# its value is known when the kernel compiles (one compiled kernel per value), which `tl.arange` requires, and
# it must be a power of two. The compiler, not you, splits a block among the program's threads.
#
# **The code** (`reference.triton.primer.add_kernel`; `MASKED` is section 2's subject):

# %%
show(primer.add_kernel)

# %% [markdown]
# The launch names the grid in square brackets, then the arguments; torch tensors are passed as pointers, and
# the constexprs by keyword. With `n` elements and `BLOCK` per program, the grid needs `cdiv(n, BLOCK)` programs
# (`triton.cdiv` rounds up):

# %%
n, BLOCK = 1000, 256
x = torch.randn(n, device=DEVICE)
y = torch.randn(n, device=DEVICE)
out = torch.empty_like(x)
grid = (triton.cdiv(n, BLOCK),)
primer.add_kernel[grid](x, y, out, n, BLOCK=BLOCK)
print(f"grid = {grid}; max |out - (x + y)| = {(out - (x + y)).abs().max().item()}")

# %% [markdown]
# **What to observe.** Nothing in the kernel loops over elements: the loop is the grid. Four programs of 256
# lanes cover 1024 indices, so the last program holds 24 lanes past the end of the tensors.
#
# **Predict, then run.** With `n = 5000` and `BLOCK = 1024`: how many lanes of the last program fall past the
# end (lanes that the mask must switch off)?

# %%
guess = None  # your answer, a number of lanes
n_ex, block_ex = 5000, 1024
check_guess(guess, triton.cdiv(n_ex, block_ex) * block_ex - n_ex, rel=0, what="masked lanes, n=5000, BLOCK=1024")

fig, ax = plt.subplots(figsize=(8, 1.6))
lanes = np.arange(triton.cdiv(n_ex, block_ex) * block_ex)
ax.scatter(lanes, lanes // block_ex, c=np.where(lanes < n_ex, lanes // block_ex, -1), cmap="tab10", s=2, vmin=-1,
           vmax=9)
ax.axvline(n_ex, color="k", ls=":")
ax.text(n_ex + 20, 1.5, "n: lanes to the right are masked off", fontsize=8)
ax.set_xlabel("element index = pid * BLOCK + lane"); ax.set_ylabel("program id"); ax.set_yticks(range(5))
ax.set_title("who owns what: 5 programs of 1024 lanes over n = 5000", fontsize=9)
plt.tight_layout()

# %% [markdown]
# ## 2. Masks, `other=` and the ragged tail
#
# **The idea.** A mask is a block of booleans, one per lane: `tl.load(ptr, mask=m, other=v)` reads only where
# `m` is true and gives `v` elsewhere; `tl.store(ptr, val, mask=m)` writes only where `m` is true. Masking the
# tail costs almost nothing (the GPU predicates the instructions, section 6). Choose `other` for what comes
# next: `0` before a sum, `-inf` before a max (section 3), anything before a masked store.
#
# **What an unmasked store does.** Without a mask the last program reads and writes past the end. The GPU does
# not check: the addresses past a tensor usually belong to *another* tensor of your program (the caching
# allocator packs them), which is silently overwritten; only an address in no allocation at all raises an
# "illegal memory access", and only `compute-sanitizer` reliably catches the rest. The interpreter does not
# check either. To watch it safely, put `out` at the front of a larger buffer whose tail stands for the
# neighbouring tensor, filled with a sentinel:

# %%
n, BLOCK = 1000, 256
x_pad = torch.cat([x, torch.full((200,), 100.0, device=DEVICE)])   # the inputs, each followed by 200 elements
y_pad = torch.cat([y, torch.full((200,), 100.0, device=DEVICE)])   # that the unmasked loads will read
buffer = torch.full((1200,), -7.0, device=DEVICE)   # out = buffer[:n]; buffer[n:] is "someone else's tensor"
primer.add(x_pad[:n], y_pad[:n], block=BLOCK, out=buffer[:n], masked=True)
print("masked   : neighbour untouched:", bool((buffer[n:] == -7.0).all()))
primer.add(x_pad[:n], y_pad[:n], block=BLOCK, out=buffer[:n], masked=False)
changed = int((buffer[n:] != -7.0).sum())
print(f"unmasked : {changed} elements of the neighbour overwritten, e.g. {buffer[n:n + 3].tolist()}")
print("          : and the first n elements are still right:", bool(torch.equal(buffer[:n], x + y)))

# %% [markdown]
# **What to observe.** The result in `out` is right, so a test that only compares `out` passes, while the
# neighbour holds garbage: the bug shows up later, somewhere else. That is why every Triton assignment here
# grades ragged sizes (`n` no multiple of the block), and why a kernel's loads and stores take a mask unless
# the shapes guarantee that the blocks divide them.
#
# **Predict, then run.** The same unmasked kernel with `n = 900` and `BLOCK = 128`: how many elements past
# the end does it overwrite?

# %%
guess = None  # your answer, a number of elements
n2 = 900
buffer.fill_(-7.0)
primer.add(x_pad[:n2], y_pad[:n2], block=128, out=buffer[:n2], masked=False)
check_guess(guess, int((buffer[n2:] != -7.0).sum()), rel=0, what="elements overwritten, n=900, BLOCK=128")
print(f"(the last of the {triton.cdiv(n2, 128)} programs covers {triton.cdiv(n2, 128) * 128 - n2} lanes past n)")

# %% [markdown]
# ## 3. One fused softmax row
#
# **The idea.** Give each row to one program and hold the whole row in one block (`BLOCK` = the next power of
# two of the row length). The program loads the row once, computes the max, the exponentials, their sum and
# the quotient in registers, and stores once: one read and one write per element, where an unfused softmax
# launches one kernel per step (max, subtract, exp, sum, divide), each reading the matrix from HBM and most
# writing one back. Reductions take an axis:
# `tl.max(x, axis=0)` of a 1-d block is a scalar. The masked lanes load `-inf`, so they never win the max and
# add `exp(-inf) = 0` to the sum: `other=` chosen for the reduction.

# %%
show(primer.softmax_row_kernel)

# %%
x = torch.randn(7, 300, device=DEVICE) * 5
y = primer.softmax_rows(x)
ref = torch.softmax(x.double(), -1)
print(f"BLOCK = {triton.next_power_of_2(300)} for rows of 300; max |y - float64 softmax| = "
      f"{(y.double() - ref).abs().max().item():.1e}")

# %% [markdown]
# **What to observe.** The row's statistics never leave the program: this is the fused softmax of a3's Part 1
# for rows that fit in one block. Two things are left for the assignment: rows longer than a block (loop over
# column blocks with lecture 1's online softmax) and rows that are entirely `-inf` (a fully masked row).
#
# **Predict, then run.** What does this kernel return for a row of all `-inf`? (Answer with a string:
# `"nan"`, `"0.0"`, `"inf"`, ...)

# %%
guess = None  # your answer, a string
masked_row = torch.full((1, 8), float("-inf"), device=DEVICE)
with np.errstate(invalid="ignore"):   # the interpreter computes with NumPy, which would warn about -inf - -inf
    row_out = primer.softmax_rows(masked_row)
check_guess(guess, str(float(row_out[0, 0])), what="softmax of an all -inf row")
print("max = -inf, so x - max = -inf - (-inf) = nan: a3 asks for zeros here (guard the max, as lecture 1 did)")

# %% [markdown]
# ## 4. A tiled matmul: `tl.dot`, `num_warps`, `num_stages`, autotune
#
# **The idea.** Lecture 2's tiled matmul, one tile of `C` per program. The grid is 2-d: program
# `(i, j) = (tl.program_id(0), tl.program_id(1))` owns the `BLOCK_M x BLOCK_N` tile of `C` at block row `i`,
# block column `j`. A 2-d block of addresses comes from broadcasting two 1-d blocks: `rows[:, None] * stride +
# cols[None, :]`. The program walks along `K` in steps of `BLOCK_K`, loads a tile of `A` and one of `B`, and
# adds their product into a float32 accumulator with `tl.dot(a, b, acc)`, which runs on the tensor cores.
# `tl.dot` needs every tile side to be at least 16; the masks of the `K` tail load `0`, which adds nothing.

# %%
show(primer.matmul_kernel)

# %%
a = torch.randn(70, 100, device=DEVICE)
b = torch.randn(100, 45, device=DEVICE)
c = primer.matmul(a, b, block_m=32, block_n=32, block_k=32)
print(f"C = A B, (70 x 100) (100 x 45), 32 x 32 tiles: grid {(triton.cdiv(70, 32), triton.cdiv(45, 32))}, "
      f"{triton.cdiv(100, 32)} K steps; max |err| = {(c.double() - a.double() @ b.double()).abs().max().item():.1e}")

fig, ax = plt.subplots(figsize=(4.2, 3.2))
owner = np.add.outer(np.arange(70) // 32 * 2, np.arange(45) // 32)
ax.imshow(owner, cmap="tab10", vmin=0, vmax=9, aspect="auto", interpolation="nearest"); ax.grid(False)
for i in range(3):
    for j in range(2):
        ax.text((j * 32 + min(j * 32 + 32, 45)) / 2 - 0.5, (i * 32 + min(i * 32 + 32, 70)) / 2 - 0.5, f"({i},{j})",
                fontsize=8, color="white", ha="center", va="center")
ax.set_title("C (70 x 45): the tile each program (i, j) writes;\nthe last row and column of tiles are ragged",
             fontsize=9)
ax.set_xlabel("column"); ax.set_ylabel("row")
plt.tight_layout()

# %% [markdown]
# **Launch options.** Besides the grid and the constexprs, a launch takes `num_warps`, the warps (32 threads
# each) that share one program's tile, and `num_stages`, how many `K` steps the compiler keeps in flight: while
# `tl.dot` works on step `k`, the loads of steps `k + 1, ..., k + num_stages - 1` are already on their way into
# shared memory (software pipelining). More stages hide more memory latency but each holds a tile of `A` and
# one of `B` in shared memory (228 KB per SM on an H100/H200, of which one program may use about 227 KB).
#
# **Predict, then run.** With 128 x 128 tiles of `C`, `BLOCK_K = 64` and fp16 inputs, how many KiB of shared
# memory do the `A` and `B` tiles of `num_stages = 4` take?

# %%
guess = None  # your answer, in KiB
bm, bn, bk, stages, elem = 128, 128, 64, 4, 2
check_guess(guess, stages * (bm * bk + bk * bn) * elem / 1024, what="shared memory of 4 stages (KiB)")

# %% [markdown]
# **The autotuner.** Which tiles, warps and stages are fastest depends on the GPU and the shape, so Triton can
# try several: `triton.autotune(configs=[triton.Config({...constexprs...}, num_warps=, num_stages=), ...],
# key=[argument names])` wraps a kernel; the first launch for each new value of the key arguments times every
# config and keeps the fastest. These are the primer's:

# %%
for cfg in primer.MATMUL_CONFIGS:
    print(cfg)
c_tuned, chosen = primer.matmul_tuned(a, b)
print("chosen here:", chosen, "(the interpreter cannot time kernels: it takes the first config)")

# %% [markdown]
# On a GPU the choice matters. `benchmarks/course/bench_primer.py` times the same kernel on a 4096 x 4096 x 4096
# fp16 product (each point a median of `triton.testing.do_bench`; lecture 5b explains the timing):

# %%
runs = [(p, r) for p, r in load_results("*-primer.json") if isinstance(r, dict) and "sweeps" in r]
if not runs:
    not_run("GPU primer benchmark", "<gpu>-primer.json", "python3 -m benchmarks.course.bench_primer")
for path, r in runs:
    mm = r["sweeps"]["matmul"]
    print(f"{path.name} ({r['meta']['gpu']}, Triton {r['meta']['triton']}): {mm['n']}^3 {mm['dtype']} matmul")
    print("  BLOCK_M x BLOCK_N x BLOCK_K  warps  stages   ms      TFLOP/s")
    for row in mm["rows"]:
        t = f"{row['ms']:.3f}  {row['tflops']:7.0f}" if "ms" in row else row.get("error", "")[:60]
        print(f"  {row['block_m']:4d} x {row['block_n']:4d} x {row['block_k']:3d}      {row['num_warps']:2d}     "
              f"{row['num_stages']}    {t}")
    at = mm["autotuned"]
    print(f"  autotuned: {at['config']} -> {at['tflops']:.0f} TFLOP/s (its first call, timing every config: "
          f"{at['first_call_s']:.2f} s); torch.matmul (cuBLAS): {mm['torch_tflops']:.0f} TFLOP/s")
    st = [row for row in mm["rows"] if (row["block_m"], row["block_n"], row["num_warps"]) == (128, 128, 8)
          and "ms" in row]
    print("  128 x 128 x 64, 8 warps, by stages:", ", ".join(
        f"{row['num_stages']}: {row['tflops'] / max(q['tflops'] for q in st):.0%} of the best" for row in st))
    fig, ax = plt.subplots(figsize=(5, 2.6))
    ax.plot([row["num_stages"] for row in st], [row["tflops"] for row in st], "o-")
    ax.axhline(mm["torch_tflops"], color="gray", ls="--", label="torch.matmul")
    ax.set_xlabel("num_stages (128 x 128 x 64 tiles, 8 warps)"); ax.set_ylabel("TFLOP/s"); ax.legend(fontsize=8)
    ax.set_title(f"{r['meta']['gpu']}: software pipelining", fontsize=9)
    plt.tight_layout()

# %% [markdown]
# **What to observe.** One stage (no pipelining: each load waits for the previous `tl.dot`) falls well short of
# two or three (the percentages printed above); more stages stop paying once the latency is hidden. Small
# tiles lose more: a 32 x 32 tile reads each element of `A` and `B` four times as often as a 128 x 128 tile
# (lecture 2: the traffic of a tiled matmul falls as the tile side grows). The autotuned config is within
# noise of the best row (lecture 5b measures that noise); the vendor library (cuBLAS) is faster still, with
# tricks (TMA copies, warp specialisation) that lecture 6 shows.
#
# ## 5. Debugging in the interpreter
#
# **The idea.** With `TRITON_INTERPRET=1` in the environment *before* a kernel is defined, `@triton.jit`
# returns an interpreted function: each program runs in turn, in Python, on NumPy arrays. So Python's `print`,
# `breakpoint()` and a debugger work inside a kernel, and an out-of-bounds mistake shows up in your own
# process. Three tools work in both modes:
#
# * `tl.device_print("name", value)` prints a value from inside the kernel (the interpreter: one line per
#   program, the whole block; a GPU: one line per element per thread, so print from tiny launches only);
# * `tl.static_assert(cond, "msg")` checks a constexpr condition when the kernel compiles: a wrong block size is
#   refused before anything runs;
# * `tl.device_assert(cond, "msg")` checks a run-time condition (on a GPU only with `TRITON_DEBUG=1`).

# %%
@triton.jit
def peek_kernel(x_ptr, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK >= 4, "BLOCK must be at least 4")
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.device_print("offs", offs)
    tl.device_print("x", tl.load(x_ptr + offs, mask=offs < n, other=0.0))


peek_kernel[(2,)](torch.arange(6.0, device=DEVICE), 6, BLOCK=4)

# %% [markdown]
# **What to observe.** The tuple in front of each line is the program id `(x, y, z)`; the second program's
# loads past `n = 6` came back as `other = 0`. Now the errors the interpreter turns into messages. A
# `static_assert` that fails, and the most common first mistake, a block size that is not a `constexpr`:

# %%
try:
    peek_kernel[(1,)](torch.zeros(8, device=DEVICE), 8, BLOCK=2)
except Exception as exc:  # noqa: BLE001 -- shown, not hidden
    print(type(exc).__name__, "->", str(exc).strip().splitlines()[-1])


@triton.jit
def runtime_block_kernel(x_ptr, n):
    offs = tl.arange(0, n)            # n is a run-time int, so the compiler cannot size the block
    tl.store(x_ptr + offs, 1.0)


try:
    runtime_block_kernel[(1,)](torch.zeros(8, device=DEVICE), 8)
except Exception as exc:  # noqa: BLE001
    print(type(exc).__name__, "->", str(exc).strip().splitlines()[-1])

# %% [markdown]
# **Predict, then run.** `tl.device_print` in a launch of 3 programs with `BLOCK = 4`, under the interpreter:
# how many lines does one `device_print` call print?

# %%
guess = None  # your answer, a number of lines
import contextlib  # noqa: E402
import io  # noqa: E402


@triton.jit
def one_print_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.device_print("x", tl.load(x_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)))


captured = io.StringIO()
n_programs = 3
with contextlib.redirect_stdout(captured):
    one_print_kernel[(n_programs,)](torch.arange(12.0, device=DEVICE), BLOCK=4)
lines = [ln for ln in captured.getvalue().splitlines() if ln.strip()]
# on a GPU the device prints through printf, past Python's stdout: the interpreter's rule is one line a program
check_guess(guess, len(lines) if INTERPRET else n_programs, rel=0, what="lines printed by one device_print, 3 programs")
print("\n".join(lines) if INTERPRET else "(on a GPU: one line per element and thread, 12 here)")

# %% [markdown]
# ## 6. Reading the compiled code: PTX for an H200, compiled on this CPU
#
# **The idea.** Triton compiles a kernel to PTX (NVIDIA's virtual instruction set) and then to machine code
# for one GPU. The compiler needs no GPU for that: `reference.triton.primer_ptx.ptx` compiles the primer's
# kernels for sm_90a (the H100/H200) in a fresh process with the interpreter off, and returns the PTX text.
# Reading it answers questions no timer can: did the mask become predicates or branches, are the loads vector
# loads, how many registers does a thread hold?
#
# **Predict, then run.** The masked add with `BLOCK = 1024` and `num_warps = 4` (128 threads): each thread owns
# `1024 / 128 = 8` elements of `x` and 8 of `y`. How many `ld.global` instructions does one thread run?

# %%
guess = None  # your answer, a number of load instructions
ptx_masked = ptx("add", {"BLOCK": 1024, "MASKED": 1}, num_warps=4)
loads = [ln.strip() for ln in ptx_masked.splitlines() if "ld.global" in ln]
check_guess(guess, len(loads), rel=0, what="ld.global instructions, masked add, BLOCK=1024, 4 warps")
print(re.search(r"\.target \S+", ptx_masked).group(0), "| PTX lines:", len(ptx_masked.splitlines()))
print("\n".join([ln.strip() for ln in ptx_masked.splitlines() if "setp.lt.s32" in ln][:2]))
print("\n".join(loads[:3]), "\n ...")

# %% [markdown]
# **What to observe.** `setp.lt.s32 %p1, ...` computes one lane's `offs < n` into a predicate register, and
# `@%p1 ld.global...` runs the load only where it is true: the mask costs one compare per element and no branch.
# Each load here moves one 32-bit word. A launch does better: the JIT checks each pointer and integer argument
# and, when it is a multiple of 16, compiles a variant that knows it, so four neighbouring floats can move in
# one 128-bit `ld.global.v4`. The same kernel compiled as a launch with aligned tensors sees it, and the
# unmasked one for comparison:

# %%
ptx_aligned = ptx("add", {"BLOCK": 1024, "MASKED": 1}, num_warps=4, aligned=True)
ptx_unmasked = ptx("add", {"BLOCK": 1024, "MASKED": 0}, num_warps=4, aligned=True)
for name, text in (("masked, aligned", ptx_aligned), ("unmasked, aligned", ptx_unmasked)):
    lds = [ln.strip() for ln in text.splitlines() if "ld.global" in ln]
    print(f"{name:18s}: {len(lds)} loads, {sum(ln.startswith('@') for ln in lds)} predicated; first: {lds[0]}")

# %% [markdown]
# **What to observe.** Aligned, each thread's 8 elements of `x` take 2 vector loads instead of 8 scalar ones:
# `16 / 4 = 4` times fewer load instructions for the same bytes. The unmasked kernel's loads carry no
# predicate: it reads whatever lies past `n`, as section 2 showed. Assignment `a3`'s kernels compile the same
# way; `python -m reference.triton.primer_ptx --help` compiles the softmax and the matmul too (look for
# `mma` or `wgmma` instructions in the matmul's PTX: the tensor cores).
#
# **Next:** lecture 5b times these kernels properly, then assignment `a3_triton`.
