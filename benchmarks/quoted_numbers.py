"""Print every performance number ``docs/results.md`` and the notes quote, derived from ``benchmarks/results/*.json``.

    python -m benchmarks.quoted_numbers

Quote what this prints, not a number remembered from an earlier run: each line gives the range over the
configurations in the file and, where the course sets a bar, which configurations miss it.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(name):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def span(values, fmt="{:.2f}"):
    values = list(values)
    return (fmt + "-" + fmt).format(min(values), max(values)) if values else "n/a"


def cpu_lines(r):
    out = []
    for run in r["runs"]:
        rows = run["rows"]
        for tiles in ("64x64", "128x128"):
            key = f"tiled{tiles}_fwd_ratio_median"
            ratios = {row["N"]: row[key] for row in rows if key in row}
            if not ratios:
                continue
            missed = [f"N={n} ({x:.2f}x)" for n, x in ratios.items() if x > 3.0]
            out.append(f"cpu-numpy.json [{run['label']}] tiled {tiles} forward / naive time: {span(ratios.values())}x over "
                       f"N={min(ratios)}..{max(ratios)}; N=4096: {ratios.get(4096, float('nan')):.2f}x; bar <= 3x "
                       + (f"MISSED at {', '.join(missed)}" if missed else "met everywhere"))
        mem = [row["tiled64x64_fwd_peak_bytes"] / row["naive_fwd_peak_bytes"] for row in rows if row["N"] == 4096]
        if mem:
            out.append(f"cpu-numpy.json [{run['label']}] tiled 64x64 forward peak memory / naive at N=4096: {mem[0]:.3f} "
                       f"(bar <= 0.1)")
    return out


def attention_lines(r):
    rows = r["attention"]
    out = []
    for base in ("sdpa_flash", "sdpa_cudnn"):
        for p in ("fwd", "bwd"):
            ratios = [x[base][f"{p}_ms"] / x["ours"][f"{p}_ms"] for x in rows if base in x and "ours" in x]
            out.append(f"{r['gpu']}: Triton FA2 {p} speed / {base}: {span(ratios)}x over {len(ratios)} configurations")
    best = max(x["ours"]["fwd_tflops"] for x in rows)
    out.append(f"{r['gpu']}: best forward {best:.0f} TFLOP/s (matmul ceiling {r['ceilings']['matmul_TFLOPs']:.0f})")
    return out


def decode_lines(r):
    rows = [x for x in r["results"] if "ms_graph" in x]
    by = {(x["batch"], x["context"], x["impl"]): x for x in rows}
    out, gpu = [], r["meta"]["gpu"]
    for base in ("one_split", "fa2_per_qhead", "sdpa_default", "sdpa_flash", "naive_torch"):
        ratios = [(by[(b, n, base)]["ms_graph"] / x["ms_graph"], b, n) for (b, n, i), x in by.items()
                  if i == "split_kv" and (b, n, base) in by]
        if not ratios:
            out.append(f"{gpu}: split-KV vs {base}: not measured in this file (re-run bench_decode.py on a GPU)")
            continue
        b1 = {n: v for v, b, n in ratios if b == 1}
        best = max(ratios)
        out.append(f"{gpu}: split-KV vs {base}: up to {best[0]:.2f}x (B={best[1]}, N={best[2]}); B=1 at "
                   + ", ".join(f"{n // 1024}k {b1[n]:.2f}x" for n in sorted(b1) if n >= 32768))
    for impl in ("split_kv", "sdpa_flash"):
        fr = {x["context"]: x["frac_copy_bw_graph"] for x in rows if x["impl"] == impl and x["batch"] == 1}
        out.append(f"{gpu}: {impl} B=1 KV bytes/time over copy bandwidth at "
                   + ", ".join(f"{n // 1024}k {fr[n]:.2f}" for n in sorted(fr) if n >= 32768))
    for bar in r.get("bars", []):
        if not bar["passed"]:
            out.append(f"{gpu}: bar MISSED: {bar['what']} B={bar['batch']} N={bar['context']}: {bar['value']:.2f} "
                       f"(bar {bar['bar']})")
    paged = [p["vs_contiguous_graph"] for p in r.get("paged", []) if p.get("block_size") == 16]
    out.append(f"{gpu}: paged (block 16) / contiguous speed: {span(paged)}x (bar 0.9)")
    return out


def serving_lines(r):
    """h100-serving.json (benchmarks/course/bench_serving.py): varlen, cascade, eager-call bars, paged prefill."""
    out, gpu = [], r["meta"]["gpu"]
    v = r.get("varlen")
    if v:
        ms = v["ms"]   # one run; the flex section is another run, compared with its own packed time
        fx = r.get("flex", {}).get("ms", {})
        out.append(f"serving ({gpu}): varlen fwd speedup vs " + ", ".join(
            f"{n} {ms[n] / ms['ours_varlen']:.2f}x" for n in ("ours_padded", "sdpa_padded", "sdpa_nested") if n in ms)
                   + (f", flex_block_mask {fx['flex_block_mask'] / fx['ours_varlen']:.2f}x (its own run)"
                      if "flex_block_mask" in fx else "")
                   + f"; fwd+bwd vs padded {v['speedup_vs_padded_fwd_bwd']:.2f}x")
    for c in r.get("cascade", []):
        out.append(f"serving: cascade B={c['batch']} {c['speedup_graph']:.2f}x (bytes ratio {c['bytes_ratio']:.1f})")
    e = r.get("eager")
    if e:
        for name, b in e["bars"].items():
            miss = [k for k, lim, hi in (("graph", b["loop_over_graph"], b["bar_graph"]),) if lim > hi]
            miss += ["sdpa"] if b["loop_vs_sdpa_loop"] < b["bar_sdpa"] else []
            out.append(f"serving: {name} eager/graph {b['loop_over_graph']:.2f} (bar 1.2), speed vs SDPA eager "
                       f"{b['loop_vs_sdpa_loop']:.2f}x (bar 1.0){'; MISSED: ' + ', '.join(miss) if miss else ''}")
    p = r.get("prefill")
    if p:
        out.append(f"serving: paged prefill vs contiguous {p['paged_vs_contiguous']:.2f}x")
    return out


def mixed_batch_quotes(r) -> list[str]:
    """The phrases ``docs/results.md`` and its long form ``notes/results_details.md`` quote from
    ``<gpu>-mixed-batch.json`` (``bench_mixed_batch``): the mixed step, the one-launch cascade (graph, eager,
    fraction of copy, prefix pass alone) and paged prefill by page size, each where the run has its section (a run
    of some sections has no phrases for the others). ``tests/test_quoted_numbers.py`` requires each verbatim."""
    bw = r["meta"]["copy_bw_bytes_per_s"]
    j = lambda xs, fmt="{:.2f}": " / ".join(fmt.format(x) for x in xs)  # noqa: E731
    met = lambda ok: "met" if ok else "missed"  # noqa: E731
    out = []
    if "prefill" in r:
        pages = r["prefill"]["pages"]
        tma = [pages[p]["vs_contiguous"].get("paged_prefill_gluon_tma") for p in ("16", "64")]
        if None not in tma:  # Hopper runs with the Gluon paged kernel
            out.append(f"the Gluon paged kernel in the same run {tma[0]:.2f}x / {tma[1]:.2f}x")
    if "mixed" in r:
        m, g = r["mixed"], r["mixed"]["ms_graph"]
        tbs = m["kv_bytes"] / (g["mixed_one_launch"] * 1e-3)
        out.append(f"{g['mixed_one_launch'] * 1e3:.0f} us: {m['speedup_vs_separate_graph']:.2f}x / "
                   f"{m['speedup_vs_paged_prefill_graph']:.2f}x; K/V ({m['kv_bytes'] / 1e9:.2f} GB) at "
                   f"{tbs / 1e12:.2f} TB/s = {tbs / bw:.2f} of the copy bandwidth")
    if "cascade" in r:
        casc = r["cascade"]
        eager = [c["eager_loop_over_graph"] for c in casc]
        out += [
            j([c["ms_graph"]["cascade"] * 1e3 for c in casc], "{:.0f}") + " us (three launches in the same run: "
            + j([c["ms_graph"]["cascade_separate"] * 1e3 for c in casc], "{:.0f}") + " us)",
            j([c["speedup_graph_vs_paged"] for c in casc], "{:.2f}x"),
            j([c["fraction_of_copy_bw"]["cascade"] for c in casc]) + " (unrounded "
            + j([c["fraction_of_copy_bw"]["cascade"] for c in casc], "{:.4f}") + ")",
            "the prefix pass alone: " + j([c["fraction_of_copy_bw"]["prefix_pass"] for c in casc]),
            f"B = {casc[0]['batch']}: {eager[0]:.2f} ({met(eager[0] <= 1.2)}); B = {casc[0]['batch']}.."
            f"{casc[-1]['batch']}: {min(eager):.2f}-{max(eager):.2f}; {casc[0]['eager_speedup_vs_paged']:.2f}x "
            f"({met(casc[0]['eager_speedup_vs_paged'] >= 1.5)}"]
    if "prefill" in r:
        pg = lambda page, names: " / ".join(f"{pages[page]['vs_contiguous'][n]:.2f}x" for n in names)  # noqa: E731
        out.append(pg("16", ("paged_prefill_page_tiles", "paged_prefill_row_gather", "mixed_block64",
                             "mixed_block64_first_version")) + "; "
                   + pg("64", ("paged_prefill_page_tiles", "paged_prefill_row_gather", "mixed_tma",
                               "mixed_tma_table_in_place")))
    if "mixed" in r:
        out.append(f"table entries looked up in place {r['mixed']['ms_graph']['mixed_one_launch_first_version'] * 1e3:.0f} us")
    return out


def decode_quotes(r) -> list[str]:
    """``docs/results.md``'s split-KV decode fractions of copy bandwidth at B=1, 32k / 64k / 128k (graph), and the
    speed vs SDPA default at 32k, from one ``<gpu>-decode.json``."""
    rows = {(x["impl"], x["context"]): x for x in r["results"] if x["batch"] == 1 and "ms_graph" in x}
    fr = " / ".join(f"{rows[('split_kv', n)]['frac_copy_bw_graph']:.2f}" for n in (32768, 65536, 131072))
    vs = [rows[("sdpa_default", n)]["ms_graph"] / rows[("split_kv", n)]["ms_graph"] for n in (32768, 65536, 131072)]
    return [fr + " (bar 0.85", f"eager {rows[('split_kv', 32768)]['frac_copy_bw']:.2f}); {vs[0]:.2f}x cuDNN at 32k",
            f"at 64k / 128k: {vs[1]:.2f}x / {vs[2]:.2f}x"]


# --- lectures: every number in a lecture's prose is backed by a results file, or listed as not measured -------
#
# ``LECTURES[stem] = (derive, assumed)``: ``derive()`` returns ``{number as the prose writes it: where it comes
# from}``, computed from the committed results JSON; ``assumed`` maps the prose's other numbers (model constants,
# datasheet values, bars, arithmetic of the model) to why they are not measurements. ``prose_numbers`` finds the
# numbers of a lecture's markdown cells that look like results: decimals, and integers with a unit (us, ms, MB,
# GB, TB/s, TFLOP/s, %, x...). Counts written with ``k`` (``32k``) are configurations and are not matched.
# ``tests/test_quoted_numbers.py`` fails on a prose number that is in neither map. ``PHRASES[stem]`` (optional)
# returns phrases rebuilt from the results files that must appear verbatim in the markdown (whitespace
# collapsed): a number in the right place, not only somewhere in the derived set. To cover another lecture,
# add a derive function and an assumed map to ``LECTURES`` (and phrases where a number's context matters).

_UNITS = r"µs|us|ms|MB|GB|TB/s|GB/s|TFLOP/s|TFLOPS|PFLOPS|GFLOP|PFLOP|GiB|KiB|KB|%"
_NUM = re.compile(r"(?<![\w.:])(\d+(?:\.\d+)?)(?![\deE]|\.\d)(?:\s?(" + _UNITS + r")|(x)(?!\w))?")
_ARXIV = re.compile(r"\d{4}\.\d{5}")


def key_loop_quotes(r) -> list[str]:
    """The key-loop section of notes/results_details.md from ``<gpu>-gluon-key-loop.json`` (``bench_key_loop``):
    fence / off of the bf16 Gluon forward (d = 128 at N = 2k / 8k / 16k, non-causal then causal; d = 64 at 8k), the GQA training
    step against cuDNN (off, fence; 8k / 32k), FP8 peeled / pin (8k / 16k, non-causal then causal)."""
    def ratio(row, a, b):
        return row[a]["tflops"] / row[b]["tflops"]

    def joined(rows, a, b):
        return " / ".join(f"{ratio(x, a, b):.2f}" for x in rows)
    bf = r["bf16"]
    d128 = [[x for x in bf if x["d"] == 128 and x["causal"] == c] for c in (False, True)]
    d64 = [x for x in bf if x["d"] == 64]
    tr = r["train"]
    fp = [[x for x in r["fp8"] if x["causal"] == c] for c in (False, True)]
    return [f"d = 128 {joined(d128[0], 'fence', 'off')} non-causal, {joined(d128[1], 'fence', 'off')} causal",
            f"d = 64 {joined(d64, 'fence', 'off')}",
            f"off {joined(tr, 'gluon_off', 'cudnn')}, fence {joined(tr, 'gluon_fence', 'cudnn')}",
            f"peeled / pin {joined(fp[0], 'fp8_peeled', 'fp8_pin')} non-causal, "
            f"{joined(fp[1], 'fp8_peeled', 'fp8_pin')} causal"]


def prose_numbers(src_path) -> list[str]:
    """The result-like numbers of the markdown cells of a lecture source (``lectures/src/NN_*.py``), as written
    (without their unit)."""
    from autograder.percent import parse_percent
    text = Path(src_path).read_text(encoding="utf-8")
    out = []
    for cell in parse_percent(text, str(src_path)):
        if cell.kind != "markdown":
            continue
        body = _ARXIV.sub(" ", cell.source)
        for m in _NUM.finditer(body):
            number, unit, times = m.groups()
            if "." in number or unit or times:
                out.append(number)
    return out


def _f(x, nd=2) -> str:
    return f"{x:.{nd}f}"


def _lecture09() -> dict:
    out = {}
    r = load("h100-serving.json")
    if r is None:
        return out
    v, ms = r["varlen"], r["varlen"]["ms"]
    lens = [float(n) for n in v["lengths"]]
    work = sum(n * n for n in lens) / (len(lens) * max(lens) ** 2)
    cfg = r["meta"]["fwd_config"]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]

    def tiles(n):
        n = int(n)
        return sum(-(-min(n, (i + 1) * bm) // bn) for i in range(-(-n // bm)))
    gain = ms["ours_padded"] / ms["ours_varlen"]
    out[_f(gain)] = "varlen: ours padded / ours packed, same run"
    out[_f(1 / v["useful_fraction"])] = "varlen: padded / real tokens"
    out[_f(1 / work, 1)] = out[_f(1 / work)] = "varlen: causal work ratio B max^2 / sum n^2"
    out[_f(100 * work, 1)] = "varlen: packed work as % of padded"
    out[_f(len(lens) * tiles(max(lens)) / sum(tiles(n) for n in lens))] = "varlen: causal tiles visited ratio"
    out[_f(v["useful_flops"] / ms["ours_varlen"] / 1e9, 0)] = "varlen: packed TFLOP/s"
    out[_f(v["useful_flops"] / work / ms["ours_padded"] / 1e9, 0)] = "varlen: padded TFLOP/s (its causal work)"
    casc = {c["batch"]: c for c in r["cascade"]}
    for b, c in casc.items():
        out[_f(c["ms_graph_cascade"] * 1e3, 0)] = f"cascade B={b} graph us"
        out[_f(c["bytes_cascade"] / 1e6, 0)] = f"cascade B={b} MB read"
        out[_f(c["speedup_eager"])] = f"cascade B={b} eager speed-up"
    out[_f(casc[32]["bytes_cascade"] / casc[8]["bytes_cascade"], 1)] = "cascade bytes B=32 / B=8"
    out[_f(casc[8]["bytes_cascade"] / 3.35e12 * 1e6, 0)] = "cascade B=8 bytes at the H100 datasheet 3.35 TB/s (model)"
    e = r["eager"]
    for name in ("flash_decode", "paged_decode"):
        c = e["cases"][name]
        out[_f(c["loop_over_graph"])] = f"eager {name} loop/graph"
        out[_f(c["ms_graph"] * 1e3, 0)] = f"eager {name} graph us"
        out[_f(e["host_us_tiny"][name], 0)] = f"eager {name} host us per call"
    out[_f(r["prefill"]["paged_vs_contiguous"])] = "bench_serving: paged prefill (row gather) / contiguous"
    d = load("h200-decode.json")
    if d:
        paged = [p["vs_contiguous_graph"] for p in d["paged"] if p.get("block_size") == 16]
        out[_f(min(paged))] = out[_f(max(paged))] = "lecture 8: paged / contiguous decode, block 16 (H200)"
    out.update(_lecture09_mixed())
    out.update(_lecture09_hopper())
    out.update(_lecture09_host())
    return out


def _lecture09_host() -> dict:
    """Lecture 09 section 4's host-time numbers: ``h100-cascade-host-probe.json`` (``profile_cascade_host``), B = 8:
    the recorded launch's host time a call before / after the host-path cut and its step-by-step breakdown."""
    r = load("h100-cascade-host-probe.json")
    if r is None:
        return {}
    row = next(x for x in r["rows"] if x["batch"] == 8)
    out = {_f(v["median"], 1): f"cascade B=8 host us a call, {k}" for k, v in row["host_us"].items()}
    for step, us in row["breakdown_us"].items():
        for nd in (0, 1, 2):
            out[_f(us, nd)] = f"host breakdown: {step}"
    return out


