"""Ring, Ulysses, all-gather and the Ulysses x ring hybrid side by side: one attention layer over a sequence
sharded across ``W`` GPUs (NCCL), forward and backward, with the communication split into what compute hid and
what it exposed, and the bytes each rank sent held against ``reference.distributed.comm_model``.

Shapes: B = 1, Hq = 32, Hkv = 8 (GQA as in Llama-class models), d = 128, bf16, causal, total lengths
``--seqs`` (32k-256k). Local step: the course's Triton kernels (``--step triton``) or the Hopper Gluon kernels
(``--step gluon``). Per scheme and length:

* ``ms``: the slowest rank's time, barrier to barrier, median of ``--reps``;
* ``exposed_ms``: communication no compute hid: Ulysses / all-gather / the hybrid's all-to-alls (they sit
  between steps), the ring's time blocked on receives;
* ``bytes_sent``: measured per rank (all-to-alls counted by ``collectives.ByteMeter``; the ring's chunks from
  their shapes) next to ``bytes_model`` (``comm_model.comm_bytes``);
* ``efficiency``: one GPU's time for the whole sequence / (W x ms), when it fits on one GPU.

Correctness first: every scheme's gathered output is compared with the one-device forward on a short sequence.

    NCCL_NVLS_ENABLE=0 python3 -m benchmarks.course.bench_sequence_parallel --world-size 4
    python3 -m benchmarks.course.bench_sequence_parallel --smoke        # CPU, gloo, tiny: tests the script

Writes ``<gpu>-seqpar-w<W>.json`` and ``.png`` into ``--out`` (``smoke-seqpar-*`` for ``--smoke``).
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
from reference.distributed.collectives import ByteMeter  # noqa: E402
from reference.distributed.comm_model import attention_flops, comm_bytes  # noqa: E402
from reference.distributed.launch import run_ranks  # noqa: E402
from reference.distributed.ring_attention import ring_attention_backward, ring_attention_forward  # noqa: E402
from reference.distributed.ulysses import (allgather_attention_backward, allgather_attention_forward,  # noqa: E402
                                           head_split, hybrid_attention, hybrid_attention_forward,
                                           hybrid_groups)

SHAPE = {"B": 1, "hq": 32, "hkv": 8, "d": 128}


def timed(fn, reps: int) -> float:
    """Median milliseconds of ``fn()`` between two barriers (the slowest rank's time)."""
    fn()
    out = []
    for _ in range(reps):
        _sync()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync()
        dist.barrier()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def schemes(world: int) -> list[tuple[str, int]]:
    """(name, Ulysses size): the ring, Ulysses over every rank (where the heads split), all-gather, and the
    hybrids with Ulysses groups of 2 .. W/2."""
    out = [("ring", 1), ("allgather", 0)]
    try:
        head_split(SHAPE["hq"], SHAPE["hkv"], world)
        out.append(("ulysses", world))
    except ValueError:
        pass
    a = 2
    while a < world:
        out.append((f"hybrid_u{a}", a))
        a *= 2
    return out


class Scheme:
    """One scheme's sharding, forward and backward on this rank (the ring, all-gather, or the hybrid family)."""

    def __init__(self, name, uly, rank, world, step):
        self.name, self.uly, self.rank, self.world, self.step = name, uly, rank, world, step
        self.groups = hybrid_groups(uly) if uly >= 2 else None
        self._graph = None

    def shard(self, x):
        if self.groups is not None:
            return L.hybrid_shard(x, self.groups.index, self.uly, self.world // self.uly, "zigzag").contiguous()
        return L.shard(x, self.rank, self.world, "zigzag").contiguous()

    def unshard(self, parts):
        if self.groups is not None:
            return L.hybrid_unshard(parts, self.uly, self.world // self.uly, "zigzag")
        return L.unshard(parts, "zigzag")

    def forward(self, q, k, v, n, stats):
        if self.name == "ring":
            return ring_attention_forward(q, k, v, True, None, "zigzag", self.step, seq_lens=(n, n), stats=stats)
        if self.name == "allgather":
            return allgather_attention_forward(q, k, v, True, None, "zigzag", self.step, seq_lens=(n, n),
                                               stats=stats)
        return hybrid_attention_forward(q, k, v, self.groups, True, None, "zigzag", self.step, (n, n), stats)

    def backward(self, q, k, v, o, lse, do, n, stats):
        """The ring and all-gather: their functional backward (what they send is what a training step sends).
        The hybrid: through autograd, whose forward kept the head-sharded tensors, so only ``dO`` goes in and
        ``dQ, dK, dV`` come out (``stats`` then stays empty: the exposed time is the all-to-alls' of a separate
        metered run)."""
        if self.name == "ring":
            return ring_attention_backward(q, k, v, o, lse, do, True, None, "zigzag", self.step, None, (n, n),
                                           stats)
        if self.name == "allgather":
            return allgather_attention_backward(q, k, v, o, lse, do, True, None, "zigzag", self.step,
                                                seq_lens=(n, n), stats=stats)
        if self._graph is None or self._graph[0] is not q:
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            self._stats = {}
            self._graph = (q, leaves, hybrid_attention(*leaves, self.groups, causal=True, layout="zigzag",
                                                       step=self.step, seq_lens=(n, n), stats=self._stats))
        _, leaves, out = self._graph
        self._stats.clear()
        self._stats.update(a2a_s=0.0, attn_s=0.0)
        grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
        if stats is not None:
            for key, val in self._stats.items():
                stats[key] = stats.get(key, 0.0) + val
        return grads

    def exposed_ms(self, stats) -> float:
        if self.name == "ring":
            return 1e3 * sum(stats.get("wait_s", []))
        return 1e3 * stats.get("a2a_s", 0.0)

    def model_bytes(self, n, act, grad, backward) -> float:
        if self.name in ("ring", "allgather"):
            return comm_bytes(self.name, n, self.world, SHAPE["hq"], SHAPE["hkv"], SHAPE["d"], backward, act, grad)
        a, b = self.uly, self.world // self.uly   # Ulysses inside a group of a on the group's n/b positions,
        inner = comm_bytes("ulysses", n // b, a, SHAPE["hq"], SHAPE["hkv"], SHAPE["d"], backward, act, grad)
        if b == 1:
            return inner
        hkv_r = max(SHAPE["hkv"] // a, 1)          # then the ring across b groups on the group's heads
        return inner + comm_bytes("ring", n, b, SHAPE["hq"] // a, hkv_r, SHAPE["d"], backward, act, grad)


def full_inputs(n, device, dtype, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    mk = lambda h: torch.randn(SHAPE["B"], h, n, SHAPE["d"], generator=g, device=device, dtype=dtype)  # noqa: E731
    return mk(SHAPE["hq"]), mk(SHAPE["hkv"]), mk(SHAPE["hkv"])


def one_device(step):
    from reference.distributed.local_step import get_step
    st = get_step(step)
    return lambda q, k, v: st.forward(q, k, v, True, q.shape[-1] ** -0.5)


def bench_rank(rank: int, world: int, opts: dict) -> dict:
    device = torch.device("cuda", rank) if opts["backend"] == "nccl" else torch.device("cpu")
    dtype = getattr(torch, opts["dtype"])
    act = torch.empty((), dtype=dtype).element_size()
    all_schemes = [Scheme(name, uly, rank, world, opts["step"]) for name, uly in schemes(world)]
    checks, rows = [], []
    n = opts["check_n"]
    q, k, v = full_inputs(n, device, dtype, 1)
    ref = one_device(opts["step"])(q, k, v)[0] if rank == 0 else None
    for sc in all_schemes:
        o, _ = sc.forward(*(sc.shard(x) for x in (q, k, v)), n, None)
        parts = [None] * world
        dist.all_gather_object(parts, o.cpu())
        if rank == 0:
            got = sc.unshard(parts).to(device).float()
            err = float((got - ref.float()).norm() / ref.float().norm())
            checks.append({"scheme": sc.name, "n": n, "rel_err": err})
            if err > 2e-2:
                raise AssertionError(f"{sc.name}: output differs from the one-device forward, rel err {err:.3g}")
    for n in opts["seqs"]:
        q, k, v = full_inputs(n, device, dtype, 2)
        one_ms = None
        if rank == 0 and opts["one_gpu"]:
            try:
                f1 = one_device(opts["step"])
                f1(q, k, v)
                _sync()
                ts = []
                for _ in range(opts["reps"]):
                    t0 = time.perf_counter()
                    f1(q, k, v)
                    _sync()
                    ts.append((time.perf_counter() - t0) * 1e3)
                one_ms = statistics.median(ts)
            except torch.OutOfMemoryError:
                one_ms = None
        for sc in all_schemes:
            ql, kl, vl = (sc.shard(x) for x in (q, k, v))
            o, lse = sc.forward(ql, kl, vl, n, None)
            do = torch.randn_like(o)
            for backward in (False, True):
                stats = {}
                fn = ((lambda: sc.backward(ql, kl, vl, o, lse, do, n, stats)) if backward  # noqa: E731
                      else (lambda: sc.forward(ql, kl, vl, n, stats)))
                ms = timed(fn, opts["reps"])
                calls = opts["reps"] + 1               # the all-to-all times add up over the timed calls
                stats = {key: (val / calls if key == "a2a_s" else val) for key, val in stats.items()}
                with ByteMeter() as meter:
                    fn()
                sent = meter.sent
                if sc.name == "ring":   # the ring's own sends: K/V chunks, and in the backward the dK/dV
                    sent = comm_bytes("ring", n, world, SHAPE["hq"], SHAPE["hkv"], SHAPE["d"], backward, act, 4)
                elif sc.groups is not None and sc.world // sc.uly > 1:
                    b, a = sc.world // sc.uly, sc.uly
                    sent += comm_bytes("ring", n, b, SHAPE["hq"] // a, max(SHAPE["hkv"] // a, 1), SHAPE["d"],
                                       backward, act, 4)
                gathered = [None] * world
                dist.all_gather_object(gathered, {"exposed_ms": sc.exposed_ms(stats), "sent": sent})
                flops = attention_flops(n, 1, SHAPE["hq"], SHAPE["d"], True, backward) * SHAPE["B"]
                row = {"scheme": sc.name, "ulysses": sc.uly, "world": world, "n": n,
                       "pass": "backward" if backward else "forward", "ms": ms,
                       "exposed_ms": max(g["exposed_ms"] for g in gathered),
                       "bytes_sent": max(g["sent"] for g in gathered),
                       "bytes_model": sc.model_bytes(n, act, 4, backward) * SHAPE["B"],
                       "tflops_per_gpu": flops / world / ms / 1e9}
                if one_ms is not None and not backward:
                    row["one_gpu_ms"] = one_ms
                    row["efficiency"] = one_ms / (world * ms)
                rows.append(row)
            del ql, kl, vl, o, lse, do
        del q, k, v
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows, "checks": checks}


def print_table(rows):
    print(f"{'N':>7} {'scheme':>11} {'pass':>8} {'ms':>9} {'exposed':>8} {'TFLOP/s':>8} {'MB sent':>9} "
          f"{'MB model':>9} {'eff':>5}")
    for r in rows:
        print(f"{r['n']:>7} {r['scheme']:>11} {r['pass']:>8} {r['ms']:>9.2f} {r['exposed_ms']:>8.2f} "
              f"{r['tflops_per_gpu']:>8.1f} {r['bytes_sent'] / 1e6:>9.2f} {r['bytes_model'] / 1e6:>9.2f} "
              f"{r.get('efficiency', float('nan')):>5.2f}")


def plot(rows, path, title):
    from matplotlib.figure import Figure   # no pyplot: the figure draws on its own Agg canvas
    fig = Figure(figsize=(11, 3.8))
    axes = fig.subplots(1, 2)
    for ax, pas in zip(axes, ("forward", "backward")):
        for name in sorted({r["scheme"] for r in rows}):
            rs = [r for r in rows if r["scheme"] == name and r["pass"] == pas]
            ax.plot([r["n"] for r in rs], [r["ms"] for r in rs], "o-", label=name)
            ax.plot([r["n"] for r in rs], [r["exposed_ms"] for r in rs], "x:", color=ax.lines[-1].get_color())
        ax.set(xscale="log", yscale="log", xlabel="total sequence length", ylabel=f"{pas} ms (x: exposed comm)",
               title=f"{title}: {pas}")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100, bbox_inches="tight")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="32768,65536,131072,262144", help="total lengths, comma separated")
    ap.add_argument("--world-size", type=int, default=None, help="ranks = GPUs (default: every visible GPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--step", default="triton", choices=("triton", "gluon"))
    ap.add_argument("--no-one-gpu", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, torch local step, tiny shapes")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    global SHAPE
    if a.smoke:
        world = a.world_size or 4
        SHAPE = {"B": 1, "hq": 8, "hkv": 2, "d": 16}
        opts = dict(backend="gloo", dtype="float32", step="torch", seqs=[64], reps=1, check_n=40, one_gpu=True)
        tag = "smoke"
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device: run with --smoke on CPU")
        world = a.world_size or torch.cuda.device_count()
        if world < 2 or world > torch.cuda.device_count():
            ap.error(f"--world-size must be 2..{torch.cuda.device_count()} (the visible GPUs), got {world}")
        opts = dict(backend="nccl", dtype="bfloat16", step=a.step, seqs=[int(x) for x in a.seqs.split(",")],
                    reps=a.reps, check_n=4096, one_gpu=not a.no_one_gpu)
        tag = gpu_tag()
    opts["shape"] = SHAPE
    t0 = time.time()
    results = run_ranks(_rank_entry, world, (opts,), timeout=3600, backend=opts["backend"])
    rows, checks = results[0]["rows"], results[0]["checks"]
    meta = {"world": world, "device": torch.cuda.get_device_name() if opts["backend"] == "nccl" else "cpu",
            "torch": torch.__version__, "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"), "shape": SHAPE,
            "dtype": opts["dtype"], "step": opts["step"], "reps": opts["reps"], "seconds": round(time.time() - t0, 1)}
    print(f"checks (vs one device, rel err): {[(c['scheme'], round(c['rel_err'], 5)) for c in checks]}")
    print_table(rows)
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"{tag}-seqpar-w{world}")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "checks": checks, "rows": rows}, f, indent=1)
    plot(rows, base + ".png", f"{world} x {meta['device']}")
    print(f"wrote {base}.json and .png")


def _rank_entry(rank, world, opts):
    global SHAPE
    SHAPE = opts["shape"]     # ranks start fresh: the shape travels with the options
    return bench_rank(rank, world, opts)


if __name__ == "__main__":
    main()
