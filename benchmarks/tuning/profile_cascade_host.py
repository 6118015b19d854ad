"""Where does an eager ``cascade_decode`` call spend its host time? A probe of the eager bar (GPU only).

The eager bar asks the cascade called eagerly at B = 8 to run within 1.2x of its CUDA-graph time. At B = 8 the
default path is the one-launch Triton ``_cascade_kernel`` (75 us of GPU time, ``h100-mixed-batch.json``), and its
eager call repeats a recorded launch (``reference.triton._fastlaunch``): the call is host-bound when its host time
nears the GPU time (one full run: 96-105 us of host time a call, eager loop / graph 1.16-1.22; another host:
52 us, 0.95). This probe, on the inputs ``bench_mixed_batch`` builds (32k shared prefix, 1k suffixes, 16-token
pages, bf16, Hq = 32, Hkv = 8, d = 128):

* checks the eager call against ``paged_decode`` of the whole sequences (rel. err < 2e-2), the recorded launch
  against the full path bit for bit (out and lse), and the uncut recorded path (``uncut_call``, a copy of the code
  before the host-path cut kept here) against both;
* times the host time of one eager call (calls issued while the GPU sleeps, ``_common.host_us``
  does, but 200 calls a sample and 7 samples, interleaved between the paths: median and spread), the back-to-back
  eager loop and the graph time, for the uncut path and the current one, at B = 8, 16, 32, and
  ``flash_decode``'s recorded launch (B = 1, 256 keys, one split) as the reference point;
* at B = 8 splits the call into its steps, each timed alone (key building, cache lookup, the two allocations,
  the stream and capture queries, Triton's launch metadata and hook chains, the launcher with tensors / with
  addresses / its C entry point directly), and runs ``cProfile`` over 300 calls of each path (top functions by
  own time).

    python3 -m benchmarks.tuning.profile_cascade_host --out DIR    # DIR/<gpu>-cascade-host-probe.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import torch

from benchmarks import _serving_cases as cases
from benchmarks._common import rel_err
from benchmarks import _common
from benchmarks._common import profile_top
from reference.triton import cascade_decode, flash_decode, paged_decode
from reference.triton import cascade, configs

P, S, BS = 32768, 1024, 16
TRITON = dataclasses.replace(configs.CASCADE_DEFAULT, prefix_gluon=False)


# ------------------------------------------------------------------------------------------ the uncut path
def _uncut_key(tensors, *options):
    """The uncut key: ``tensor_key`` per tensor (``t.device`` objects), ``torch.cuda.current_stream``, hash."""
    parts = []
    for t in tensors:
        if type(t) is not torch.Tensor or t.device.type != "cuda":
            return None
        parts.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
    key = ("cascade", *parts, *options, torch.cuda.current_stream(tensors[0].device).cuda_stream,
           torch.cuda.is_current_stream_capturing())
    hash(key)
    return key


def _uncut_launch(rec, tensors: dict) -> None:
    """The uncut ``RecordedLaunch.__call__``: tensors to the launcher, metadata and hook chains every call."""
    from triton import knobs
    args = list(rec.args)
    for name, i in rec.slots.items():
        args[i] = tensors[name]
    stream = torch.cuda.current_stream().cuda_stream
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    meta = rec.kernel.launch_metadata(rec.grid, stream, *args) if enter is not None else None
    g = rec.grid
    rec.run(g[0], g[1], g[2], stream, rec.kernel.function, rec.kernel.packed_metadata, meta, enter, leave, *args)


def uncut_call(cache: dict, q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens):
    """The uncut recorded path of ``cascade_decode(..., validate=False)`` (Triton kernel, pointer prefix)."""
    key = _uncut_key((q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens), None, None, None)
    rec = cache.get(key)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    dk = rec.args[rec.slots["DescK"]]
    assert isinstance(dk, torch.Tensor)
    _uncut_launch(rec, {"Q": q, "PK": prefix_k, "PV": prefix_v, "KC": k_cache, "VC": v_cache, "BT": block_tables,
                         "SeqLens": seq_lens, "OUT": out, "LOUT": lse, "DescK": prefix_k, "DescV": prefix_v})
    return out, lse


# ------------------------------------------------------------------------------------------------------- timers
def host_us(fn, n: int = 200) -> float:
    """Host us per call (``_common.host_us``, no warm-up call: the callers warm up themselves)."""
    return _common.host_us(fn, n, warm=False)


def cpu_us(fn, n: int = 2000) -> float:
    """us per call of a step that launches nothing (median of 5 loops)."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def spread(samples) -> dict:
    return dict(median=statistics.median(samples), min=min(samples), max=max(samples),
                samples=[round(x, 2) for x in samples])


