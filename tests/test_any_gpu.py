"""Any CUDA GPU from sm_75 up, checked on CPU with fake devices.

``reference.triton._device`` is the one place that reads the GPU's compute capability and shared memory; the
tests replace its driver query (``_device._query``) by a Colab T4 (sm_75, 64 KB), a 100 KB sm_86 card (A10,
RTX 30xx; the L4 is sm_89 with 99 KB) and an sm_90 H100 (228 KB), and check that

* every configuration each kernel family chooses (forward autotune list, small-query pin, backward dK/dV, fused
  and dQ lists, decode and paged decode, persistent forward, fused softmax) fits the device's shared memory
  (the estimate of ``_device.smem_*``), and that an H100 chooses exactly what it chose before;
* the tile sizes the assignment solutions hard-code fit every device at the head dimensions graded on a GPU;
* Hopper-only paths (tensor descriptors / TMA, FP8, Gluon) are not taken below sm_90;
* bfloat16 on sm_75: the reference API raises a ``TypeError`` naming the dtype and the device, and the grader
  runs bfloat16 cases as float16 and says so; every GPU test of every spec runs on a T4 except the Hopper-only
  FP8 part, which says "not run" and why.

What this cannot check: that Triton really compiles these configurations on such GPUs within those limits (the
shared-memory estimate is a model; notes/any_gpu.md), and the speed ratios there.
"""
from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import triton

from autograder import engine
from autograder import specs as specs_mod
from reference.triton import _checks, _device, decode, flash_bwd, flash_fwd
from reference.triton.hopper import flash_fp8, flash_persistent
from reference.triton import fused_softmax
from reference.triton._checks import HEAD_DIMS

pytestmark = pytest.mark.any_gpu

REPO = Path(__file__).resolve().parent.parent
T4 = _device.DeviceLimits((7, 5), 64 * 1024, "Tesla T4")
SM86 = _device.DeviceLimits((8, 6), 100 * 1024, "NVIDIA A10")
H100 = _device.DeviceLimits((9, 0), 228 * 1024, "NVIDIA H100")
FAKES = [T4, SM86, H100, *_device.KNOWN.values()]
SHAPES = [(1, 1), (16, 16), (40, 90), (128, 128), (1000, 1000), (4096, 4096), (16384, 16384)]


@pytest.fixture(params=FAKES, ids=lambda L: f"{L.sm}-{L.smem // 1024}KB")
def fake(request, monkeypatch):
    """CUDA device 0 is ``request.param`` for ``_device.device_limits``."""
    monkeypatch.setattr(_device, "_query", lambda index: request.param)
    _device.clear_cache()
    yield _device.device_limits(torch.device("cuda", 0))
    _device.clear_cache()


def test_fake_device_is_read_through_the_query(fake):
    assert _device.device_limits(torch.device("cuda", 0)) is fake
    assert _device.device_limits(torch.device("cpu")) is _device.INTERPRETER   # the interpreter: as an H100


# ------------------------------------------------------------------------------------------- every family fits
def _fits(need, limits):
    assert _device.fits(need, limits), f"{need} does not fit {limits.describe()} (usable {limits.usable_smem})"


@pytest.mark.parametrize("es", [2, 4])
def test_forward_configs_fit(fake, es):
    for d in HEAD_DIMS:
        for n_q, n_k in SHAPES:
            chosen = flash_fwd.fwd_configs_for(d, es, n_q, n_k, fake)
            assert chosen
            for c in chosen:
                _fits(flash_fwd.fwd_need(c, d, es, fake), fake)
        small = flash_fwd.small_q_config(d, es, fake)
        _fits(flash_fwd.fwd_need((small["BLOCK_M"], small["BLOCK_N"], small["num_warps"], small["num_stages"]),
                                 d, es, fake), fake)
        p = flash_persistent.persistent_config(d, es, fake)
        _fits(_device.Need(_device.smem_forward(p["BLOCK_M"], p["BLOCK_N"], p["num_stages"], d, es, fake),
                           p["num_warps"]), fake)


@pytest.mark.parametrize("es", [2, 4])
def test_backward_configs_fit(fake, es):
    tables = [(flash_bwd.DKDV_CONFIGS, flash_bwd.DKDV_FALLBACK),
              (flash_bwd.DQ_CONFIGS, flash_bwd.DQ_FALLBACK)]
    for table, fallback in tables:
        for d in HEAD_DIMS:
            chosen = flash_bwd.bwd_configs_for(table, fallback, d, es, fake)
            assert chosen
            for c in chosen:
                _fits(flash_bwd.bwd_need(c, d, es, fake), fake)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_decode_configs_fit(fake, dtype):
    for d in HEAD_DIMS:
        for group in (1, 4, 8, 32):
            for paged, splits in ((False, None), (False, 1), (True, None), (True, 1), (True, 8)):
                cfg = decode.launch_config(dtype, paged, splits, d, fake, group)
                _fits(decode.decode_need(cfg, d, dtype.itemsize, fake, group), fake)
                assert cfg["block_n"] >= 16 and triton.next_power_of_2(cfg["block_n"]) == cfg["block_n"]


