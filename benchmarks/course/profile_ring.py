"""Where a ring rank's forward time goes, on ONE GPU (no NCCL): kernel calls, merges, launch gaps.

notes/ring_attention.md, "One kernel call per step, a fused merge". A rank of a ``--world``-rank causal zig-zag ring runs its
steps one after another on the one GPU (its query shard against each K/V chunk), in two versions:

* ``pairs``: the earlier decomposition: ``block_calls`` per (query segment, key segment) pair (three kernel
  calls on the diagonal step of W = 2, two on the other), each merged into fp32 accumulators by ``merge_into``
  (five torch passes), and the fp32 -> bf16 cast at the end;
* ``calls``: ``step_calls`` (one call per zig-zag step: a row sees a prefix of the sorted local keys), the
  ``RunningState`` that adopts the step-0 output, and the fused Triton merge (``merge_triton``) on a bf16 state.

Per step: CUDA events around every kernel call and every merge (``kernel_ms``, ``merge_ms``), the step's event
time (``step_ms``: kernels + merges + gaps between them), and the host time to issue it; the same work as ONE
call of the one-GPU kernel is ``ideal_ms = one_gpu_ms * pairs_of_this_step / all_causal_pairs``. A
``torch.profiler`` trace of one rank's forward gives the kernel list and the idle time between kernels.

Before timing: the Gluon step in a simulated ring (zig-zag W = 2, 4 and contiguous W = 3, ragged) against a
float64 torch oracle, and the output error of a bf16 vs fp32 running state for W = 2, 4, 8 (``state_err``).

B = 1, Hq = 32, Hkv = 8, d = 128, bf16, causal.

    python3 -m benchmarks.course.profile_ring --seqs 65536,32768,131072   # Hopper GPU

Writes ``<gpu>-profile-ring.json`` into ``--out`` (default ``$OUT`` or the current directory), after every length.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks._common import gpu_tag
from reference.distributed import layout as L
from reference.distributed.local_step import _pairs, get_step, step_calls
from reference.distributed.merge import RunningState, merge_into, merge_rows_
from reference.distributed.ring_attention import simulate_ring_attention

def oracle(q, k, v, causal=True):
    """float64 dense attention (bottom-right causal): ``(o, lse)``."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ vd, lse


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def check(step, dev):
    out = []
    g = torch.Generator(device=dev).manual_seed(int.from_bytes(os.urandom(4), "little"))
    for world, n, lay in ((2, 3001, "zigzag"), (4, 2999, "zigzag"), (3, 1777, "contiguous")):
        q = torch.randn(1, 8, n, 128, generator=g, device=dev).to(torch.bfloat16)
        k, v = (torch.randn(1, 2, n, 128, generator=g, device=dev).to(torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        o, lse, grads = simulate_ring_attention(q, k, v, world, causal=True, layout=lay, step=step, do=do)
        o_ref, lse_ref = oracle(q, k, v)
        qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
        o64, _ = oracle(qd, kd, vd)
        o64.backward(do.double())
        errs = {"o": rel(o, o_ref), "lse": float((lse.double() - lse_ref).abs().max()),
                "dq": rel(grads[0], qd.grad), "dk": rel(grads[1], kd.grad), "dv": rel(grads[2], vd.grad)}
        out.append({"world": world, "n": n, "layout": lay, **errs})
        if not (errs["o"] < 2e-2 and errs["lse"] < 2e-2 and max(errs["dq"], errs["dk"], errs["dv"]) < 3e-2):
            raise AssertionError(f"Gluon ring step differs from float64: {out[-1]}")
    return out


def state_errors(step, dev, n=8192):
    """Output error vs float64 of a bf16 and an fp32 running state, and of the one-GPU kernel itself."""
    g = torch.Generator(device=dev).manual_seed(7)
    q = torch.randn(1, 8, n, 128, generator=g, device=dev).to(torch.bfloat16)
    k, v = (torch.randn(1, 2, n, 128, generator=g, device=dev).to(torch.bfloat16) for _ in range(2))
    o_ref, _ = oracle(q, k, v)
    res = {"n": n, "one_gpu": rel(step.forward(q, k, v, True, 128 ** -0.5)[0], o_ref)}
    for world in (2, 4, 8):
        for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            o, _ = simulate_ring_attention(q, k, v, world, causal=True, step=step, state_dtype=dt)
            res[f"w{world}_{name}"] = rel(o, o_ref)
    return res


class Events:
    def __init__(self):
        self.ev = []

    def mark(self, tag):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.ev.append((tag, e))

    def spans(self):
        torch.cuda.synchronize()
        return [(t1, a.elapsed_time(b)) for (t0, a), (t1, b) in zip(self.ev, self.ev[1:])]


def rank_forward(path, q, ks, vs, q_segs, k_segs, world, rank, step, scale, ev=None):
    """One rank's forward over ``world`` steps on one GPU; ``ev`` marks each kernel call and merge."""
    mark = ev.mark if ev is not None else (lambda tag: None)
    host = []
    if path == "pairs":
        o_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse_acc = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    else:
        st = RunningState(q.shape, q.dtype, torch.float32, q.device)
    mark("start")
    for s in range(world):
        t0 = time.perf_counter()
        src = (rank - s) % world
        k, v = ks[src], vs[src]
        if path == "pairs":
            for q0, k0, (lo, hi, kh, c) in _pairs(q_segs[rank], k_segs[src], 0, True):
                rows = slice(q0 + lo, q0 + hi)
                o_c, lse_c = step.forward(q[:, :, rows], k[:, :, k0:k0 + kh], v[:, :, k0:k0 + kh], c, scale)
                mark(f"s{s}:kernel")
                merge_into(o_acc[:, :, rows], lse_acc[:, :, rows], o_c, lse_c)
                mark(f"s{s}:merge")
        else:
            for lo, hi, klo, khi, c in step_calls(q_segs[rank], k_segs[src], 0, True):
                o_c, lse_c = step.forward(q[:, :, lo:hi], k[:, :, klo:khi], v[:, :, klo:khi], c, scale)
                mark(f"s{s}:kernel")
                st.absorb(lo, hi, o_c, lse_c)
                mark(f"s{s}:merge")
        host.append((time.perf_counter() - t0) * 1e3)
    if path == "pairs":
        out = o_acc.to(q.dtype)
    else:
        out = st.result()[0].to(q.dtype)
    mark("final:cast")
    return out, host


def step_pairs(q_segs, k_segs):
    return sum(lo_hi_pairs(c) for c in step_calls(q_segs, k_segs, 0, True))


def lo_hi_pairs(call):
    lo, hi, klo, khi, c = call
    rows, keys = hi - lo, khi - klo
    return rows * (keys - rows) + rows * (rows + 1) // 2 if c else rows * keys


def median_ms(fn, reps):
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def profile_rank(path, args):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        rank_forward(path, *args)
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    busy = sum(e.time_range.end - e.time_range.start for e in kernels)
    span = kernels[-1].time_range.end - kernels[0].time_range.start if kernels else 0
    names = {}
    for e in kernels:
        key = e.name[:60]
        c, t = names.get(key, (0, 0.0))
        names[key] = (c + 1, t + (e.time_range.end - e.time_range.start) / 1e3)
    return {"kernels": len(kernels), "busy_ms": busy / 1e3, "span_ms": span / 1e3, "idle_ms": (span - busy) / 1e3,
            "by_name_ms": {k: [c, round(t, 3)] for k, (c, t) in sorted(names.items(), key=lambda x: -x[1][1])}}


def bench(n, world, step, dev, reps, backward):
    g = torch.Generator(device=dev).manual_seed(n)
    mk = lambda h: torch.randn(1, h, n, 128, generator=g, device=dev, dtype=torch.bfloat16)  # noqa: E731
    q, k, v = mk(32), mk(8), mk(8)
    scale = 128 ** -0.5
    one = median_ms(lambda: step.forward(q, k, v, True, scale), reps)
    segs = L.rank_segments(n, world, "zigzag")
    total_pairs = n * (n + 1) // 2
    row = {"n": n, "world": world, "one_gpu_ms": one, "ranks": []}
    for r in range(world):
        qs = L.shard(q, r, world).contiguous()
        ks = [L.shard(k, s, world).contiguous() for s in range(world)]
        vs = [L.shard(v, s, world).contiguous() for s in range(world)]
        args = (qs, ks, vs, segs, segs, world, r, step, scale)
        rr = {"rank": r, "ideal_step_ms": [one * step_pairs(segs[r], segs[(r - s) % world]) / total_pairs
                                           for s in range(world)]}
        for path in ("pairs", "calls"):
            rank_forward(path, *args)            # warm-up (compiles)
            tot = median_ms(lambda: rank_forward(path, *args), reps)
            ev = Events()
            _, host = rank_forward(path, *args, ev=ev)
            spans = ev.spans()
            per = {}
            for s in range(world):
                per[s] = {"kernel_ms": [round(t, 3) for tag, t in spans if tag == f"s{s}:kernel"],
                          "merge_ms": [round(t, 3) for tag, t in spans if tag == f"s{s}:merge"]}
                per[s]["step_ms"] = sum(per[s]["kernel_ms"]) + sum(per[s]["merge_ms"])
                per[s]["host_ms"] = host[s]
            cast = [t for tag, t in spans if tag == "final:cast"]
            rr[path] = {"rank_ms": tot, "steps": per, "final_cast_ms": cast[0] if cast else None,
                        "profile": profile_rank(path, args)}
        row["ranks"].append(rr)
        del qs, ks, vs
    # merge alone at this size: rows of the rank-1 off-diagonal step (all local rows)
    nl = n // world
    o_a = torch.randn(1, 32, nl, 128, device=dev, dtype=torch.bfloat16)
    o_32 = o_a.float()
    l_a = torch.randn(1, 32, nl, device=dev)
    o_b, l_b = torch.randn_like(o_a), torch.randn_like(l_a)
    row["merge_alone_ms"] = {"triton_bf16_state": median_ms(lambda: merge_rows_(o_a, l_a, o_b, l_b), reps),
                             "triton_fp32_state": median_ms(lambda: merge_rows_(o_32, l_a, o_b, l_b), reps),
                             "torch_fp32_state": median_ms(lambda: merge_into(o_32, l_a, o_b, l_b), reps),
                             "bytes_bf16_state": o_a.numel() * 6, "bytes_fp32_state_fused": o_a.numel() * 10,
                             "bytes_torch_fp32": o_a.numel() * 18}
    if backward:
        o1, lse1 = step.forward(q, k, v, True, scale)
        do = torch.randn_like(o1)
        row["bwd_one_gpu_ms"] = median_ms(lambda: step.backward(q, k, v, o1, lse1, do, True, scale), reps)
        shards = []
        for r in range(world):
            shards.append([L.shard(x, r, world).contiguous() for x in (q, k, v, o1, do)]
                          + [L.shard(lse1.unsqueeze(-1), r, world).squeeze(-1).contiguous()])
        for path in ("pairs", "calls"):
            def run(path=path):
                for r in range(world):
                    qs, _, _, os_, dos, ls = shards[r]
                    for s in range(world):
                        src = (r - s) % world
                        kk, vv = shards[src][1], shards[src][2]
                        calls = ([(q0 + lo, q0 + hi, k0, k0 + kh, c)
                                  for q0, k0, (lo, hi, kh, c) in _pairs(segs[r], segs[src], 0, True)]
                                 if path == "pairs" else step_calls(segs[r], segs[src], 0, True))
                        for lo, hi, klo, khi, c in calls:
                            step.backward(qs[:, :, lo:hi], kk[:, :, klo:khi], vv[:, :, klo:khi], os_[:, :, lo:hi],
                                          ls[:, :, lo:hi], dos[:, :, lo:hi], c, scale)
            run()
            row[f"bwd_{path}_all_ranks_ms"] = median_ms(run, max(2, reps // 2))
        del shards
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="32768,65536")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backward-at", default="65536", help="sequence lengths that also time the backward")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--step", default="gluon", help="the local step (gluon on Hopper; torch for a CPU dry run)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    step = get_step(a.step)
    t0 = time.time()
    res = {"meta": {"command": "python3 -m benchmarks.course.profile_ring --seqs " + a.seqs, "world": a.world,
                    "step": a.step, "shape": {"B": 1, "hq": 32, "hkv": 8, "d": 128}, "dtype": "bfloat16",
                    "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"},
           "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "checks": check(step, dev)}
    print("checks", json.dumps(res["checks"]), flush=True)
    res["state_err"] = state_errors(step, dev)
    print("state_err", json.dumps(res["state_err"]), flush=True)
    res["rows"] = []
    bwd = {int(x) for x in a.backward_at.split(",") if x}
    for n in (int(x) for x in a.seqs.split(",")):
        res["rows"].append(bench(n, a.world, step, dev, a.reps, n in bwd))
        with open(os.path.join(a.out, f"{gpu_tag()}-profile-ring.json"), "w") as f:
            json.dump(res, f, indent=1)
        r = res["rows"][-1]
        print(f"\nN={n} one GPU {r['one_gpu_ms']:.2f} ms, ideal per rank {r['one_gpu_ms'] / a.world:.2f}; merge alone "
              + ", ".join(f"{k} {v:.3f}" for k, v in r["merge_alone_ms"].items() if k.endswith("state")), flush=True)
        for rr in r["ranks"]:
            for path in ("pairs", "calls"):
                p = rr[path]
                steps = "; ".join(f"s{s}: k {st['kernel_ms']} m {st['merge_ms']} host {st['host_ms']:.2f}"
                                  for s, st in p["steps"].items())
                pr = p["profile"]
                print(f" rank {rr['rank']} {path:5}: {p['rank_ms']:.2f} ms (ideal steps "
                      f"{[round(x, 2) for x in rr['ideal_step_ms']]}) {steps}; cast {p['final_cast_ms']:.3f}; "
                      f"profile busy {pr['busy_ms']:.2f} idle {pr['idle_ms']:.3f} kernels {pr['kernels']}")
        if "bwd_one_gpu_ms" in r:
            print(f" backward: one GPU {r['bwd_one_gpu_ms']:.2f}, all ranks pairs {r['bwd_pairs_all_ranks_ms']:.2f} "
                  f"calls {r['bwd_calls_all_ranks_ms']:.2f}", flush=True)
        torch.cuda.empty_cache()
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
