"""The FP8 Gluon forward (``reference.triton.hopper.flash_fp8_gluon``): warp-specialised ping-pong on e4m3.

CPU (CI): the kernel is compiled for sm_90a in a child process in compile-only mode (FP8 wgmma = ``QGMMA`` in
the SASS, TMA loads, ``setmaxnreg``, registers, spills, shared memory within a Hopper CTA's 227 KiB); the key
renumbering that lets P stay in registers is checked in torch (it must leave ``P V`` unchanged and match the
kernel's reshape/permute); bad input is named. On an H100/H200 the outputs are compared with a float64 oracle
fed the dequantised inputs, with the Triton FP8 tests' bounds (``tests/test_triton_hopper.py``: o 6e-2, lse per
row ``oracle.fp8_lse_bound``), and the entry point with exact attention (o 0.1, lse 0.05);
``benchmarks/course/bench_fp8_gluon.py`` checks again at scale before timing.
"""
import json

import pytest
import torch

from reference.triton import DEVICE
from reference.triton.hopper import flash_fp8_gluon as fg
from reference.triton.hopper.flash_fp8 import flash_attention_forward_fp8, prepare_fp8, quantize_fp8_blocks
from reference.triton.configs import HOPPER_SMEM, Fp8GluonConfig, GluonForwardConfig
from tests import sm90_compile
from tests.oracle import FP8_MMA_BITS, attention_ref, fp8_lse_violation, lse_err, rel_err

pytestmark = pytest.mark.triton_gluon
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
O_TOL_FP8 = 6e-2  # tests/test_triton_hopper.py, GPU (P rounded to e4m3); lse: oracle.fp8_lse_bound per row


def lse_violation(lse, rl, x, causal, d):
    """``oracle.fp8_lse_violation`` of the kernel's lse against float64 on the dequantised inputs (< 1: within)."""
    return fp8_lse_violation(lse, rl, x.q.dequantize(), x.k.dequantize(), causal, d ** -0.5, FP8_MMA_BITS)


def t(rng, *shape, dtype=torch.bfloat16, spread=1.0):
    return torch.tensor(rng.standard_normal(shape) * spread + rng.uniform(-0.5, 0.5), dtype=dtype, device=DEVICE)


# ---------------------------------------------------------------- compile for sm_90a (CPU)
@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("--causal",), ("--d", "64", "--causal")])
def test_compiles_for_hopper(args):
    usage = _pv_waits(*args)  # the same compile as test_pin_hoists_the_pv_wait_above_the_exps' (the waits added)
    assert usage["QGMMA"] > 0 and usage["HGMMA"] == 0 and usage["HMMA"] == 0, usage  # FP8 wgmma only
    assert usage["UTMALDG"] > 0 and usage["USETMAXREG"] > 0 and usage["registers"] == 168, usage
    assert usage["shared_bytes"] <= HOPPER_SMEM, usage
    if "--causal" not in args or "64" in args:
        assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, usage
    else:  # d = 128 causal: a few values spill around each tile's epilogue, as in the bf16 kernel (notes/hopper.md)
        assert usage["stack"] <= 64, usage