# ------------------------------------------------------------------------------------------------------ the probe
def case(B: int):
    c = cases.shared_prefix_case(B, P, S, BS)
    args = tuple(c[k] for k in ("q", "prefix_k", "prefix_v", "kc", "vc", "suf_tab", "suf_len"))
    return c, args


def check(B: int, log) -> dict:
    """Correctness on the GPU before any timing: full path vs paged decode, recorded == full, uncut == full."""
    c, args = case(B)
    cascade.clear_launch_cache()
    o_full, l_full = cascade_decode(*args, fast_launch=False)
    o_pd = paged_decode(c["q"], c["kc"], c["vc"], c["full_tab"], c["full_len"])
    cascade_decode(*args)  # records
    c2, args2 = case(B)  # fresh inputs of the same shapes: the recorded launch must compute on THEM
    o2_full, l2_full = cascade_decode(*args2, fast_launch=False)
    o2_rec, l2_rec = cascade_decode(*args2, validate=False)
    found = cascade.recorded_launch(args2, None, None, None)
    assert found is not None and found[3] is not None and type(found[3]) is not cascade.GluonLaunches, found
    uncut = {_uncut_key(args2, None, None, None): found[3]}
    o2_unc, l2_unc = uncut_call(uncut, *args2)
    torch.cuda.synchronize()
    res = dict(batch=B, rel_err_vs_paged=rel_err(o_full, o_pd),
               recorded_equal_full=bool(torch.equal(o2_rec, o2_full) and torch.equal(l2_rec, l2_full)),
               uncut_equal_full=bool(torch.equal(o2_unc, o2_full) and torch.equal(l2_unc, l2_full)),
               rel_err_new_inputs_vs_paged=rel_err(o2_rec, paged_decode(c2["q"], c2["kc"], c2["vc"], c2["full_tab"],
                                                                          c2["full_len"])))
    log(f"B={B}: rel err vs paged {res['rel_err_vs_paged']:.1e} / {res['rel_err_new_inputs_vs_paged']:.1e}, "
        f"recorded == full {res['recorded_equal_full']}, uncut == full {res['uncut_equal_full']}")
    assert res["rel_err_vs_paged"] < 2e-2 and res["rel_err_new_inputs_vs_paged"] < 2e-2, res
    assert res["recorded_equal_full"] and res["uncut_equal_full"], res
    del c
    return res, c2, args2, uncut


def paths(args, uncut) -> dict:
    return {"uncut": lambda: uncut_call(uncut, *args),
            "current": lambda: cascade_decode(*args, validate=False)}


def time_paths(fns: dict, reps: int = 7) -> dict:
    samples = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(reps):  # interleaved: drift of the host's clock hits every path alike
        for k, f in fns.items():
            samples[k].append(host_us(f))
    loops = {k: [_common.loop_ms(f, 200, warmup=20) * 1e3 for _ in range(3)] for k, f in fns.items()}
    return dict(host_us=({k: spread(v) for k, v in samples.items()}), loop_us={k: spread(v) for k, v in loops.items()})