def ncu_metrics(name: str) -> list[dict]:
    """``[{metric name: value}]`` per profiled kernel of an Nsight Compute CSV (``ncu --csv``), in the file's order;
    values are floats where they parse (thousands separators removed)."""
    import csv
    import io
    path = RESULTS / name
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    out: dict = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        out.setdefault(row["ID"], {}).setdefault(row["Metric Name"], value)  # first of a repeated name: the % one
    return [out[k] for k in sorted(out, key=int)]


def _lecture09_hopper() -> dict:
    """Lecture 09's Hopper sections: the Gluon paged prefill (``h100-paged-prefill.json``) and the Gluon cascade
    prefix pass (``h100-cascade.json``), each a ``bench_mixed_batch --sections`` run with its baselines."""
    out = {}
    p = load("h100-paged-prefill.json")
    if p:
        for page, r in p["prefill"]["pages"].items():
            x = r["vs_contiguous"]["paged_prefill_gluon_tma"]
            y = r["vs_contiguous_gluon"]["paged_prefill_gluon_tma"]
            out[_f(x)] = f"paged prefill, Gluon, {page}-token pages / Triton contiguous"
            out[_f(y)] = f"paged prefill, Gluon, {page}-token pages / Gluon contiguous"
            out[_f(100 * (1 - y), 0)] = f"paged prefill, Gluon, {page}-token pages: % behind Gluon contiguous"
    c = load("h100-cascade.json")
    if c:
        bw = c["meta"]["copy_bw_bytes_per_s"]
        prefix_fraction = []
        for r in c["cascade"]:
            g, f, b = r["ms_graph"], r["fraction_of_copy_bw"], r["batch"]
            for path in ("cascade_triton", "cascade_gluon", "cascade_gluon_pdl", "cascade_gluon_streams"):
                if path in g:
                    out[_f(g[path] * 1e3, 0)] = f"cascade {path} B={b} graph us"
                    out[_f(g[path] * 1e3, 1)] = f"cascade {path} B={b} graph us"
                    out[_f(f[path])] = f"cascade {path} B={b} own bytes / copy"
            for path, ratio in r.get("eager_loop_over_graph_paths", {}).items():
                out[_f(ratio)] = f"cascade {path} B={b} eager loop / graph"
            for path, kernels in r["kernel_us"].items():
                for kernel, us in kernels.items():
                    out[_f(us, 0)] = f"cascade {path} B={b} {kernel} us (profiler)"
            out[_f(r["eager_loop_over_graph"])] = f"cascade B={b} eager / graph (default path)"
            us = r["kernel_us"]["cascade_gluon"]["cascade_prefix_kernel"]
            out[_f(us, 0)] = f"cascade B={b} Gluon prefix kernel us"
            prefix_fraction.append(r["bytes"]["prefix_pass"] / (us * 1e-6) / bw)
        out[_f(min(prefix_fraction))] = out[_f(max(prefix_fraction))] = "cascade: Gluon prefix kernel bytes / copy"
    return out


