"""Ring attention on NCCL: time per step, communication hidden by compute, and scaling vs one GPU.

Each of ``--world-size`` ranks owns one GPU and a shard of a bf16 sequence (B=1, Hq=32, Hkv=8, d=128: GQA as
in Llama-class models), the course's Triton FA2 kernels (``--step triton``) or the Hopper wing's Gluon kernels
(``--step gluon``) are the local step, one kernel call per zig-zag step (``local_step.step_calls``), and K/V
chunks travel around the ring with NCCL ``batch_isend_irecv`` while the current chunk is computed. For every total length in ``--seqs``
and both layouts (causal: contiguous vs zig-zag; plus non-causal):

* ``ring_ms``: one forward ring attention, slowest rank (barrier to barrier), median of ``--reps``;
* ``compute_ms`` / ``wait_ms``: per step, CUDA events around the local step and around the wait for the next
  chunk (the communication that compute did NOT hide); ``comm_ms``: the same K/V passes alone (no compute);
  ``hidden = 1 - sum(wait) / comm`` (1.0: fully hidden);
* ``one_gpu_ms``: the Triton forward over the whole sequence on one GPU (rank 0, if it fits), and
  ``efficiency = one_gpu_ms / (world * ring_ms)`` (1.0: perfect scaling; the goal is >= 0.85 at 128k causal
  zig-zag on 2 GPUs);
* ``pass = "backward"`` rows (unless ``--no-backward``): the causal zig-zag backward ring (dQ local, fp32 dK/dV
  travelling with their chunk) against the one-GPU Triton backward.

Before timing, rank outputs are gathered and compared with the one-GPU forward on a short sequence.

With ``--world-size 1`` (a single GPU, e.g. for a smoke test) the same program runs in an NCCL group of one:
the ring has no sends (NCCL is used for the length all-reduce and barriers only), so it measures the cost of
the ring's decomposition and merges against the plain kernel; in addition the ring of ``--emulate`` ranks is
run rank after rank on the one GPU (``simulate_ring_attention``), which measures the per-rank, per-step compute
of each layout (the causal imbalance of the contiguous order, on real kernels) and predicts the ring time with
perfectly hidden communication (``sum over steps of the slowest rank``). These are NOT multi-GPU numbers.

    NCCL_NVLS_ENABLE=0 python3 -m benchmarks.course.bench_ring --world-size 2            # 2 GPUs
    NCCL_NVLS_ENABLE=0 python3 -m benchmarks.course.bench_ring --world-size 1 --seqs 32768,131072   # 1-GPU smoke
    python3 -m benchmarks.course.bench_ring --smoke       # CPU, gloo, torch local step, tiny: tests the script only

Writes ``<gpu>-ring-w<world>.json`` and ``.png`` into ``--out`` (``smoke-ring-*`` for ``--smoke``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"   # NVLink multicast (NVLS) off, before NCCL is ever loaded

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks._common import RESULTS, gpu_tag  # noqa: E402
from benchmarks._common import sync as _sync  # noqa: E402
from reference.distributed import layout as L  # noqa: E402
from reference.distributed.launch import run_ranks  # noqa: E402
from reference.distributed.ring_attention import (kv_ring_pass, ring_attention_backward,  # noqa: E402
                                                  ring_attention_forward, simulate_ring_attention)

SHAPE = {"B": 1, "hq": 32, "hkv": 8, "d": 128}
CONFIGS = [(True, "zigzag"), (True, "contiguous"), (False, "zigzag")]


def fwd_flops(n: int, causal: bool, shape=SHAPE) -> float:
    f = 4.0 * shape["B"] * shape["hq"] * n * n * shape["d"]
    return f / 2 if causal else f


def timed(fn, reps: int, warmup: int = 1, barrier: bool = True) -> float:
    """Median milliseconds of ``fn()`` between two barriers (so: the slowest rank's time)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        _sync()
        if barrier:
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync()
        if barrier:
            dist.barrier()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def full_inputs(n: int, device, dtype, seed: int, shape=SHAPE):
    g = torch.Generator(device=device).manual_seed(seed)
    mk = lambda h: torch.randn(shape["B"], h, n, shape["d"], generator=g, device=device, dtype=dtype)  # noqa: E731
    return mk(shape["hq"]), mk(shape["hkv"]), mk(shape["hkv"])


def one_gpu_backward(step_name: str):
    """``(q, k, v, o, lse, do) -> grads`` of the whole sequence on one device (causal)."""
    if step_name == "triton":
        from reference.triton.flash_bwd import flash_attention_backward
        return lambda q, k, v, o, lse, do: flash_attention_backward(q, k, v, o, lse, do, causal=True)
    from reference.distributed.local_step import get_step
    st = get_step(step_name)
    return lambda q, k, v, o, lse, do: st.backward(q, k, v, o, lse, do, True, q.shape[-1] ** -0.5)


def bench_backward(rank, world, q, k, v, n, opts) -> dict:
    """Causal zig-zag backward: the ring (dQ local, dK/dV travelling) vs the one-device backward."""
    step, lay = opts["step"], "zigzag"
    ql, kl, vl = (L.shard(x, rank, world, lay).contiguous() for x in (q, k, v))
    o, lse = ring_attention_forward(ql, kl, vl, causal=True, layout=lay, step=step, seq_lens=(n, n))
    do = torch.randn_like(o)
    stats = {}
    ring_ms = timed(lambda: ring_attention_backward(ql, kl, vl, o, lse, do, True, None, lay, step, None, (n, n),
                                                    stats), opts["reps"])
    gathered = [None] * world
    dist.all_gather_object(gathered, {"compute_ms": [x * 1e3 for x in stats["compute_s"]],
                                      "wait_ms": [x * 1e3 for x in stats["wait_s"]]})
    row = {"n": n, "causal": True, "layout": lay, "pass": "backward", "world": world, "ring_ms": ring_ms,
           "compute_ms": [g["compute_ms"] for g in gathered], "wait_ms": [g["wait_ms"] for g in gathered],
           "tflops": 2.5 * fwd_flops(n, True, opts["shape"]) / ring_ms / 1e9}
    if rank == 0 and opts["one_gpu"]:
        o1, lse1 = one_gpu_forward(step)(q, k, v, True)
        do1 = torch.randn_like(o1)
        row["one_gpu_ms"] = timed(lambda: one_gpu_backward(step)(q, k, v, o1, lse1, do1), opts["reps"],
                                  barrier=False)
        row["efficiency"] = row["one_gpu_ms"] / (world * ring_ms)
    return row


def one_gpu_forward(step_name: str):
    if step_name == "triton":
        from reference.triton import flash_attention_forward
        return lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal)
    from reference.distributed.local_step import get_step
    st = get_step(step_name)
    return lambda q, k, v, causal: st.forward(q, k, v, causal, q.shape[-1] ** -0.5)   # (o, lse)