def _pv_waits(*args):
    out = sm90_compile.run(["-m", "reference.triton.hopper.aot_report", "fp8g", "--waits", *args], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def pv_wait_after_exps(loop) -> bool:
    """FA3 Algorithm 2's overlap in the SASS of one key loop: all 64 exps of a consumer's 64 x 128 score tile (64
    per thread) sit between the wait for ``S_j`` and the wait for ``P_{j-1} V_{j-1}``."""
    return loop["pv_wait"] is not None and loop["exps_before_pv_wait"] >= 64 and loop["first_exp"] < loop["pv_wait"]


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("--causal",), ("--d", "64", "--causal")])
def test_peeled_keeps_the_pv_wait_after_the_exps(args):
    """``schedule["peeled"]``: two key loops per consumer (unmasked, masked), no branch in either body. Each
    unmasked loop (the bulk of the blocks) keeps the ``P V`` wait after the 64 exps; so does each masked loop
    except at d = 128 causal, where ptxas still hoists it there (1-2 diagonal blocks per tile); no spill in a
    key loop (d = 128 causal spills per tile as the default schedule does: stack <= 64 B)."""
    usage = _pv_waits("--peeled", *args)
    loops = usage["pv_waits"]
    assert len(loops) == 4, loops  # 2 consumers x (unmasked, masked)
    assert pv_wait_after_exps(loops[0]) and pv_wait_after_exps(loops[2]), loops
    if args != ("--causal",):
        assert all(pv_wait_after_exps(w) for w in loops), loops
        assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, usage
    else:
        assert usage["stack"] <= 64, usage
    assert usage["registers"] == 168 and usage["QGMMA"] > 0 and usage["HGMMA"] == 0, usage


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("--causal",), ("--d", "64", "--causal")])
def test_fence_keeps_the_pv_wait_after_the_exps(args):
    """``schedule["fence"]``: K slot ``j`` freed after the softmax inside an always-taken branch, which ends the
    softmax's basic block: every consumer's key loop keeps the ``P V`` wait after the 64 exps, the d = 128 causal
    one included (where ``peeled`` leaves it hoisted in the masked loop); 168 registers, the spills of the default schedule only
    (d = 128 causal, per tile)."""
    usage = _pv_waits("--fence", *args)
    loops = usage["pv_waits"]
    assert len(loops) == 2 and all(pv_wait_after_exps(w) for w in loops), loops
    assert usage["registers"] == 168 and usage["QGMMA"] > 0 and usage["HGMMA"] == 0, usage
    if args == ("--causal",):
        assert usage["stack"] <= 64, usage
    else:
        assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, usage


@pytest.mark.slow
def test_pin_hoists_the_pv_wait_above_the_exps():
    """Why ``peeled`` exists: with the mask's run-time branch in the loop body (the default schedule), ptxas hoists the
    ``P_{j-1} V_{j-1}`` wait to the top of the softmax's basic block, above every exp, in both consumers' loops
    (the check above fails on it). If a newer ptxas stops doing this, this test says so."""
    loops = _pv_waits()["pv_waits"]
    assert len(loops) == 2 and not any(pv_wait_after_exps(w) for w in loops), loops
    assert all(w["exps_before_pv_wait"] == 0 for w in loops), loops


_KEY_LOOP_SASS = """
import json, sys
from reference.triton.hopper.flash_fp8_gluon import compile_fp8_gluon
from reference.triton.hopper._aot import resource_usage, sass_text
d, causal, sched = int(sys.argv[1]), sys.argv[2] == "1", json.loads(sys.argv[3])
c = compile_fp8_gluon(d, causal, schedule=sched)
print(json.dumps({"usage": resource_usage(c), "sass": sass_text(c)}))
"""


def _compile_sass(d, causal, schedule):
    out = sm90_compile.run(["-c", _KEY_LOOP_SASS, str(d), str(int(causal)), json.dumps(schedule)], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def key_loop_bar_syncs(sass: str) -> list:
    """``BAR.SYNC`` instructions per key loop in ``cuobjdump -sass`` text: for each wait for ``S_j`` alone
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``, one per key-loop body), the loop around it is the first backward branch
    after it (``BRA`` to an address before the wait); counted from the branch's target to the branch."""
    import re
    ins = [(int(a, 16), op, rest) for a, op, rest in
           re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)]
    out = []
    for i, (addr, op, rest) in enumerate(ins):
        if op != "WARPGROUP.DEPBAR.LE" or not rest.strip().endswith("0x1"):
            continue
        for a, o, r in ins[i + 1:]:
            target = re.match(r"\s*(0x[0-9a-f]+)", r) if o == "BRA" else None
            if target and int(target.group(1), 16) < addr:
                lo = int(target.group(1), 16)
                out.append(sum(1 for a2, o2, _ in ins if lo <= a2 <= a and o2.startswith("BAR.SYNC")))
                break
    return out