def _lecture09_mixed() -> dict:
    """Lecture 09's numbers from ``bench_mixed_batch`` (``h100-mixed-batch.json``: mixed step, paged prefill by
    page size, one-launch cascade) and its ncu profile (``h100-serving-ncu.csv``: ``sweep_serving_perf
    --ncu-cases`` order: cascade B=8 whole call, B=8 prefix only, B=64 whole, B=64 prefix only, the mixed kernel
    on the 64-token-page prefill)."""
    out = {}
    r = load("h100-mixed-batch.json")
    if r is None:
        return out
    bw = r["meta"]["copy_bw_bytes_per_s"]
    m, g = r["mixed"], r["mixed"]["ms_graph"]
    out[_f(g["mixed_one_launch"] * 1e3, 0)] = "mixed step: one launch, graph us"
    out[_f(g["mixed_one_launch_block16"] * 1e3, 0)] = "mixed step: 16-key tiles, graph us"
    out[_f(m["speedup_vs_separate_graph"])] = "mixed step: separate prefill + decode launches / one launch"
    out[_f(m["speedup_vs_paged_prefill_graph"])] = "mixed step: paged_prefill over the whole batch / one launch"
    out[_f(m["kv_bytes"] / 1e9)] = "mixed step: K/V GB"
    tbs = m["kv_bytes"] / (g["mixed_one_launch"] * 1e-3)
    out[_f(tbs / 1e12)] = "mixed step: K/V TB/s of the one launch"
    out[_f(tbs / bw)] = "mixed step: one launch's K/V bandwidth / copy bandwidth"
    out[_f(m["kv_bytes"] / bw * 1e3, 1)] = "mixed step: K/V bytes at copy bandwidth, ms (the prediction)"
    out[_f(g["mixed_one_launch_first_version"] * 1e3, 0)] = "mixed step: table in place, one entry per key row, graph us"
    out[_f(g["mixed_one_launch_first_version"] / g["mixed_one_launch"])] = "mixed step: table in place / one launch"
    for page, x in r["prefill"]["pages"].items():
        for name, v in x["vs_contiguous"].items():
            out[_f(v)] = f"paged prefill, {page}-token pages: {name} / contiguous"
        for tile, row in x.get("pinned_ms", {}).items():
            for name, v in row.items():
                out[_f(row["contiguous_varlen"] / v)] = f"paged prefill, {page}-token pages, tile {tile}: {name}"
    sweep = load("h100-paged-prefill-sweep.json")
    for page, x in (sweep or {}).get("pages", {}).items():
        for tile, row in x.items():
            if isinstance(row, dict) and "paged_ahead_1_ms" in row:
                out[_f(x["contiguous_autotuned_ms"] / row["paged_ahead_1_ms"])] = (
                    f"sweep, {page}-token pages, tile {tile}: page tiles / contiguous autotuned")
    for c in r["cascade"]:
        b, cg, f = c["batch"], c["ms_graph"], c["fraction_of_copy_bw"]
        out[_f(cg["cascade"] * 1e3, 0)] = f"cascade one launch B={b} graph us"
        out[_f(cg["cascade_separate"] * 1e3, 0)] = f"cascade three launches B={b} graph us (same run)"
        out[_f(cg["prefix_pass"] * 1e3, 0)] = f"cascade prefix pass alone B={b} graph us"
        out[_f(c["bytes"]["prefix_pass"] / 1e6, 0)] = "cascade prefix MB"
        out[_f(c["speedup_graph_vs_paged"])] = f"cascade one launch B={b} speed-up over paged decode"
        out[_f(c["eager_speedup_vs_paged"])] = f"cascade B={b} eager / eager paged decode"
        out[_f(c["eager_loop_over_graph"])] = f"cascade B={b} eager loop / graph"
        for part in ("cascade", "prefix_pass", "suffix_pass", "paged"):
            out[_f(f[part])] = f"cascade B={b} {part} bytes / time / copy bandwidth"
        for path in ("cascade_triton", "prefix_pass_triton", "cascade_gluon_pdl"):  # the paths, not only the default
            if path in cg:
                out[_f(cg[path] * 1e3, 0)] = f"cascade {path} B={b} graph us"
                out[_f(f[path])] = f"cascade {path} B={b} own bytes / copy"
        for path, ratio in c.get("eager_loop_over_graph_paths", {}).items():
            out[_f(ratio)] = f"cascade {path} B={b} eager loop / graph"
        for path, ms in c.get("ms_loop_paths", {}).items():
            out[_f(c["ms_loop"]["paged"] / ms)] = f"cascade {path} B={b} eager / eager paged decode"
        for path, us in c.get("host_us_per_call", {}).items():
            out[_f(us, 0)] = f"cascade {path} B={b} host us a call"
            out[_f(c["host_us_per_call"][path], 0)] = f"cascade {path} B={b} host us a call"
        if "cascade_triton" in cg:
            out[_f(cg["paged"] / cg["cascade_triton"])] = f"cascade one-launch Triton B={b} speed-up over paged decode"
    ncu = ncu_metrics("h100-serving-ncu.csv")
    if len(ncu) >= 5:
        pct = lambda x: _f(x, 0)  # noqa: E731
        active = lambda x: pct(100 * x["SM Active Cycles"] / x["Elapsed Cycles"])  # noqa: E731
        out[active(ncu[1])] = "ncu cascade B=8 prefix only: SM active cycles / elapsed, %"
        p64 = ncu[3]
        out[pct(p64["DRAM Throughput"])] = "ncu cascade B=64 prefix only: DRAM throughput % of peak"
        out[pct(p64["Compute (SM) Throughput"])] = "ncu cascade B=64 prefix only: SM throughput %"
        out[pct(p64["L2 Hit Rate"])] = "ncu cascade B=64 prefix only: L2 hit rate %"
        out[active(p64)] = "ncu cascade B=64 prefix only: SM active cycles / elapsed, %"
        mk = ncu[4]
        out[pct(mk["Compute (SM) Throughput"])] = "ncu mixed kernel, 64-token-page prefill: SM throughput %"
        out[pct(mk["DRAM Throughput"])] = "ncu mixed kernel: DRAM throughput %"
        out[pct(mk["L2 Hit Rate"])] = "ncu mixed kernel: L2 hit rate %"
        out[_f(mk["Dynamic Shared Memory Per Block"] / 1000, 0)] = "ncu mixed kernel: shared memory per program, KB"
    # profile_paged_prefill --pins 64x64x4x3 order: 64-token pages: contiguous, page tiles, page tiles with the
    # table in place, row gather; 16-token pages: contiguous, page tiles, row gather
    pp = ncu_metrics("h100-prefill-ncu.csv")
    if len(pp) >= 7:
        for i, what in enumerate(("64-token contiguous", "64-token page tiles", "64-token table in place",
                                  "64-token row gather", "16-token contiguous", "16-token page tiles",
                                  "16-token row gather")):
            x = pp[i]
            out[_f(x["Dynamic Shared Memory Per Block"], 0)] = f"ncu prefill {what}: shared memory KB (Kbyte in this CSV)"
            out[_f(x["Executed Instructions"] / 1e6, 0)] = f"ncu prefill {what}: executed instructions, millions"
            out[_f(x["Warp Cycles Per Issued Instruction"])] = f"ncu prefill {what}: warp cycles per issued instr"
            out[_f(x["Registers Per Thread"], 0)] = f"ncu prefill {what}: registers per thread"
    return out


