"""The Gluon FA3-style forward (``reference.triton.hopper.flash_gluon``) and its ablation schedules
(``experiments.gluon_schedules``, built from the same pieces).

The Triton interpreter cannot run Gluon, so on CPU (CI) the kernels are compiled for sm_90a ahead of time in a
child process in compile-only mode (``TRITON_INTERPRET=0``): that checks they build, use Hopper's wgmma (HGMMA,
no HMMA), TMA loads and ``setmaxnreg``, and do not spill. The input checks run everywhere. On an H100/H200 the
outputs are compared with a float64 oracle (``benchmarks/course/bench_gluon.py`` does the same at scale and times it).
"""
import json

import pytest
import torch

from reference.triton import DEVICE
from experiments import gluon_schedules
from reference.triton.hopper.flash_gluon import flash_attention_forward_gluon
from tests import sm90_compile
from tests.oracle import attention_ref, lse_err, rel_err

pytestmark = pytest.mark.triton_gluon
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _aot(module: str, *args) -> dict:
    out = sm90_compile.run(["-m", module, *args], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("module, args", [
    ("reference.triton.hopper.aot_report", ("fwd", "--waits")),  # the production kernel (persistent ping-pong;
    # the same compile as test_fence_keeps_the_pv_wait_after_the_exps[args3])
    ("experiments.gluon_schedules", ("pingpong", "--causal", "--one-cta-per-tile")),
    ("experiments.gluon_schedules", ("overlap", "--d", "64"))])
def test_compiles_for_hopper_without_spills(module, args):
    usage = _aot(module, *args)
    assert usage["HGMMA"] > 0 and usage["HMMA"] == 0, usage  # Hopper's wgmma, not the older mma.sync
    assert usage["UTMALDG"] > 0, usage  # tiles arrive by TMA
    assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, usage  # no register spills
    assert usage["registers"] <= 255
    if args[0] != "overlap":  # warp specialisation: register budgets moved between partitions
        assert usage["USETMAXREG"] > 0 and usage["registers"] == 168, usage


def _pv_waits(*args) -> list:
    """Exps before the P V wait in each key loop of the production kernel's sm_90a SASS (``_aot.wgmma_wait_order``)."""
    usage = _aot("reference.triton.hopper.aot_report", "fwd", "--waits", *args)
    assert usage["HGMMA"] > 0 and usage["registers"] == 168, usage
    return [w["exps_before_pv_wait"] for w in usage["pv_waits"]]


@pytest.mark.slow
@pytest.mark.parametrize("args", [("--fence",), ("--fence", "--causal"), ("--fence", "--peeled", "--d", "64",
                                                                          "--causal"), ()])
def test_fence_keeps_the_pv_wait_after_the_exps(args):
    """``key_loop={"fence": True}`` (the K release after the softmax, in a branch that is always taken; the default at
    d = 128, the last case): in every key loop of both consumers all 64 exps of the softmax (and the two of
    ``alpha``) come before the wait for ``P_{j-1} V_{j-1}``, FA3 Algorithm 2's overlap; with ``peeled`` there are
    two loops per consumer."""
    waits = _pv_waits(*args)
    assert len(waits) == (4 if "--peeled" in args else 2), waits
    assert all(n >= 64 for n in waits), waits


@pytest.mark.slow
def test_options_off_and_peeled_alone_hoist_the_pv_wait():
    """Why ``fence`` exists: with the mask's run-time branch (the plain loop, both options off) ptxas puts the
    ``P V`` wait at the top of the block after it, above every exp; the peeled loops alone (no branch) leave it
    above them in the unmasked loop too. The check of the test above fails on both."""
    assert _pv_waits("--no-peeled") == [0, 0]
    assert _pv_waits("--peeled")[::2] == [0, 0]  # the unmasked loop of each consumer


def test_compile_only_mode_is_refused_under_the_interpreter(monkeypatch):
    from reference.triton.hopper._aot import compile_gluon
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        compile_gluon(None, {}, {}, 4)


def _qkv(rng, B, Hq, Hkv, Nq, Nk, d, dtype=torch.bfloat16):
    def t(*shape):
        return torch.tensor(rng.standard_normal(shape), dtype=dtype, device=DEVICE)
    return t(B, Hq, Nq, d), t(B, Hkv, Nk, d), t(B, Hkv, Nk, d)


def test_bad_inputs_are_named(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 64)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        flash_attention_forward_gluon(q.float(), k.float(), v.float())
    q32, k32, v32 = _qkv(rng, 1, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError, match="head dimension"):
        flash_attention_forward_gluon(q32, k32, v32)
    with pytest.raises((TypeError, ValueError), match="causal"):
        flash_attention_forward_gluon(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="schedule"):
        gluon_schedules.forward(q, k, v, schedule="fast")
    with pytest.raises(ValueError, match="persistent=True needs a warp-specialised schedule"):
        gluon_schedules.forward(q, k, v, schedule="overlap", persistent=True)
    q3, k3, v3 = _qkv(rng, 1, 3, 2, 8, 8, 64)
    with pytest.raises(ValueError, match="Hkv"):
        flash_attention_forward_gluon(q3, k3, v3)


@pytest.mark.skipif(HOPPER, reason="checks the error raised where no Hopper GPU is present")
def test_needs_a_hopper_gpu(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 64)
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        flash_attention_forward_gluon(q, k, v)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("schedule", ["pingpong", "specialized", "overlap", "pingpong+persistent",
                                      "pingpong+persistent+off", "pingpong+persistent+fence",
                                      "pingpong+persistent+peeled+fence", "pingpong+persistent+peeled"])
@pytest.mark.parametrize("B, Hq, Hkv, Nq, Nk, d, causal", [
    (2, 4, 4, 256, 256, 128, False), (1, 4, 4, 1000, 1000, 128, True), (2, 8, 2, 333, 333, 128, True),
    (1, 2, 2, 300, 1000, 128, True), (1, 2, 2, 1000, 300, 64, True), (1, 3, 3, 1, 77, 64, False),
    (1, 2, 1, 517, 260, 64, False)])
def test_matches_float64(rng, schedule, B, Hq, Hkv, Nq, Nk, d, causal):
    q, k, v = _qkv(rng, B, Hq, Hkv, Nq, Nk, d)
    schedule, _, mode = schedule.partition("+")
    if schedule == "pingpong" and mode.startswith("persistent"):  # the production kernel, through the public name
        opts = mode.split("+")[1:]  # its key-loop options (flash_gluon.attend_overlapped; "off": none), else the default
        loop = {"peeled": "peeled" in opts, "fence": "fence" in opts} if opts else None
        o, lse = flash_attention_forward_gluon(q, k, v, causal=causal, key_loop=loop)
    else:  # an ablation (experiments/gluon_schedules.py)
        o, lse = gluon_schedules.forward(q, k, v, causal=causal, schedule=schedule, persistent=mode == "persistent")
    ro, rl, _ = attention_ref(q, k, v, causal=causal)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.shape == (B, Hq, Nq)
    assert rel_err(o, ro) < 1e-2  # bf16 output rounding: about 2e-3 measured
    assert lse_err(lse, rl) < 1e-4  # -inf rows (causal, Nq > Nk) must match exactly
    empty = ~torch.isfinite(rl.to(lse.device))
    assert bool((o[empty] == 0).all())


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
def test_float16_and_strided_inputs(rng):
    q, k, v = _qkv(rng, 1, 4, 4, 512, 512, 128, dtype=torch.float16)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, d) memory, viewed as (B, H, N, d)
    o, lse = flash_attention_forward_gluon(qt, k, v, causal=True)
    ro, rl, _ = attention_ref(q, k, v, causal=True)
    assert rel_err(o, ro) < 2e-3 and lse_err(lse, rl) < 1e-4