# --------------------------------------------------------------------------------------------------------------
# the rank program
# --------------------------------------------------------------------------------------------------------------
def bench_rank(rank: int, world: int, opts: dict) -> dict:
    device = torch.device("cuda", rank) if opts["backend"] == "nccl" else torch.device("cpu")
    dtype = getattr(torch, opts["dtype"])
    step, shape = opts["step"], opts["shape"]
    single = one_gpu_forward(step)
    rows, checks = [], []

    # correctness first: gathered ring output == one-device forward on a short sequence
    n = opts["check_n"]
    for causal, lay in CONFIGS:
        q, k, v = full_inputs(n, device, dtype, 1, shape)
        o, _ = ring_attention_forward(*(L.shard(x, rank, world, lay) for x in (q, k, v)), causal=causal,
                                      layout=lay, step=step)
        parts = [torch.empty((shape["B"], shape["hq"], L.local_length(L.rank_segments(n, world, lay)[r]),
                              shape["d"]), device=device, dtype=dtype) for r in range(world)]
        dist.all_gather(parts, o.contiguous())
        ref = single(q, k, v, causal)
        ref = ref[0] if isinstance(ref, tuple) else ref
        err = float((L.unshard(parts, lay).float() - ref.float()).norm() / ref.float().norm())
        checks.append({"n": n, "causal": causal, "layout": lay, "rel_err": err})
        if err > 2e-2:
            raise AssertionError(f"ring output differs from the one-device forward: rel err {err:.3g} "
                                 f"(n={n}, causal={causal}, {lay})")

    for n in opts["seqs"]:
        q, k, v = full_inputs(n, device, dtype, 2, shape)
        one_ms = one_ms_full = None
        if rank == 0 and opts["one_gpu"]:
            try:
                one_ms = timed(lambda: single(q, k, v, True), opts["reps"], barrier=False)
                one_ms_full = timed(lambda: single(q, k, v, False), opts["reps"], barrier=False)
            except torch.OutOfMemoryError:
                one_ms = one_ms_full = None
        for causal, lay in CONFIGS:
            ql, kl, vl = (L.shard(x, rank, world, lay).contiguous() for x in (q, k, v))
            stats = {}
            fn = lambda: ring_attention_forward(ql, kl, vl, causal=causal, layout=lay, step=step,  # noqa: E731
                                                seq_lens=(n, n), stats=stats)
            ring_ms = timed(fn, opts["reps"])
            comm_ms = timed(lambda: kv_ring_pass(kl, vl, lay, seq_lens=(n, n)), opts["reps"]) if world > 1 else 0.0
            per = [dict(compute_ms=[x * 1e3 for x in stats["compute_s"]], wait_ms=[x * 1e3 for x in stats["wait_s"]])]
            gathered = [None] * world
            dist.all_gather_object(gathered, per[0])
            row = {"n": n, "causal": causal, "layout": lay, "pass": "forward", "world": world, "ring_ms": ring_ms,
                   "comm_ms": comm_ms,
                   "compute_ms": [g["compute_ms"] for g in gathered], "wait_ms": [g["wait_ms"] for g in gathered],
                   "tflops": fwd_flops(n, causal, shape) / ring_ms / 1e9}
            if world > 1 and comm_ms > 0:
                exposed = max(sum(g["wait_ms"]) for g in gathered)
                row["hidden"] = max(0.0, min(1.0, 1.0 - exposed / comm_ms))
            base = one_ms if causal else one_ms_full
            if base is not None:
                row["one_gpu_ms"] = base
                row["efficiency"] = base / (world * ring_ms)
            rows.append(row)
            del ql, kl, vl
        if opts["backward"]:
            rows.append(bench_backward(rank, world, q, k, v, n, opts))
        if world == 1 and opts["emulate"] > 1:
            for r in emulate(q, k, v, n, opts, step):
                base = one_ms if r["causal"] else one_ms_full
                if base is not None:
                    r["predicted_efficiency"] = base / (r["emulated_world"] * r["predicted_ring_ms"])
                rows.append(r)
        del q, k, v
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if rank == 0 and opts.get("partial"):   # what is done so far survives a timeout of the whole run
            with open(opts["partial"], "w") as f:
                json.dump({"meta": {**opts.get("meta", {}), "partial": True}, "checks": checks, "rows": rows}, f,
                          indent=1)
    return {"rows": rows, "checks": checks}


