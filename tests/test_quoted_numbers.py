"""The numbers ``docs/results.md`` (the measured-number table) quotes are
the ones ``benchmarks/quoted_numbers.py`` derives from the results files, and each row names the GPU its files
were measured on."""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
QUOTED = ROOT / "docs" / "results.md"


DETAILS = ROOT / "notes" / "results_details.md"


def _quoted() -> str:
    return QUOTED.read_text()


def _quoted_with_details() -> str:
    """docs/results.md's headline table and its long form, ``notes/results_details.md`` (a number may be quoted in
    either)."""
    return QUOTED.read_text() + "\n" + DETAILS.read_text()


def test_script_prints_every_results_file_and_the_missed_bars():
    out = subprocess.run([sys.executable, "-m", "benchmarks.quoted_numbers"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for name in ("cpu-numpy.json", "NVIDIA H200", "cpu-iosim.json", "cpu-fragmentation.json"):
        assert name in out
    missed = 0
    for name in ("h200-decode.json", "h100-decode.json"):   # every committed decode run the script reads
        missed += sum(not b["passed"] for b in json.loads((RESULTS / name).read_text())["bars"])
    assert out.count("bar MISSED") == missed


def test_results_md_quotes_the_mixed_batch_and_h100_decode_runs():
    """The mixed step, one-launch cascade (graph, eager, copy fraction, prefix pass) and paged-prefill rows quote
    ``h100-mixed-batch.json`` and the H100 decode row ``h100-decode.json``, as ``quoted_numbers`` rebuilds them,
    in docs/results.md or its long form (a re-run that moves a number fails until the text follows)."""
    qn = _qn()
    text = re.sub(r"\s+", " ", _quoted_with_details())
    quotes = qn.mixed_batch_quotes(json.loads((RESULTS / "h100-mixed-batch.json").read_text()))
    quotes += qn.decode_quotes(json.loads((RESULTS / "h100-decode.json").read_text()))
    assert len(quotes) >= 9
    assert [q for q in quotes if q not in text] == []
    speedups = next(q for q in quotes if q.count("x / ") == 3)  # the cascade speed-ups over paged decode
    first = speedups.split(" / ")[0]
    moved = text.replace(speedups, speedups.replace(first, f"{float(first[:-1]) + 0.01:.2f}x", 1))
    assert [q for q in quotes if q not in moved] == [speedups]  # one number moved: the check notices


def test_results_md_quotes_the_key_loop_run():
    """The Gluon key-loop row's long form quotes ``h100-gluon-key-loop.json`` as ``quoted_numbers.key_loop_quotes``
    rebuilds it."""
    text = re.sub(r"\s+", " ", _quoted_with_details())
    quotes = _qn().key_loop_quotes(json.loads((RESULTS / "h100-gluon-key-loop.json").read_text()))
    assert len(quotes) == 4 and [q for q in quotes if q not in text] == []


def test_readme_decode_and_cpu_numbers_match_the_results_files():
    readme = _quoted()
    decode = json.loads((RESULTS / "h200-decode.json").read_text())
    by = {(x["batch"], x["context"], x["impl"]): x["ms_graph"] for x in decode["results"] if "ms_graph" in x}
    one = " / ".join(f"{by[(1, n, 'one_split')] / by[(1, n, 'split_kv')]:.1f}x" for n in (32768, 65536, 131072))
    assert one in readme, one
    fa2 = " / ".join(f"{by[(1, n, 'fa2_per_qhead')] / by[(1, n, 'split_kv')]:.2f}x" for n in (32768, 65536, 131072))
    assert fa2 in readme, fa2  # the split-KV gain over FA2's decode parallelism (the seeds' "up to 8x")
    cpu = json.loads((RESULTS / "cpu-numpy.json").read_text())
    at4096 = [row["tiled64x64_fwd_ratio_median"] for run in cpu["runs"] for row in run["rows"] if row["N"] == 4096]
    for x in at4096:
        assert f"{x:.2f}x" in readme, x
    row = re.search(r"\| paged decode \(block 16\).*?\| ([0-9.]+)x-([0-9.]+)x", readme)
    paged = [p["vs_contiguous_graph"] for p in decode["paged"] if p.get("block_size") == 16]
    assert row and (float(row[1]), float(row[2])) == (round(min(paged), 2), round(max(paged), 2))


def _gluon_span(gpu, schedule, causal, d=128, n_min=2048):
    r = json.loads((RESULTS / f"{gpu}-gluon.json").read_text())
    xs = [row[schedule]["tflops"] / row["cudnn"]["tflops"] for row in r["bench"]["main"]
          if row["d"] == d and row["causal"] == causal and row["N"] >= n_min]
    return f"{min(xs):.2f}-{max(xs):.2f}"


def test_readme_gluon_forward_ratios_match_the_results_files():
    """The Gluon row quotes, per GPU, min-max of the default (persistent ping-pong) / cuDNN at d=128, N >= 2k,
    non-causal / causal."""
    readme = _quoted()
    row = next(line for line in readme.splitlines() if line.startswith("| **Gluon FA3-style forward**"))
    for gpu in ("h100", "h200"):
        spans = [_gluon_span(gpu, "gluon_pingpong_persistent", causal) for causal in (False, True)]
        quoted = f"{gpu.upper()} {spans[0]} / {spans[1]}"
        assert quoted in row, quoted
        r = json.loads((RESULTS / f"{gpu}-gluon.json").read_text())
        assert all(c["ok"] for k, v in r.items() if k.startswith("check:") for c in v)  # checked before timed


def _span(xs):
    return f"{min(xs):.2f}-{max(xs):.2f}"


def test_readme_gluon_backward_and_training_step_ratios_match_the_results_files():
    """The backward row quotes the default warp-specialised config / cuDNN per GPU (d=128, N >= 2k, non-causal /
    causal); the training-step row the autograd op / cuDNN on the H100."""
    from reference.triton.configs import GLUON_BACKWARD
    readme = _quoted()
    row = next(line for line in readme.splitlines() if line.startswith("| **Gluon warp-specialised backward**"))
    key = "gluon_ws_split_" + "_".join(str(int(x)) for x in GLUON_BACKWARD[128].as_tuple())
    for gpu in ("h100", "h200"):
        r = json.loads((RESULTS / f"{gpu}-gluon-wsbwd.json").read_text())
        assert all(c["ok"] for c in r["check"])
        spans = [_span([x[key]["tflops"] / x["cudnn"]["tflops"] for x in r["bench"]["main"]
                        if x["d"] == 128 and x["causal"] == causal and x["N"] >= 2048
                        and x.get("H_kv", x["H"]) == x["H"]]) for causal in (False, True)]  # MHA rows
        quoted = f"{gpu.upper()} {spans[0]} / {spans[1]}"
        assert quoted in row, quoted
    row = next(line for line in readme.splitlines() if line.startswith("| **Gluon training step**"))
    r = json.loads((RESULTS / "h100-gluon-train.json").read_text())["bench"]
    mha = [x for x in r if x.get("H_kv", x["H"]) == x["H"]]
    spans = [_span([x["gluon"]["tflops"] / x["cudnn"]["tflops"] for x in mha if x["causal"] == c])
             for c in (False, True)]
    assert f"H100 {spans[0]} / {spans[1]}" in row
    assert _span([x["triton"]["tflops"] / x["cudnn"]["tflops"] for x in mha]) in row
    # the GQA rows (Hq = 32, Hkv = 8): causal 8k and 32k, the bar
    gqa = {(x["causal"], x["N"]): x["gluon"]["tflops"] / x["cudnn"]["tflops"] for x in r if x not in mha}
    assert f"GQA 32/8 causal 8k / 32k {gqa[(True, 8192)]:.2f} / {gqa[(True, 32768)]:.2f}" in row


def _gpu_of(name: str) -> str:
    r = json.loads((RESULTS / name).read_text())
    meta = r.get("meta") or {}
    gpu = r.get("gpu") or meta.get("gpu") or meta.get("device") or ""   # bench_ring writes meta.device
    return "H100" if "H100" in gpu else "H200" if "H200" in gpu else ""


def test_every_row_names_the_gpu_its_files_were_measured_on():
    """The "measured on" column of each row names exactly the GPUs of the results files the row cites (``same``
    carries the row above's files); the README keeps no measured-number row and links docs/results.md."""
    rows = [line for line in _quoted().splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    assert len(rows) >= 25
    files = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        on, cited = cells[1], cells[3]
        if cited != "same":
            files = []
            for tok in re.findall(r"[\w*<>\-]+\.json", cited):
                files += [p.name for p in sorted(RESULTS.glob(tok.replace("<gpu>", "*")))]
        gpus = {_gpu_of(f) for f in files if f.endswith(".json")} - {""}
        named = {g for g in ("H100", "H200") if g in on}
        if "not measured" in on:
            assert not gpus, row
        else:
            assert named == gpus, (row[:80], named, gpus)
    readme = (ROOT / "README.md").read_text()
    assert "docs/results.md" in readme and "All GPU numbers: one NVIDIA H200" not in readme
    assert not [line for line in readme.splitlines() if line.startswith("| ") and "benchmarks/results/" in line]


# --- lectures: every result-like number in the prose of a lecture has a results file behind it ----

def _qn():
    import importlib.util
    spec = importlib.util.spec_from_file_location("quoted_numbers", ROOT / "benchmarks" / "quoted_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lecture_prose_numbers_are_backed_by_results_files():
    """Lectures 06, 09 and 10 (``quoted_numbers.LECTURES``): a decimal or a number with a unit in a markdown cell
    must be derived from a committed results JSON, or listed with the reason it is not measured; lecture 06's
    phrases (``quoted_numbers.PHRASES``) must appear verbatim."""
    qn = _qn()
    assert {"06_fa3_hopper", "09_serving", "10_ring_attention"} <= set(qn.LECTURES)
    for stem in qn.LECTURES:
        derived, missing = qn.lecture_check(stem)
        assert derived, f"{stem}: no results file found"
        assert not missing, f"lectures/src/{stem}.py quotes {missing} with no results JSON behind them"


def test_lecture_number_scan_finds_results_and_skips_configurations(tmp_path):
    qn = _qn()
    src = tmp_path / "99_x.py"
    src.write_text("# %% [markdown]\n# The kernel ran 9.99x faster (3.5 TB/s, 120 µs, 16.4%), 2x less, on 32k tokens\n"
                   "# with BLOCK_M = 128 and 16-token pages ([arXiv:2310.01889](x)).\n\n# %%\nx = 7.77\n")
    assert qn.prose_numbers(src) == ["9.99", "3.5", "120", "16.4", "2"]


def test_lecture_10_quotes_the_measured_ring_run():
    r = json.loads((RESULTS / "h100-ring-w2.json").read_text())
    assert r["meta"]["world"] == 2 and "H100" in r["meta"]["device"]
    eff = {x["n"]: x["efficiency"] for x in r["rows"] if (x["pass"], x["causal"], x["layout"]) ==
           ("forward", True, "zigzag")}
    quoted = " / ".join(f"{eff[n]:.2f}" for n in sorted(eff))
    text = (ROOT / "lectures" / "src" / "10_ring_attention.py").read_text()
    assert quoted in text, quoted
    assert "NCCL_NVLS_ENABLE=0 python3 -m benchmarks.course.bench_ring --world-size 2" in text


# ---- lecture 06: its phrases carry the numbers in context (quoted_numbers.PHRASES) --------------------------------
def test_lecture06_phrases_are_rebuilt_from_the_results_files():
    """Section 10d's ablation counts and spans, the ncu tensor-pipe shares, the Hopper re-run and the FP8 CPU
    experiment: each phrase is rebuilt from its results file (so a re-run that moves a number fails until the
    prose follows)."""
    qn = _qn()
    quotes = qn.PHRASES["06_fa3_hopper"]()
    assert len(quotes) >= 12
    text = qn.markdown_text(ROOT / "lectures" / "src" / "06_fa3_hopper.py")
    assert not [q for q in quotes if q not in text]


def test_lecture06_check_fails_on_a_moved_number(tmp_path):
    """The check can fail: a prose with one count changed loses its phrase, and a new unbacked number is named."""
    qn = _qn()
    src = ROOT / "lectures" / "src" / "06_fa3_hopper.py"
    moved = tmp_path / "06_fa3_hopper.py"
    moved.write_text(src.read_text().replace("13 of 16 rows on the H100", "12 of 16 rows on the H100")
                     .replace("mean 2.13x", "mean 2.31x"))
    assert qn.lecture_check("06_fa3_hopper")[1] == []
    missing = qn.lecture_check("06_fa3_hopper", moved)[1]
    assert "2.31" in missing
    assert any(m.startswith("phrase: in 13 of 16 rows on the H100") for m in missing)


# ---- lecture 10: the Ulysses / ring byte ratio of the summary follows comm_model --------------------------------
def test_lecture10_ulysses_ring_ratio_matches_comm_model():
    """The summary's ``(H_q + H_kv) / (H_kv · W)`` is ``comm_model``'s Ulysses / ring forward bytes (for kv heads
    >= W, no replication), and its two instances (``2/W`` MHA, ``5/W`` GQA 32/8, ring / Ulysses 8/5 at W = 8)
    follow from it; a summary back at ``1/W`` fails."""
    from reference.distributed import comm_model as cm
    for hq, hkv in ((32, 32), (32, 8), (16, 4)):
        for w in (2, 4, 8):
            if hkv < w:
                continue
            ratio = cm.comm_bytes("ulysses", 131072, w, hq, hkv, 128) / cm.comm_bytes("ring", 131072, w, hq, hkv, 128)
            assert abs(ratio - (hq + hkv) / (hkv * w)) < 1e-12, (hq, hkv, w, ratio)
    mha = cm.comm_bytes("ulysses", 65536, 4, 32, 32, 128) / cm.comm_bytes("ring", 65536, 4, 32, 32, 128)
    gqa = cm.comm_bytes("ring", 131072, 8, 32, 8, 128) / cm.comm_bytes("ulysses", 131072, 8, 32, 8, 128)
    assert abs(mha - 2 / 4) < 1e-12 and abs(gqa - 8 / 5) < 1e-12
    text = _qn().markdown_text(ROOT / "lectures" / "src" / "10_ring_attention.py")
    summary = text[text.index("## Summary"):]
    for phrase in ("`(H_q + H_kv) / (H_kv · W)` of the ring's forward bytes", "`2/W` with one kv head per query head",
                   "`5/W` for GQA 32/8", "the ring sends 8/5 of Ulysses' bytes at W = 8"):
        assert phrase in summary, phrase
    assert "`1/W` of the ring's bytes" not in summary


# ---- lecture 09: the cascade's path thresholds are CascadeConfig's defaults ---------------------------------
def test_lecture09_cascade_thresholds_match_cascade_config():
    """Lecture 09 says which path ``cascade_decode`` takes on Hopper (captured calls from ``gluon_min_rows``
    packed rows, eager calls from ``eager_gluon_min_rows``); a changed default fails until the prose follows."""
    from reference.triton.cascade import CascadeConfig
    cfg = CascadeConfig()
    captured, eager, g = cfg.gluon_min_rows, cfg.eager_gluon_min_rows, 4   # G = Hq / Hkv = 32 / 8 in the lecture
    text = _qn().markdown_text(ROOT / "lectures" / "src" / "09_serving.py")
    for phrase in (f"calls made eagerly below {eager} packed rows `B · G` per kv head (B < {eager // g} at G = {g}",
                   f"calls captured into a CUDA graph below {captured} rows (B < {captured // g}",
                   f"a captured B = {captured // g} call takes the Gluon path",
                   f"the one-launch Triton kernel below {captured} rows (`gluon_min_rows`)",
                   f"takes the Gluon path only from {eager} rows (`eager_gluon_min_rows`)"):
        assert phrase in text, phrase