@pytest.mark.parametrize("schedule, fields, match", [
    ("pingpong", dict(block_m=64), "block_m = 128"), ("overlap", dict(num_warps=4), "16 \\* num_warps"),
    ("overlap", dict(block_n=32, num_warps=8), "block_n 64 or 128"),
    ("specialized", dict(num_warps=8), "num_warps = 4"), ("overlap", dict(num_stages=4, num_warps=8), "num_stages")])
def test_bad_config_is_named(rng, schedule, fields, match):
    from reference.triton.configs import GluonForwardConfig
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 128)
    config = GluonForwardConfig(**fields)
    with pytest.raises(ValueError, match=match):
        gluon_schedules.forward(q, k, v, schedule=schedule, config=config, persistent=False)
    if schedule == "pingpong":  # the production kernel checks the same way
        with pytest.raises(ValueError, match=match):
            flash_attention_forward_gluon(q, k, v, config=config)
    with pytest.raises(TypeError, match="GluonForwardConfig or None"):  # the tuple form is refused by name
        gluon_schedules.forward(q, k, v, schedule=schedule, config=config.as_tuple(), persistent=False)


@pytest.mark.parametrize("key_loop, match", [({"peeled": "yes"}, "key_loop\\['peeled'\\]"),
                                             ({"fenced": True}, "key_loop must be a dict"),
                                             ((True, True), "key_loop must be a dict")])