@pytest.mark.slow
@pytest.mark.parametrize("d, causal", [(128, False), (128, True), (64, True)])
def test_thread_arrive_leaves_one_bar_sync_per_key_loop(d, causal):
    """``schedule["thread_arrive"]``: the K and V slot releases are per-thread arrivals on barriers of their own
    allocation, so the warpgroup ``bar.sync`` before each elected arrive and the one between an arrive and the
    next wait on the same allocation are gone: 1 ``BAR.SYNC`` per key block where the default schedule has 3 (the one left:
    Triton's rule between two mbarrier waits of one allocation, iteration to iteration). No new spill."""
    pin = _compile_sass(d, causal, {"turns": False, "merged": False})
    ta = _compile_sass(d, causal, {"turns": False, "merged": False, "thread_arrive": True})
    assert key_loop_bar_syncs(pin["sass"]) == [3, 3], key_loop_bar_syncs(pin["sass"])
    assert key_loop_bar_syncs(ta["sass"]) == [1, 1], key_loop_bar_syncs(ta["sass"])
    assert "ARRIVES.LDGSTSBAR.64.ARVCNT" in ta["sass"]  # cp.async.mbarrier.arrive.noinc, every thread
    assert ta["usage"]["LDL"] <= pin["usage"]["LDL"] and ta["usage"]["QGMMA"] == pin["usage"]["QGMMA"], ta["usage"]


_DUMP_ONCE = """
import json, subprocess
from reference.triton.hopper import _aot
from reference.triton.hopper.flash_fp8_gluon import compile_fp8_gluon
c = compile_fp8_gluon(64, True, schedule={"turns": False, "merged": False})
_aot._DUMPS.clear()
runs, real = [], subprocess.run
def counting(cmd, **kw):
    runs.append(cmd[1])
    return real(cmd, **kw)
subprocess.run = counting
try:
    usage, sass = _aot.resource_usage(c), _aot.sass_text(c)
    again = _aot.sass_text(c) == sass and _aot.resource_usage(c) == usage
finally:
    subprocess.run = real
print(json.dumps({"runs": runs, "again": again, "opcodes": usage["QGMMA"]}))
"""