def test_softmax_launches_fit(fake):
    for n_rows in (1, 3, 100, 4096):
        for n_cols in (1, 37, 1000, 4096, 32768, 32769, 100_000):
            online, block_r, block_c, warps = fused_softmax.launch_params(n_rows, n_cols)
            _fits(_device.Need(_device.smem_softmax(block_r, block_c, warps), warps), fake)


def test_hopper_chooses_what_it_chose_before():
    """On an H100 the new selection keeps the configs of the old fixed 200 KB rule (and the tuned fixed ones)."""
    h100 = _device.KNOWN["H100"]

    def old_fwd(d, es, n_q, n_k):
        kept = []
        for bm, bn, w, s in flash_fwd.FWD_CONFIGS:
            if (bm * d + 2 * max(s - 1, 1) * bn * d) * es > 200 * 1024:
                continue
            if bm > max(64, triton.next_power_of_2(n_q)) or bn > max(32, triton.next_power_of_2(n_k)):
                continue
            if d >= 128 and bn == 128 and w < 8:
                continue
            kept.append((bm, bn, w, s))
        return kept or flash_fwd.FWD_CONFIGS[-1:]

    def old_bwd(table, d, es):
        kept = [c for c in table if (c[0] + c[1]) * d * es * 2 * max(c[3] - 1, 1) <= 200 * 1024
                and not (d >= 128 and c[1] * d > 8192 and c[2] < 8)]
        return kept or table[-1:]

    for es in (2, 4):
        for d in HEAD_DIMS:
            for n_q, n_k in SHAPES:
                assert flash_fwd.fwd_configs_for(d, es, n_q, n_k, h100) == old_fwd(d, es, n_q, n_k)
            for table, fb in ((flash_bwd.DKDV_CONFIGS, flash_bwd.DKDV_FALLBACK),
                              (flash_bwd.DQ_CONFIGS, flash_bwd.DQ_FALLBACK)):
                assert flash_bwd.bwd_configs_for(table, fb, d, es, h100) == old_bwd(table, d, es)
    for d in HEAD_DIMS:
        assert flash_fwd.small_q_config(d, 2, h100) == flash_fwd.SMALL_Q_CONFIG
        assert flash_persistent.persistent_config(d, 2, h100) == flash_persistent.CONFIG
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for paged, splits in ((False, None), (True, None), (True, 1)):
                assert decode.launch_config(dtype, paged, splits, d, h100, 8) == \
                    decode.base_config(dtype, paged, splits).launch()


def test_small_gpus_get_smaller_tiles():
    """The fallbacks are really used: fp32 at d = 128 leaves the tuned forward list on a T4 and an sm_86."""
    assert flash_fwd.fwd_configs_for(128, 4, 4096, 4096, T4)[0] in flash_fwd.FWD_FALLBACK
    assert flash_fwd.fwd_configs_for(128, 4, 4096, 4096, SM86)[0] in flash_fwd.FWD_FALLBACK
    assert decode.launch_config(torch.bfloat16, False, None, 128, SM86)["num_stages"] < \
        decode.base_config(torch.bfloat16).num_stages
    # below sm_80 there is no software pipelining: num_stages costs no shared memory
    assert _device.smem_forward(64, 64, 3, 128, 2, T4) == _device.smem_forward(64, 64, 1, 128, 2, T4)


# the tiles the assignment solutions hard-code (num_stages: Triton's default 3), at the head dimensions and
# element sizes their GPU tests use (bf16 runs as fp16 on a T4, the same size)
SOLUTION_TILES = [
    ("a3_triton/a3_triton_solution.py", "BLOCK_M, BLOCK_N = 64, 64", _device.smem_forward, [(128, 2), (64, 4)]),
    ("a3b_triton_backward/a3b_triton_backward_solution.py", "BLOCK_M, BLOCK_N = 64, 64", _device.smem_backward,
     [(64, 2), (32, 4)]),
    ("a4_decoding/a4_decoding_solution.py", "BLOCK_N = 64", None, [(128, 2), (32, 4)]),
    ("a5_paged/a5_paged_solution.py", "BLOCK_N = 64", None, [(128, 2), (32, 4)]),
]


@pytest.mark.parametrize("path, literal, smem, dims", SOLUTION_TILES, ids=[s[0].split("/")[0] for s in SOLUTION_TILES])
def test_solution_tiles_fit(fake, path, literal, smem, dims):
    src = (REPO / "assignments" / path).read_text()
    assert literal in src
    assert not re.search(r"num_stages\s*=\s*[4-9]", src.split("given=\"fp8_helpers\"")[0])
    for d, es in dims:
        need = (_device.smem_decode(64, 3, d, es, fake) if smem is None else smem(64, 64, 3, d, es, fake))
        _fits(_device.Need(need, 4), fake)