_ASSUMED09 = {
    "3.6": "the Triton version (3.6) whose launcher section 4 describes, not a measurement",
    "1.2": "the course's eager/graph bar (docs/SPEC §7), not a measurement",
    "3.35": "H100 datasheet HBM bandwidth, stated as not measured",
    "34": "model: 4 x 256 rows x 32768 keys x 128 x 8 kv heads FLOPs of the prefix pass at B = 64",
    "16": "assumed 8B model: 16 GB of bf16 weights",
    "500": "assumed matmul throughput of the step-time model",
    "4.8": "model: 16 GB / 3.35 TB/s",
    "128": "BLOCK_M, a configuration",
    "0.7": "the course's bar for cascade's own bandwidth (fraction of copy), not a measurement",
    "0.9": "the course's bar for paged prefill vs contiguous, not a measurement",
    "1.5": "the course's bar for eager cascade vs eager paged decode at B = 8, not a measurement",
}


def _lecture10() -> dict:
    out = {}
    for name in ("h200-ring-gluon-w4.json", "h200-ring-gluon-w2.json", "h200-ring-w2.json",
                 "h100-ring-w2.json"):  # later files win on ties
        out.update(_ring_numbers(name))
    t = load("h200-ring-w2.json")
    for name in ("h200-ring-gluon-w4.json", "h200-ring-gluon-w2.json"):
        g = load(name)
        if not g:
            continue
        key = lambda x: (x["pass"], x["causal"], x["layout"], x["n"])  # noqa: E731
        tri = {key(x): x for x in t["rows"]} if t and g["meta"]["world"] == t["meta"]["world"] else {}
        quoted = {max(y["n"] for y in g["rows"]), 131072}  # the longest N, and the issue's 128k
        for x in g["rows"]:
            if key(x) in {("forward", True, "zigzag", n) for n in quoted}:
                out[_f(x["tflops"] / g["meta"]["world"], 0)] = f"ring, Gluon step: TFLOP/s per GPU at N={x['n']} ({name})"
                if key(x) in tri:
                    out[_f(tri[key(x)]["ring_ms"] / x["ring_ms"])] = "ring: Triton step time / Gluon step time"
    p = RESULTS / "h100-profile-ring.json"
    if p.exists():
        out.update(_profile_ring_numbers(json.loads(p.read_text())))
    return out