def test_bad_key_loop_is_named(rng, key_loop, match):
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 128)
    with pytest.raises((TypeError, ValueError), match=match):
        flash_attention_forward_gluon(q, k, v, key_loop=key_loop)


def test_default_configs_pass_the_check():
    from reference.triton.configs import GLUON_FORWARD
    from reference.triton.hopper.flash_gluon import check_gluon_config
    assert check_gluon_config(None) is check_gluon_config(GLUON_FORWARD) is GLUON_FORWARD
    for schedule, cfg in gluon_schedules.SCHEDULE_CONFIGS.items():
        assert gluon_schedules.check_config(cfg, schedule) is cfg
    assert gluon_schedules.check_config(None, "overlap").num_warps == 8


@pytest.mark.parametrize("config, error, match", [
    ((128, 128, 2, 4), TypeError,
     r"config must be a reference\.triton\.configs\.GluonForwardConfig or None, got \(128"),
    ("default", TypeError, "GluonForwardConfig or None"),
])
def test_config_must_be_the_dataclass(config, error, match):
    """A tuple (the form before the dataclass) or anything else is refused by name, not read field by field."""
    from reference.triton.hopper.flash_gluon import check_gluon_config
    with pytest.raises(error, match=match):
        check_gluon_config(config)


@pytest.mark.parametrize("fields, match", [
    (dict(block_m=96), "GluonForwardConfig.block_m must be a power of two"),
    (dict(block_n=96), "GluonForwardConfig.block_n must be a power of two"),
    (dict(num_stages=0), "GluonForwardConfig.num_stages must be a positive int"),
    (dict(num_warps=True), "GluonForwardConfig.num_warps must be a positive int"),
])
def test_bad_config_fields_are_named(fields, match):
    from reference.triton.configs import GluonForwardConfig
    with pytest.raises(ValueError, match=match):
        GluonForwardConfig(**fields)


@pytest.mark.parametrize("fields, match", [
    (dict(block_m=64), "block_m = 128 and num_warps = 4"),
    (dict(num_warps=8), "block_m = 128 and num_warps = 4"),
    (dict(block_n=32), "block_n must be 64 or 128"),
    (dict(num_stages=4), "num_stages 2 or 3"),
])
def test_config_the_kernel_cannot_take_is_refused(fields, match):
    from reference.triton.configs import GluonForwardConfig
    from reference.triton.hopper.flash_gluon import check_gluon_config
    with pytest.raises(ValueError, match=match):
        check_gluon_config(GluonForwardConfig(**fields))


def test_shared_memory_check_matches_the_sm90a_compile():
    """``shared_bytes`` (two Q buffers + STAGES K/V slots) is within a few hundred bytes (the barriers) of what the
    sm_90a compile reports for the persistent kernel (``benchmarks/results/sm90a-gluon-aot.json``), and a config
    over the 227 KiB a Hopper CTA may use is refused by name before any launch."""
    import json
    from pathlib import Path
    from reference.triton.configs import GLUON_FORWARD, HOPPER_SMEM, GluonForwardConfig
    from reference.triton.hopper.flash_gluon import check_gluon_config
    aot = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/sm90a-gluon-aot.json").read_text())
    for name in ("pingpong_persistent", "pingpong_persistent_stages3"):
        v = aot["variants"][name]
        cfg = GluonForwardConfig.from_tuple(v["config"]) if v["config"] else GLUON_FORWARD
        assert 0 <= v["shared_bytes"] - cfg.shared_bytes(v["d"]) < 1024, (name, v["shared_bytes"])
    assert aot["variants"]["pingpong_persistent_stages3"]["shared_bytes"] > HOPPER_SMEM
    with pytest.raises(ValueError, match="shared memory"):
        check_gluon_config(GluonForwardConfig(num_stages=3), 128)
    stages3_64 = GluonForwardConfig(block_n=64, num_stages=3)
    assert check_gluon_config(stages3_64, 128) is stages3_64
    assert check_gluon_config(GluonForwardConfig(), 128) == GLUON_FORWARD