# --------------------------------------------------------------------------------------- Hopper-only paths
def test_hopper_only_paths_not_taken_below_sm90(fake, monkeypatch):
    monkeypatch.setattr(_device, "device_limits", lambda device=None: fake)
    monkeypatch.setattr(flash_fwd, "INTERPRET", False)
    q = torch.zeros(1, 1, 64, 64, dtype=torch.float16)  # contiguous, 16-byte aligned: TMA-able on Hopper
    is_hopper = fake.capability >= (9, 0)
    assert flash_fwd.tma_ok(None, q, q, q, q) == is_hopper
    assert flash_bwd._use_tma(None, q, q, q, q) == is_hopper
    assert not flash_fwd.tma_ok(False, q, q, q, q)
    assert _checks.gluon_supported(fake) == (fake.capability == (9, 0))
    monkeypatch.setattr(flash_fp8, "INTERPRET", False)
    if is_hopper:
        flash_fp8.check_fp8_device(torch.device("cuda", 0))
    else:
        with pytest.raises(RuntimeError, match=r"compute capability >= 9\.0"):
            flash_fp8.check_fp8_device(torch.device("cuda", 0))


def test_gluon_refuses_other_generations():
    for cap in ((7, 5), (8, 0), (8, 9), (10, 0), (12, 0)):
        assert not _checks.gluon_supported(_device.DeviceLimits(cap, 228 * 1024))


# ------------------------------------------------------------------------------------------------ bfloat16
def _cuda_stub(dtype):
    return types.SimpleNamespace(dtype=dtype, device=torch.device("cuda", 0))


def test_reference_bf16_on_sm75_is_a_clear_type_error(fake):
    if fake.capability >= (8, 0):
        _device.check_bf16(_cuda_stub(torch.bfloat16), "q")
        return
    with pytest.raises(TypeError, match=r"q is torch\.bfloat16.*sm_80.*Tesla T4 \(sm_75.*float16"):
        _device.check_bf16(_cuda_stub(torch.bfloat16), "q")
    _device.check_bf16(_cuda_stub(torch.float16), "q")       # float16 is fine on a T4
    _device.check_bf16(torch.zeros(2, dtype=torch.bfloat16), "q")  # CPU (interpreter): fine


def test_grader_bf16_fallback_decision():
    cases = [dict(dtype="bfloat16", d=64, gpu=True), dict(dtype="float32", d=16), dict(shape=(3, 4))]
    out, note = engine.bf16_fallback(cases, (7, 5, "Tesla T4"))
    assert [c.get("dtype") for c in out] == ["float16", "float32", None]
    assert out[0]["d"] == 64 and out[0]["gpu"] and cases[0]["dtype"] == "bfloat16"  # a copy; the rest kept
    assert "1 bfloat16 case(s) run as float16" in note and "Tesla T4 is sm_75" in note
    for cap in ((8, 0, "A100"), (8, 6, "A10"), (9, 0, "H100"), None):
        assert engine.bf16_fallback(cases, cap) == (cases, "")
    assert engine.bf16_fallback(cases[1:], (7, 5, "Tesla T4")) == (cases[1:], "")


def _gpu_tests(spec):
    return [t for t in spec.tests if t.gpu_only or t.min_capability
            or any(p.get("gpu") for p in t.hidden_cases(np.random.default_rng(0)))]


@pytest.mark.parametrize("cap", [(7, 5, "Tesla T4"), (8, 6, "NVIDIA A10"), (9, 0, "NVIDIA H100")],
                         ids=["sm_75", "sm_86", "sm_90"])
@pytest.mark.parametrize("aid", ["a3_triton", "a3b_triton_backward", "a4_decoding", "a5_paged", "a7_gluon"])
def test_every_gpu_test_runs_or_says_why(monkeypatch, aid, cap):
    """Every GPU-only test and every test with GPU cases runs on any GPU from sm_75 up, except the Hopper-only
    parts (a3's FP8 part, a7's Gluon kernel), which are "not run" below sm_90 with the reason; on sm_75 no
    bfloat16 case remains."""
    monkeypatch.setattr(engine, "gpu_capability", lambda: cap)
    g = engine.Grader(aid, device="cuda", seed=1)
    gpu_tests = _gpu_tests(g.spec)
    assert gpu_tests
    for t in gpu_tests:
        why = g.not_run_here(t)
        hopper_only = t.min_capability == (9, 0)
        assert hopper_only == ("fp8" in t.task or aid == "a7_gluon"), t.name
        if hopper_only and cap[:2] < (9, 0):
            assert why and "Hopper" in why and cap[2] in why, t.name
            continue
        assert why is None, t.name
        dtypes = {p.get("dtype") for p in g.cases_for(t)}
        if cap[:2] < (8, 0):
            assert "bfloat16" not in dtypes, t.name
            if t.name in g.case_notes:
                assert "run as float16" in g.case_notes[t.name]
        elif any(p.get("dtype") == "bfloat16" for p in t.hidden_cases(np.random.default_rng(1))):
            assert "bfloat16" in dtypes, t.name


def test_every_spec_with_gpu_tests_is_covered():
    covered = {"a3_triton", "a3b_triton_backward", "a4_decoding", "a5_paged", "a7_gluon"}
    for aid in specs_mod.ASSIGNMENTS:
        if _gpu_tests(specs_mod.load(aid)):
            assert aid in covered, aid