def _profile_ring_numbers(r: dict) -> dict:
    """``benchmarks/course/profile_ring.py`` (one rank of the W = 2 ring on one GPU): per-rank efficiency of the
    old (``pairs``) and new (``calls``) decomposition, and the old version's merge time per rank, at 64k."""
    out = {}
    for row in r["rows"]:
        if row["n"] != 65536:
            continue
        for path in ("pairs", "calls"):
            worst = max(rr[path]["rank_ms"] for rr in row["ranks"])
            out[_f(row["one_gpu_ms"] / row["world"] / worst)] = f"profile_ring: {path} per-rank efficiency at 64k"
        merges = max(sum(sum(st["merge_ms"]) for st in rr["pairs"]["steps"].values()) for rr in row["ranks"])
        out[_f(merges, 1)] = "profile_ring: merges per rank of the pairs decomposition at 64k, ms"
    return out


def _ring_numbers(name: str) -> dict:
    out = {}
    r = load(name)
    if r is None:
        return out
    rows = r["rows"]
    for x in rows:
        out[_f(x["efficiency"])] = f"ring efficiency {x['pass']} causal={x['causal']} {x['layout']} N={x['n']}"
        if "hidden" in x:
            out[_f(x["hidden"])] = "ring: fraction of communication hidden"
        if (x["pass"], x["causal"], x["layout"]) == ("forward", True, "zigzag") and x["n"] == min(
                y["n"] for y in rows):
            out[_f(max(map(sum, x["compute_ms"])), 1)] = "ring: local compute per rank at the shortest N"
            out[_f(x["one_gpu_ms"] / 2, 1)] = "ring: half the one-GPU time at the shortest N"
    if all(max(map(sum, x["wait_ms"])) / x["ring_ms"] < 0.005 for x in rows if x["pass"] == "backward"):
        out["0.5"] = "ring backward: exposed wait < 0.5% of ring time in every row"
    return out