@pytest.mark.slow
def test_a_kernels_sass_is_disassembled_once():
    """``resource_usage`` and ``sass_text`` of one compiled kernel share one ``cuobjdump -sass`` (nvdisasm, seconds
    for this kernel) and one ``--dump-resource-usage``; asked again, they answer the same without a run."""
    out = sm90_compile.run(["-c", _DUMP_ONCE], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(got["runs"]) == ["--dump-resource-usage", "-sass"] and got["again"] and got["opcodes"] > 0, got


# ---------------------------------------------------------------- the key renumbering (torch, CPU)
def test_permute_keys_leaves_p_v_unchanged_and_matches_the_kernel(rng):
    n, d, m = 256, 16, 8
    p = torch.tensor(rng.random((m, n)))
    vt = torch.tensor(rng.standard_normal((d, n)))
    # the kernel's p_operand: reshape [m, n / 32, 2, 2, 4, 2], permute (0, 1, 2, 4, 3, 5), reshape back
    p_perm = p.reshape(m, n // 32, 2, 2, 4, 2).permute(0, 1, 2, 4, 3, 5).reshape(m, n)
    vt_perm = fg.permute_keys(vt)
    assert torch.allclose(p_perm @ vt_perm.T, p @ vt.T)
    assert not torch.equal(vt_perm, vt)
    assert torch.equal(fg.permute_keys(vt_perm, inverse=True), vt)
    # the thread that holds keys 8i + 2t + e (i < 4) of a 32-key chunk in the accumulator holds keys 4t .. 4t+3
    # and 16 + 4t .. 16 + 4t + 3 of the operand
    idx = torch.arange(32.0)[None, :].reshape(1, 1, 2, 2, 4, 2).permute(0, 1, 2, 4, 3, 5).reshape(32)
    for lane in range(4):
        acc_keys = {8 * i + 2 * lane + e for i in range(4) for e in range(2)}
        op_keys = {16 * h + 4 * lane + e for h in range(2) for e in range(4)}
        assert {int(idx[k]) for k in op_keys} == acc_keys
    with pytest.raises(ValueError, match="multiple of 32"):
        fg.permute_keys(vt[:, :40])


def test_permuted_blocks_dequantize_to_v(rng):
    v = torch.tensor(rng.standard_normal((1, 2, 300, 64)), dtype=torch.float32)
    plain = quantize_fp8_blocks(v, 128, transposed=True)
    perm = fg.Fp8KeyPermuted(fg.permute_keys(plain.data), plain.scale, 128, 300, True)
    assert torch.equal(perm.dequantize(), plain.dequantize())


# ---------------------------------------------------------------- bad input
def test_bad_inputs_are_named(rng):
    q = t(rng, 1, 2, 64, 64)
    with pytest.raises(ValueError, match="head dimension"):
        fg.flash_attention_forward_fp8_gluon(t(rng, 1, 2, 8, 32), t(rng, 1, 2, 8, 32), t(rng, 1, 2, 8, 32))
    with pytest.raises(TypeError, match="q must have dtype float16, bfloat16 or float32"):
        qi = torch.ones(1, 2, 8, 64, dtype=torch.int32, device=DEVICE)
        fg.flash_attention_forward_fp8_gluon(qi, qi, qi)
    with pytest.raises((TypeError, ValueError), match="Hkv|head"):
        fg.flash_attention_forward_fp8_gluon(t(rng, 1, 3, 8, 64), q, q)
    with pytest.raises(ValueError, match="block_m = 128"):
        fg.flash_attention_forward_fp8_gluon(q, q, q, config=Fp8GluonConfig(block_m=64))
    with pytest.raises(ValueError, match="num_stages in 2..4"):
        fg.flash_attention_forward_fp8_gluon(q, q, q, config=Fp8GluonConfig(num_stages=5))
    with pytest.raises(TypeError, match=r"config must be a reference\.triton\.configs\.Fp8GluonConfig or None"):
        fg.flash_attention_forward_fp8_gluon(q, q, q, config=(128, 128, 3, 4))  # the tuple form is refused
    with pytest.raises(TypeError, match="Fp8GluonConfig or None"):
        fg.flash_attention_forward_fp8_gluon(q, q, q, config=GluonForwardConfig())  # the bf16 kernel's tile
    with pytest.raises(ValueError, match="shared memory"):
        fg.check_fp8_gluon_config(Fp8GluonConfig(num_stages=4), head_dim=256)
    with pytest.raises(TypeError, match="Fp8Inputs"):
        fg.attention_fp8_gluon((q, q, q))


@pytest.mark.skipif(HOPPER, reason="checks the error raised where no Hopper GPU is present")
def test_needs_a_hopper_gpu(rng):
    q = t(rng, 1, 2, 64, 64)
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        fg.flash_attention_forward_fp8_gluon(q, q, q)


def test_bad_schedule_is_named():
    with pytest.raises(ValueError, match="schedule must be a dict"):
        fg.check_schedule({"turns": True})
    with pytest.raises((TypeError, ValueError), match="merged"):
        fg.check_schedule({"turns": True, "merged": "no"})
    with pytest.raises(ValueError, match="split"):
        fg.check_schedule({"turns": True, "merged": False, "split": 3})
    with pytest.raises((TypeError, ValueError), match="peeled"):
        fg.check_schedule({"turns": True, "merged": False, "peeled": "yes"})
    with pytest.raises(ValueError, match="schedule must be a dict"):
        fg.check_schedule({"turns": True, "merged": False, "peel": True})
    with pytest.raises((TypeError, ValueError), match="fence"):
        fg.check_schedule({"turns": True, "merged": False, "fence": 1})
    with pytest.raises(ValueError, match="fence.*merged"):
        fg.check_schedule({"turns": False, "merged": True, "fence": True})
    with pytest.raises((TypeError, ValueError), match="thread_arrive"):
        fg.check_schedule({"turns": False, "merged": False, "thread_arrive": "yes"})
    with pytest.raises(ValueError, match="schedule must be a dict"):  # measured, not pinned, gone from the kernel
        fg.check_schedule({"turns": False, "merged": False, "prefetch": True})
    assert fg.check_schedule({"turns": True, "merged": False}) == {"turns": True, "merged": False, "split": 1,
                                                                   "peeled": False, "fence": False,
                                                                   "thread_arrive": False}


def test_schedule_options_reach_the_kernel_as_constexprs():
    """``thread_arrive`` becomes the kernel's ``THREAD_ARRIVE`` (off by default)."""
    from reference.triton.configs import FP8_GLUON_CONFIG, FP8_GLUON_SCHEDULE
    pin = fg.fp8_gluon_constexprs(128, FP8_GLUON_CONFIG, False)
    assert pin["THREAD_ARRIVE"] is False and "PREFETCH" not in pin
    assert not FP8_GLUON_SCHEDULE.get("thread_arrive", False)
    cx = fg.fp8_gluon_constexprs(128, FP8_GLUON_CONFIG, True,
                                 schedule={"turns": False, "merged": False, "thread_arrive": True})
    assert cx["THREAD_ARRIVE"] is True and cx["CAUSAL"] is True


def test_config_pin_fits_and_passes_the_check():
    from reference.triton.configs import FP8_GLUON_CONFIG
    assert fg.check_fp8_gluon_config(None) is FP8_GLUON_CONFIG
    for d in fg.FP8_GLUON_HEAD_DIMS:
        assert FP8_GLUON_CONFIG.fits(d) and FP8_GLUON_CONFIG.shared_bytes(d) + 1024 <= HOPPER_SMEM
    # e4m3 tiles: half the bf16 tiles' bytes at the same shape
    assert Fp8GluonConfig(num_stages=2).shared_bytes(128) * 2 == GluonForwardConfig().shared_bytes(128)


# ---------------------------------------------------------------- on a Hopper GPU
CASES = [  # (B, Hq, Hkv, Nq, Nk, d, causal)
    (2, 4, 4, 512, 512, 128, False),
    (1, 4, 4, 1000, 1000, 128, True),   # N not a multiple of the 128-row tile
    (2, 8, 2, 333, 333, 128, True),     # GQA
    (1, 2, 2, 300, 1000, 128, True),    # Nq < Nk, bottom-right causal
    (1, 2, 2, 1000, 300, 64, True),     # Nq > Nk: rows that see no key -> o = 0, lse = -inf
    (1, 3, 3, 1, 77, 64, False),        # one query row
    (4, 8, 8, 700, 900, 128, False),    # more tiles than SMs? (several per CTA)
]


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("hadamard", [False, True])
def test_matches_float64_on_dequantised_inputs(rng, case, hadamard):
    B, Hq, Hkv, Nq, Nk, d, causal = case
    q, k = t(rng, B, Hq, Nq, d), t(rng, B, Hkv, Nk, d)
    # V blocks of very different magnitude exercise the per-block V scales folded into P
    v = t(rng, B, Hkv, Nk, d) * torch.tensor(rng.uniform(0.01, 50, (1, 1, Nk, 1)), dtype=torch.bfloat16,
                                             device=DEVICE)
    x = fg.prepare_fp8_gluon(q, k, v, causal=causal, hadamard=hadamard, seed=int(rng.integers(1000)))
    o, lse = fg.attention_fp8_gluon(x, out_dtype=torch.float32)
    ro, rl, _ = attention_ref(x.q.dequantize(), x.k.dequantize(), x.v.dequantize(), causal=causal, scale=d ** -0.5)
    assert o.shape == (B, Hq, Nq, d) and lse.shape == (B, Hq, Nq)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ro) < O_TOL_FP8, rel_err(o, ro)
    assert lse_violation(lse, rl, x, causal, d) < 1, lse_violation(lse, rl, x, causal, d)
    assert torch.all(o.cpu()[torch.isinf(rl)] == 0)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
def test_entry_point_close_to_exact_attention_and_to_the_triton_fp8_kernel(rng):
    q, k, v = t(rng, 2, 4, 700, 128), t(rng, 2, 4, 700, 128), t(rng, 2, 4, 700, 128)
    for causal in (False, True):
        for had in (False, True):
            o, lse = fg.flash_attention_forward_fp8_gluon(q, k, v, causal=causal, hadamard=had, seed=3)
            ro, rl, _ = attention_ref(q, k, v, causal=causal)
            assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
            assert rel_err(o, ro) < 0.1 and lse_err(lse, rl) < 0.05
            # the same quantisation as the Triton FP8 kernel: the two differ by accumulation order only
            o2, lse2 = flash_attention_forward_fp8(q, k, v, causal=causal, hadamard=had, seed=3)
            assert rel_err(o, o2) < 1e-2 and lse_err(lse, lse2) < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
def test_plain_layout_conversion_agrees(rng):
    """Without the key renumbering (``prepare_fp8``'s V^T) P goes through ``convert_layout``: same output."""
    q, k, v = t(rng, 1, 4, 600, 128), t(rng, 1, 4, 600, 128), t(rng, 1, 4, 600, 128)
    a = fg.attention_fp8_gluon(fg.prepare_fp8_gluon(q, k, v, causal=True))
    b = fg.attention_fp8_gluon(prepare_fp8(q, k, v, causal=True, block_m=64, block_n=128))
    assert rel_err(a[0], b[0]) < 1e-3 and lse_err(a[1], b[1]) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("turns, merged, split, peeled, fence", [
    (True, True, 1, False, False), (False, False, 1, False, False), (False, True, 1, False, False),
    (True, False, 4, False, False), (False, False, 8, False, False), (False, False, 1, True, False),
    (True, False, 4, True, False), (False, False, 1, False, True), (True, False, 1, True, True)])
def test_schedule_options_agree(rng, turns, merged, split, peeled, fence):
    """Without ping-pong turns, with one release per ring slot, with the peeled key loop, with the K release after
    the softmax (fence): the same roundings in the same order; the row reductions split into chains: the row
    sums added in another order (float rounding only)."""
    q, k, v = t(rng, 2, 4, 900, 128), t(rng, 2, 4, 900, 128), t(rng, 2, 4, 900, 128)
    for causal in (False, True):
        x = fg.prepare_fp8_gluon(q, k, v, causal=causal)
        a = fg.attention_fp8_gluon(x)
        b = fg.attention_fp8_gluon(x, schedule={"turns": turns, "merged": merged, "split": split,
                                                "peeled": peeled, "fence": fence})
        assert rel_err(a[0], b[0]) < 1e-3 and lse_err(a[1], b[1]) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("option", ["peeled", "fence", "thread_arrive"])
def test_key_loop_options_match_float64_on_dequantised_inputs(rng, case, option):
    """``schedule["peeled"]``, ``["fence"]`` and ``["thread_arrive"]`` on every shape of ``CASES``
    (no masked block, several, none unmasked: Nq > Nk rows that see no key, one query row, a single key block):
    the float64 oracle on the dequantised inputs, the default schedule's bounds."""
    B, Hq, Hkv, Nq, Nk, d, causal = case
    q, k = t(rng, B, Hq, Nq, d), t(rng, B, Hkv, Nk, d)
    v = t(rng, B, Hkv, Nk, d) * torch.tensor(rng.uniform(0.01, 50, (1, 1, Nk, 1)), dtype=torch.bfloat16,
                                             device=DEVICE)
    x = fg.prepare_fp8_gluon(q, k, v, causal=causal)
    o, lse = fg.attention_fp8_gluon(x, out_dtype=torch.float32,
                                    schedule={"turns": False, "merged": False, **{o: True for o in option.split("+")}})
    ro, rl, _ = attention_ref(x.q.dequantize(), x.k.dequantize(), x.v.dequantize(), causal=causal, scale=d ** -0.5)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ro) < O_TOL_FP8, rel_err(o, ro)
    assert lse_violation(lse, rl, x, causal, d) < 1, lse_violation(lse, rl, x, causal, d)
    assert torch.all(o.cpu()[torch.isinf(rl)] == 0)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("options", ["thread_arrive", "thread_arrive+fence", "thread_arrive+merged"])
def test_thread_arrive_options_agree_with_the_pin(rng, options):
    """The per-thread slot releases change when barriers complete, not what is computed: the same roundings in the
    same order as the default schedule, causal and not, with more tiles than a CTA takes at once (several tiles
    per persistent CTA: the barrier phases carry over)."""
    q, k, v = t(rng, 4, 8, 900, 128), t(rng, 4, 8, 900, 128), t(rng, 4, 8, 900, 128)
    for causal in (False, True):
        x = fg.prepare_fp8_gluon(q, k, v, causal=causal)
        a = fg.attention_fp8_gluon(x)
        b = fg.attention_fp8_gluon(x, schedule={"turns": False, "merged": False,
                                                **{o: True for o in options.split("+")}})
        assert rel_err(a[0], b[0]) < 1e-3 and lse_err(a[1], b[1]) < 1e-4