def breakdown(args, uncut) -> dict:
    """The B = 8 call's steps, each timed alone."""
    from triton import knobs
    from reference.triton import _fastlaunch
    q = args[0]
    found = cascade.recorded_launch(args, None, None, None)
    key, stream, ptrs, rec = found
    lse_proto = rec.args[rec.slots["LOUT"]]
    lkey = next(iter(uncut))
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)
    values = (*args, out, lse, args[1], args[2])
    tensors = dict(zip(rec.slots, values))
    full = list(rec.args)
    for i, x in zip(rec.slot_index, values):
        full[i] = x
    ints = list(rec.ptr_args)
    for i, x in zip(rec.slot_index, values):
        ints[i] = x.data_ptr()
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    g, k = rec.grid, rec.kernel
    n_ptr = sum(type(a) is torch.Tensor for a in rec.args)
    steps = {
        "key_uncut (7 tensor keys, current_stream, capture, hash)": lambda: _uncut_key(args, None, None, None),
        "key_current (cascade.launch_key)": lambda: cascade.launch_key(args, None, None, None),
        "cache get (uncut key)": lambda: uncut.get(lkey),
        "cache get (current key, hash included)": lambda: cascade.LAUNCH_CACHE.get(key),
        "one tensor_key (t.device object)": lambda: _fastlaunch.tensor_key(q),
        "one key part (get_device)": lambda: (q.shape, q.stride(), q.dtype, q.get_device(), q.data_ptr() % 16 == 0),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "torch.empty(q.shape[:2], dtype, device)": lambda: torch.empty(q.shape[:2], dtype=torch.float32,
                                                                       device=q.device),
        "q.new_empty(q.shape[:2], dtype)": lambda: q.new_empty(q.shape[:2], dtype=torch.float32),
        "torch.empty_like(recorded lse)": lambda: torch.empty_like(lse_proto),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "_fastlaunch.stream_handle(0)": lambda: _fastlaunch.stream_handle(0),
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "kernel.launch_metadata + 2 hook chains": lambda: (enter(m := k.launch_metadata(g, stream, *full)), leave(m)),
        f"data_ptr() x {n_ptr}": lambda: [a.data_ptr() for a in full[:n_ptr]],
        "arg list copy + slot substitution": lambda: [ints.__setitem__(i, x) for i, x in
                                                      zip(rec.slot_index, values)] and list(rec.ptr_args),
    }
    res = {name: cpu_us(f) for name, f in steps.items()}
    meta = k.launch_metadata(g, stream, *full)
    launches = {
        "launch: uncut RecordedLaunch.__call__ (dict, metadata, hooks)": lambda: _uncut_launch(rec, tensors),
        "launch: run() tensors + metadata + hooks": lambda: rec.run(g[0], g[1], g[2], stream, k.function,
                                                                    k.packed_metadata, meta, enter, leave, *full),
        "launch: run() tensors, no hooks": lambda: rec.run(g[0], g[1], g[2], stream, k.function, k.packed_metadata,
                                                           None, None, None, *full),
        "launch: run() addresses, no hooks": lambda: rec.run(g[0], g[1], g[2], stream, k.function, k.packed_metadata,
                                                             None, None, None, *ints),
        "launch: RecordedLaunch.launch, tensors": lambda: rec.launch(values, stream),
        "launch: RecordedLaunch.launch, addresses (current)": lambda: rec.launch(
            values, stream, addresses=(*ptrs, out.data_ptr(), lse.data_ptr(), ptrs[1], ptrs[2])),
    }
    if rec.direct is not None:
        h = rec.head
        launches["launch: C entry point, addresses"] = lambda: rec.direct(h[0], h[1], h[2], stream, *h[4:], *ints)
    samples = {name: [] for name in launches}
    for _ in range(5):
        for name, f in launches.items():
            samples[name].append(host_us(f))
    res.update({name: statistics.median(v) for name, v in samples.items()})
    return res


def _uncut_flash(rec, q, k, v):
    """The uncut recorded path of ``flash_decode(q, k, v, num_splits=1, validate=False)`` (pointer loads)."""
    from reference.triton import configs
    parts = ["contiguous"]
    for t in (q, k, v):
        if type(t) is not torch.Tensor or t.device.type != "cuda":
            return None
        parts.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
    key = (*parts, None, 1, None, None, configs.scoped_decode(), torch.cuda.current_stream(q.device).cuda_stream)
    hash(key)
    out = torch.empty_like(q)
    _uncut_launch(rec, {"Q": q, "K": k, "V": v, "SeqLens": q, "BlockTables": q, "Out": out, "DescK": k, "DescV": v})
    return out