def emulate(q, k, v, n, opts, step) -> list:
    """One GPU: every rank of an ``--emulate``-rank ring, one after another (compute only, no sends)."""
    out, w = [], opts["emulate"]
    for causal, lay in CONFIGS:
        stats = {}
        simulate_ring_attention(q, k, v, w, causal=causal, layout=lay, step=step, stats=stats)   # warm-up
        simulate_ring_attention(q, k, v, w, causal=causal, layout=lay, step=step, stats=stats)
        per = [[x * 1e3 for x in r] for r in stats["compute_s"]]            # [rank][step]
        predicted = sum(max(per[r][s] for r in range(w)) for s in range(w))
        out.append({"n": n, "causal": causal, "layout": lay, "emulated_world": w, "compute_ms": per,
                    "predicted_ring_ms": predicted, "busiest_rank_share": max(map(sum, per)) / sum(map(sum, per))})
    return out


# --------------------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------------------
def print_table(rows):
    print(f"{'N':>7} {'pass':>8} {'causal':>6} {'layout':>10} {'ring ms':>9} {'TFLOP/s':>8} {'comm ms':>8} "
          f"{'hidden':>7} {'1-GPU ms':>9} {'eff':>6}")
    for r in rows:
        if "ring_ms" not in r:
            continue
        print(f"{r['n']:>7} {r['pass']:>8} {str(r['causal']):>6} {r['layout']:>10} {r['ring_ms']:>9.2f} "
              f"{r['tflops']:>8.1f} {r.get('comm_ms', float('nan')):>8.2f} {r.get('hidden', float('nan')):>7.2f} "
              f"{r.get('one_gpu_ms', float('nan')):>9.2f} {r.get('efficiency', float('nan')):>6.2f}")
    em = [r for r in rows if "emulated_world" in r]
    if em:
        print("\nemulated ring on one GPU (compute only; per-rank totals in ms, predicted = sum of slowest per step)")
        for r in em:
            totals = ", ".join(f"{sum(x):.1f}" for x in r["compute_ms"])
            print(f"{r['n']:>7} causal={str(r['causal']):5} {r['layout']:>10}: ranks [{totals}] predicted "
                  f"{r['predicted_ring_ms']:.2f} ms, busiest rank {r['busiest_rank_share']:.2f} of the work, "
                  f"predicted efficiency {r.get('predicted_efficiency', float('nan')):.2f}")


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for causal, lay in CONFIGS:
        rs = [r for r in rows if r.get("pass") == "forward" and r["causal"] == causal and r["layout"] == lay]
        if rs:
            axes[0].plot([r["n"] for r in rs], [r["ring_ms"] for r in rs], "o-",
                         label=f"ring {'causal' if causal else 'full'} {lay}")
        rs = [r for r in rs if "efficiency" in r]
        if rs:
            axes[1].plot([r["n"] for r in rs], [r["efficiency"] for r in rs], "o-",
                         label=f"{'causal' if causal else 'full'} {lay}")
    for causal in (True, False):
        rs = [r for r in rows if r.get("pass") == "forward" and "one_gpu_ms" in r and r["causal"] == causal
              and r["layout"] == "zigzag"]
        if rs:
            axes[0].plot([r["n"] for r in rs], [r["one_gpu_ms"] for r in rs], "k--" if causal else "k:",
                         label=f"one GPU {'causal' if causal else 'full'}")
    axes[0].set(xscale="log", yscale="log", xlabel="total sequence length", ylabel="forward ms", title=title)
    axes[1].axhline(0.85, color="grey", ls="--", lw=1)
    axes[1].set(xscale="log", xlabel="total sequence length", ylabel="one GPU / (world x ring)",
                title="scaling efficiency", ylim=(0, 1.1))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=None, help="ranks = GPUs (default: all visible GPUs)")
    ap.add_argument("--seqs", default="32768,65536,131072,262144", help="total sequence lengths, comma separated")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (median)")
    ap.add_argument("--emulate", type=int, default=2, help="with --world-size 1: ranks of the emulated ring")
    ap.add_argument("--no-one-gpu", action="store_true", help="skip the one-GPU baseline")
    ap.add_argument("--no-backward", action="store_true", help="skip the causal zig-zag backward")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, torch local step, tiny shapes")
    ap.add_argument("--step", default="triton", choices=("triton", "gluon"),
                    help="the local step on GPUs: the FA2 Triton kernels, or the Hopper wing's Gluon kernels (sm_90)")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    if a.smoke:
        world = a.world_size or 2
        opts = dict(backend="gloo", dtype="float32", step="torch", shape={"B": 1, "hq": 4, "hkv": 2, "d": 16},
                    seqs=[48], reps=1, check_n=40, one_gpu=True, emulate=a.emulate,
                    backward=not a.no_backward)
        tag = "smoke"
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device: run with --smoke on CPU")
        world = a.world_size or torch.cuda.device_count()
        if world > torch.cuda.device_count():
            ap.error(f"--world-size {world} needs {world} GPUs, {torch.cuda.device_count()} visible")
        opts = dict(backend="nccl", dtype="bfloat16", step=a.step, shape=SHAPE,
                    seqs=[int(x) for x in a.seqs.split(",")], reps=a.reps, check_n=4096,
                    one_gpu=not a.no_one_gpu, emulate=a.emulate, backward=not a.no_backward)
        tag = gpu_tag()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"{tag}-ring{'' if opts['step'] in ('triton', 'torch') else '-' + opts['step']}-w{world}")
    opts["partial"] = base + ".json"
    opts["meta"] = {"world": world, "step": opts["step"], "shape": opts["shape"], "dtype": opts["dtype"]}
    results = run_ranks(bench_rank, world, (opts,), timeout=3600, backend=opts["backend"])
    rows, checks = results[0]["rows"], results[0]["checks"]
    meta = {"world": world, "device": torch.cuda.get_device_name() if opts["backend"] == "nccl" else "cpu",
            "torch": torch.__version__, "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "shape": opts["shape"], "dtype": opts["dtype"], "step": opts["step"], "reps": opts["reps"],
            "seconds": round(time.time() - t0, 1),
            "note": ("one GPU: ring of 1 (no sends) + emulated ring; not multi-GPU numbers" if world == 1 else "")}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        pass
    print(f"checks (ring vs one device, rel err): {[round(c['rel_err'], 5) for c in checks]}")
    print_table(rows)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "checks": checks, "rows": rows}, f, indent=1)
    plot(rows, base + ".png", f"ring attention, {world} x {meta['device']}")
    print(f"wrote {base}.json and .png")


if __name__ == "__main__":
    main()