_ASSUMED10 = {
    "500": "assumed attention throughput of the communication model",
    "400": "assumed NVLink one-way bandwidth of the communication model",
    "2.5": "backward / forward FLOPs (5 matmuls against 2): arithmetic",
    "1.2": "model: break-even ratio 3 / 2.5",
    "0.67": "model: W / (2W - 1) at W = 2 (also the measured contiguous maximum)",
    "0.57": "model: ring_work efficiency of the contiguous layout at W = 4 (4/7)",
    "320": "model: K/V bytes of a 70B-like model at 1M tokens",
    "1.00": "ring: hidden fraction rounds to 1.00",
}

def markdown_text(src_path) -> str:
    """The markdown cells of a lecture source joined, whitespace collapsed (a phrase may wrap over lines)."""
    from autograder.percent import parse_percent
    text = Path(src_path).read_text(encoding="utf-8")
    cells = [c.source for c in parse_percent(text, str(src_path)) if c.kind == "markdown"]
    return re.sub(r"\s+", " ", " ".join(cells))


def lecture_check(stem: str, src=None) -> tuple[dict, list[str]]:
    """``(derived numbers, prose numbers with neither a results file nor a reason behind them)``; a phrase of
    ``PHRASES[stem]`` that the prose lacks is reported as ``"phrase: ..."``. ``src``: the lecture source to check
    (default ``lectures/src/<stem>.py``)."""
    derive, assumed = LECTURES[stem]
    derived = derive()
    src = src or RESULTS.parent.parent / "lectures" / "src" / f"{stem}.py"
    missing = [n for n in prose_numbers(src) if n not in derived and n not in assumed]
    if stem in PHRASES:
        text = markdown_text(src)
        missing += [f"phrase: {q}" for q in PHRASES[stem]() if q not in text]
    return derived, sorted(set(missing))


# ---- lecture 06: section 10d's ablation phrases, the Hopper / ncu / FP8 numbers --------------------------------
def _pct_span(xs):
    return f"{min(xs):+.1%} to {max(xs):+.1%}"


def _ncu_tensor_busy(name: str) -> list[float]:
    """``sm__pipe_tensor_op_hmma_cycles_active`` (% of peak, active cycles) per profiled kernel of an ncu CSV, in
    the file's order (``bench_gluon``'s ``NCU_CASES``: per case cuDNN, one CTA per tile, persistent)."""
    import csv
    import io
    path = RESULTS / name
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    return [float(r["Metric Value"]) for r in csv.DictReader(io.StringIO("\n".join(lines[start:])))
            if r["Metric Name"] == "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"]