def flash_reference() -> dict:
    """flash_decode's recorded launch, B = 1, 256 keys, one split (bench_decode's host-overhead case): the current
    path and (where the launch was recorded with pointer loads) the uncut one, interleaved."""
    from reference.triton import decode_serving
    q = torch.randn(1, cases.HQ, cases.D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, cases.HKV, 256, cases.D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    decode_serving.clear_launch_cache()
    flash_decode(q, k, v, num_splits=1)  # records
    q2, k2, v2 = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
    o = flash_decode(q2, k2, v2, num_splits=1)
    ref = flash_decode(q2, k2, v2, num_splits=1, fast_launch=False)
    assert torch.equal(o, ref)
    rec = decode_serving.recorded_launch("contiguous", (q2, k2, v2, None), 1, None, None)
    fns = {"current": lambda: flash_decode(q2, k2, v2, num_splits=1, validate=False)}
    if rec is not None and type(rec.args[rec.slots["DescK"]]) is torch.Tensor:
        assert torch.equal(_uncut_flash(rec, q2, k2, v2), ref)
        fns["uncut"] = lambda: _uncut_flash(rec, q2, k2, v2)
    samples = {name: [] for name in fns}
    for f in fns.values():
        f()
    for _ in range(5):
        for name, f in fns.items():
            samples[name].append(host_us(f))
    return dict(host_us={name: spread(v) for name, v in samples.items()}, profile_top=profile_top(fns["current"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(_common.RESULTS))
    ap.add_argument("--batches", default="8,16,32")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_cascade_host needs a CUDA GPU (recorded launches exist on a GPU only)")
    torch.manual_seed(0)
    t0 = time.time()
    log = lambda msg: print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)  # noqa: E731
    out = dict(meta=_common.run_meta(), rows=[])
    path = os.path.join(args.out, f"{_common.result_tag()}-cascade-host-probe.json")
    for B in (int(b) for b in args.batches.split(",")):
        row, c, xs, uncut = check(B, log)
        fns = paths(xs, uncut)
        # GPU time of the same Triton kernel (captured calls of the default config take the Gluon path from B = 16)
        row["graph_us"] = _common.graph_ms([lambda: cascade_decode(*xs, validate=False, config=TRITON)]) * 1e3
        row.update(time_paths(fns))
        row["eager_loop_over_graph"] = {k: v["median"] / row["graph_us"] for k, v in row["loop_us"].items()}
        log(f"B={B}: graph {row['graph_us']:.1f} us; host us a call (median [min, max] of 7): " + ", ".join(
            f"{k} {v['median']:.1f} [{v['min']:.1f}, {v['max']:.1f}]" for k, v in row["host_us"].items())
            + "; loop / graph: " + ", ".join(f"{k} {v:.2f}" for k, v in row["eager_loop_over_graph"].items()))
        if B == 8:
            row["breakdown_us"] = breakdown(xs, uncut)
            for name, us in row["breakdown_us"].items():
                log(f"    {name:66s} {us:7.2f} us")
            row["profile_top"] = {k: profile_top(f) for k, f in fns.items()}
            for k, rows in row["profile_top"].items():
                log(f"  cProfile {k} (own us a call): " + "; ".join(
                    f"{r['fn']} {r['own_us_per_call']}" for r in rows[:10]))
        out["rows"].append(row)
        del c, xs, fns, uncut
        cases.empty_cache()
    out["flash_decode_reference"] = flash_reference()
    log("flash_decode recorded launch (B=1, 1 split), host us a call: " + ", ".join(
        f"{k} {v['median']:.1f} [{v['min']:.1f}, {v['max']:.1f}]"
        for k, v in out["flash_decode_reference"]["host_us"].items()))
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