def lecture06_quotes() -> list[str]:
    """The phrases of lecture 06's prose that carry a measured number, rebuilt from the results files (Gluon
    ablation ``<gpu>-gluon.json``, ``h100-gluon-headminor.json``, ``h100-gluon-ncu.csv``, ``h100-hopper.json``,
    ``cpu-fp8-error.json``); each must appear verbatim in the lecture's markdown. Counts and spans of section 10d
    are over the rows with N >= 2k."""
    runs = {g: load(f"{g}-gluon.json") for g in ("h100", "h200")}
    if not all(runs.values()):
        return []
    t = lambda x, c: x[c]["tflops"]
    rel = lambda x, c: t(x, c) / x["cudnn"]["tflops"]
    long = {g: [x for x in r["bench"]["main"] if x["N"] >= 2048] for g, r in runs.items()}
    n = len(long["h100"])
    slow = {g: sum(t(x, "gluon_overlap") < t(x, "triton") for x in xs) for g, xs in long.items()}
    trail = {g: sum(t(x, "gluon_pingpong") < t(x, "gluon_specialized") for x in xs) for g, xs in long.items()}
    pp = {g: _pct_span([t(x, "gluon_pingpong") / t(x, "gluon_specialized") - 1 for x in xs]) for g, xs in long.items()}
    pers = {(g, c): _pct_span([t(x, "gluon_pingpong_persistent") / t(x, "gluon_specialized_persistent") - 1
                               for x in xs if x["causal"] == c]) for g, xs in long.items() for c in (False, True)}
    row = lambda g, d, causal, nn: next(x for x in runs[g]["bench"]["main"]
                                        if (x["d"], x["causal"], x["N"]) == (d, causal, nn))
    c2k = row("h100", 128, True, 2048)
    spec = [rel(x, "gluon_specialized") for x in long["h100"]]
    at2k = [row(g, 128, c, 2048) for g in runs for c in (False, True)]
    out = [
        f"in {slow['h100']} of {n} rows on the H100 and {slow['h200']} of {n} on the H200",
        f"N = 2k on the H100: {rel(c2k, 'gluon_overlap'):.2f}x cuDNN against Triton's {rel(c2k, 'triton'):.2f}x",
        f"(`specialized`, {min(spec):.2f}-{max(spec):.2f}x at N >= 2k on the H100)",
        f"trails `specialized` in {trail['h100']} of {n} rows on the H100 and {trail['h200']} of {n} on the H200, "
        f"by {pp['h100']} (H100) and {pp['h200']} (H200)",
        f"ping-pong gains {pers[('h100', False)]} (H100) and {pers[('h200', False)]} (H200) non-causal, and "
        f"{pers[('h100', True)]} (H100), {pers[('h200', True)]} (H200) causal",
        f"`specialized` at causal d = 128, N = 1k ({rel(row('h100', 128, True, 1024), 'gluon_specialized_persistent'):.2f}x)",
        f"from {min(rel(x, 'gluon_pingpong') for x in at2k):.2f}-{max(rel(x, 'gluon_pingpong') for x in at2k):.2f}x "
        f"to {min(rel(x, 'gluon_pingpong_persistent') for x in at2k):.2f}-"
        f"{max(rel(x, 'gluon_pingpong_persistent') for x in at2k):.2f}x cuDNN",
    ]
    hm = load("h100-gluon-headminor.json")
    if hm:
        m = {x["causal"]: rel(x, "gluon_pingpong_persistent") for x in hm["bench"]["main"]
             if x["d"] == 128 and x["N"] == 2048}
        out.append(f"fell to {m[False]:.2f}x (non-causal) and {m[True]:.2f}x (causal) at d = 128, N = 2k on the H100")
    busy = _ncu_tensor_busy("h100-gluon-ncu.csv")
    n = len(busy) // 3  # kernels per case (``NCU_CASES``: 2k non-causal, 2k causal, 8k), cuDNN, one CTA per tile,
    if n >= 3:          # persistent first (newer runs add the persistent key loop spelled out: n = 4)
        out.append(f"ncu shows the tensor pipe busy {busy[1]:.0f}% of the time against cuDNN's {busy[0]:.0f}%. The "
                   f"persistent kernel hides both ({busy[2]:.0f}%; causal {busy[n + 1]:.0f}% -> {busy[n + 2]:.0f}%)")
    hop = load("h100-hopper.json")
    if hop:
        ratio = {k: next(x["ours"]["fwd_tflops"] / x["cudnn"]["fwd_tflops"] for x in hop[k]
                         if (x["d"], x["causal"], x["N"]) == (128, True, 2048)) for k in ("main", "main_rerun")}
        out.append(f"the causal N = 2048 forward at {ratio['main']:.2f}x cuDNN was {ratio['main_rerun']:.2f}x when "
                   f"re-run (`main_rerun` in `h100-hopper.json`)")
    fp8 = load("cpu-fp8-error.json")
    if fp8:
        by_n = {x["n"]: x["o_ratio"] for x in fp8["lecture"]}
        s4, s8 = fp8["draws_summary"]["4096"], fp8["draws_summary"]["8192"]
        out.append(f"about {by_n[512]:.1f}x at $N = 512$, {by_n[1024]:.1f}x at 1024, **{s4['o_ratio_min']:.1f}–"
                   f"{s4['o_ratio_max']:.1f}x at $N = 4096$** ({s4['draws']} random draws, mean "
                   f"{s4['o_ratio_mean']:.2f}x) and {s8['o_ratio_min']:.1f}–{s8['o_ratio_max']:.1f}x at $N = 8192$ "
                   f"(mean {s8['o_ratio_mean']:.2f}x)")
    out += _train_step_host_quotes()
    out += _persistent_bwd_quotes()
    aot = load("sm90a-gluon-aot.json")
    if aot:
        v = aot["variants"]
        out.append(f"with one {v['pingpong']['shared_bytes'] / 1000:.0f} KB CTA per SM")
        out.append(f"The persistent kernels add {(v['pingpong_persistent']['shared_bytes'] - v['pingpong']['shared_bytes']) / 1024:.0f} KB of shared memory")
        table = [u for u in v.values() if "key_loop" not in u]   # section 10c's first table
        out.append("None of the kernels in this table spills" if not any(u["LDL"] + u["STL"] for u in table)
                   else "some kernels in this table spill")
        causal = v.get("pingpong_persistent_causal_fence")
        if causal:
            out.append(f"spills: {causal['LDL']} `LDL` and {causal['STL']} `STL`")
    return out


def _train_step_host_quotes() -> list[str]:
    """Lecture 06's host-bound training step (causal 2k, d = 128, B = 8, H = 16, H200): the probe before and after
    the recorded launches (all four of the step's Triton launches) (``h200-train-step-probe-jit-launch.json``, ``h200-train-step-probe.json``), the bar
    table before and after, and ncu's kernel sums (``h200-gluon-train-ncu.json``)."""
    files = [load(f) for f in ("h200-train-step-probe-jit-launch.json", "h200-train-step-probe.json",
                               "h200-gluon-train-bar-jit-launch.json", "h200-gluon-train-bar.json",
                               "h200-gluon-train-ncu.json")]
    if not all(files):
        return []
    cell = (128, True, 2048, 16, 16)
    pick = lambda rows: next(x for x in rows if (x["d"], x["causal"], x["N"], x["H"], x["H_kv"]) == cell)  # noqa: E731
    before, after = pick(files[0]["rows"]), pick(files[1]["rows"])
    bar_before, bar_after = (pick(f["bar"])["ratio_rounds_median"] for f in files[2:4])
    ncu = next(x for x in files[4]["rows"] if (x["causal"], x["N"], x["H"]) == cell[1:4])
    kernels = ncu["cudnn"]["step"]["duration_us"] / ncu["gluon"]["step"]["duration_us"]
    k = before["gluon"]["kernels"]
    hb, ha = before["gluon"]["host_us"], after["gluon"]["host_us"]
    return [f"runs the step's kernels in {k['busy_us_per_step'] / 1e3:.2f} ms, and issuing them through Triton's "
            f"launch path took {min(hb) / 1e3:.1f}-{max(hb) / 1e3:.1f} ms of Python a step",
            f"idle for {k['idle_us_per_step'] / k['span_us_per_step']:.0%} of back-to-back steps, and the step "
            f"measured {bar_before:.2f}x cuDNN in one run, with kernels at {kernels:.2f}x (ncu). Another run of the "
            f"same code read {before['ratio']:.2f}x",
            f"the host time to {min(ha) / 1e3:.1f}-{max(ha) / 1e3:.1f} ms a step and the step to {bar_after:.2f}x "
            f"cuDNN"]


def _persistent_bwd_quotes() -> list[str]:
    """Lecture 06's persistent backward (``h200-bwd-persistent-probe.json``: the backward alone, one CTA per key
    block vs persistent, x cuDNN's backward, on the training-step bar's rows)."""
    r = load("h200-bwd-persistent-probe.json")
    if not r:
        return []
    rows = r["rows"]
    causal = [x for x in rows if x["causal"]]
    ahead = sum(x["x_cudnn"]["persistent"] > x["x_cudnn"]["blocks"] for x in causal)
    pick = lambda d, c, n: next(x for x in rows if (x["d"], x["causal"], x["N"], x["H"] == x["H_kv"]) == (d, c, n, True))  # noqa: E731
    c2 = pick(64, True, 2048)["x_cudnn"]
    long_nc = [x["persistent_vs_blocks"] for x in rows if not x["causal"] and x["N"] >= 8192 and x["H"] == x["H_kv"]]
    return [f"from {c2['blocks']:.2f}x to {c2['persistent']:.2f}x cuDNN at d = 64, causal N = 2k",
            f"ahead in {ahead} of the {len(causal)} causal rows",
            f"{1 - max(long_nc):.0%}-{1 - min(long_nc):.0%} slower on long non-causal MHA rows"]


def _lecture06() -> dict:
    """Every result-like number inside a ``lecture06_quotes`` phrase (the phrase itself is checked verbatim)."""
    out = {}
    for phrase in lecture06_quotes():
        for m in _NUM.finditer(phrase):
            number, unit, times = m.groups()
            if "." in number or unit or times:
                out[number] = f"lecture06_quotes: {phrase}"
    return out


_TALK = "Tri Dao's FA3 talk (H100), quoted as *(talk)*, not measured here"
_ASSUMED06 = {
    "70": "talk: FlashAttention-2 at ~70% of peak on an A100", "40": "talk: 35-40% of peak on an H100",
    "1.5": "FA3 paper abstract: 1.5-2.0x over FA2", "2.0": "FA3 paper abstract: 1.5-2.0x over FA2",
    "50": "model: exp / GEMM cycles on H100 FP16, 1024 / 2048 (cycle_model.tile_cycles, printed by the cell)",
    "2.6": "talk slide 24 = FA3 Table 3's 2.4e-2 / 9.1e-3", "0.1": "FA3 section 4.3's setup: 0.1% outlier entries",
    "4.3": "a section number of the FA3 paper", "2.4": "FA3 Table 3 RMSE", "9.1": "FA3 Table 3 RMSE",
    "9.3": "FA3 Table 3 RMSE", "1.8": "also the test suite's 1.8-4x band (tests/test_hopper.py), a bound",
    "4": "the test suite's 1.8-4x band (tests/test_hopper.py), a bound", "75": "FA3 paper: 740 TFLOPS, 75% of peak",
    "740": "FA3 paper: 740 TFLOPS", "12.8": "software versions of the talk's slide", "9.6": "software versions",
    "3.1": "software version / FA3 section 3.1 (also a derived ping-pong span end)", "3.6": "Triton version",
    "1.3": "talk: FP8 up to 1.3 PFLOPS (also a derived FP8 ratio)", "840": _TALK, "730": _TALK, "750": _TALK,
    "640": _TALK, "670": _TALK, "700": _TALK, "989": "H100/H200 datasheet dense bf16 TFLOPS",
    "570": "FA3 paper Table 2: without warp specialisation 661 -> 570 TFLOP/s", "10": "talk: 580 -> 640 is +10%",
    "227": "Hopper's shared-memory limit per CTA (CUDA programming guide)",
}
PHRASES = {"06_fa3_hopper": lecture06_quotes}
LECTURES = {"06_fa3_hopper": (_lecture06, _ASSUMED06), "09_serving": (_lecture09, _ASSUMED09),
            "10_ring_attention": (_lecture10, _ASSUMED10)}


def main() -> int:
    lines = []
    for name, fn in (("cpu-numpy.json", cpu_lines), ("h200-attention.json", attention_lines),
                     ("h200-decode.json", decode_lines), ("h100-decode.json", decode_lines)):
        r = load(name)
        lines += fn(r) if r else [f"{name}: not there"]
    io = load("cpu-iosim.json")
    if io:
        t = io["seeds_table"]
        lines.append(f"cpu-iosim.json: HBM standard {t['standard']['hbm_gb']:.1f} GB vs flash {t['flash']['hbm_gb']:.2f} GB "
                     f"(seeds 40.3 vs 4.4)")
    for path in sorted(RESULTS.glob("*-serving.json")):
        lines += serving_lines(json.loads(path.read_text()))
    for path in sorted(RESULTS.glob("*-mixed-batch.json")):
        r = json.loads(path.read_text())
        lines += [f"{path.name} ({r['meta']['gpu']}): {q}" for q in mixed_batch_quotes(r)]
    for path in sorted(RESULTS.glob("*-gluon-key-loop.json")):
        r = json.loads(path.read_text())
        lines += [f"{path.name} ({r['meta']['gpu']}): {q}" for q in key_loop_quotes(r)]
    frag = load("cpu-fragmentation.json")
    if frag:
        s = frag["summary"]
        lines.append("cpu-fragmentation.json: utilisation " + ", ".join(f"{k} {v['utilisation']:.1%}" for k, v in s.items()))
    for stem in LECTURES:
        derived, missing = lecture_check(stem)
        lines.append(f"lecture {stem}: {len(derived)} numbers derived from results files"
                     + (f"; prose numbers with no results file: {', '.join(missing)}" if missing else
                        "; every prose number is backed"))
    lines += [f"lecture 06 quotes: {q}" for q in lecture06_quotes()]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
