"""reference.simulators.iosim: the seeds' table, Theorem 2's scaling laws, FLOPs against hand formulas, bad input.

Tolerances: HBM GB within 10 % of the seeds' table, the standard/FA HBM ratio within 15 %, the FLOP ratio
within 5 % (the seeds' absolute GFLOPs are not reproducible; see the module docstring), fitted log-log slopes
within 0.15 of the law.
"""
import math

import numpy as np
import pytest

from reference.simulators import iosim
from reference.simulators.iosim import flash_attention_io, flash_block_sizes, matmul_io, standard_attention_io

pytestmark = pytest.mark.iosim

SEEDS = (64, 16, 1024, 64)
KIB = 1024


def _slope(xs, ys):
    return np.polyfit(np.log(xs), np.log(ys), 1)[0]


def test_seeds_table_hbm_and_ratios(capsys):
    out = iosim.seeds_table()
    printed = capsys.readouterr().out
    assert "40.3" in printed and "4.4" in printed and "estimate" in printed
    std, fa = out["standard"], out["flash"]
    assert std["hbm_gb"] == pytest.approx(40.3, rel=0.10)
    assert fa["hbm_gb"] == pytest.approx(4.4, rel=0.10)
    assert std["hbm_gb"] / fa["hbm_gb"] == pytest.approx(40.3 / 4.4, rel=0.15)
    assert fa["matmul_gflops"] / std["matmul_gflops"] == pytest.approx(75.2 / 66.6, rel=0.05)
    # the matmul count the first author gave (flash-attention#741): 825 / 963 GFLOPs
    assert std["matmul_gflops"] == pytest.approx(825, rel=0.01)
    assert fa["matmul_gflops"] == pytest.approx(963, rel=0.01)
    # roofline estimates are lower bounds on the measured runtimes, and the speed-up is in the right range
    assert std["runtime_ms_estimate"] < 41.7 and fa["runtime_ms_estimate"] < 7.3
    assert 4 < std["runtime_ms_estimate"] / fa["runtime_ms_estimate"] < 12


def test_standard_pass_structure_matches_hand_count():
    b, h, n, d = SEEDS
    e = 2
    rep = standard_attention_io(b, h, n, d, dtype="fp16", mask=True, dropout=0.1)
    nn, nd = b * h * n * n, b * h * n * d
    # 18 N x N fp16 passes (the bool dropout mask is 1 byte) + 12 N x d tensors
    assert rep.hbm_bytes == pytest.approx(18 * nn * e + 12 * nd * e)
    fwd = standard_attention_io(b, h, n, d, mask=True, dropout=0.1, backward=False)
    assert fwd.hbm_bytes == pytest.approx(8.5 * nn * e + 4 * nd * e)
    # toggles remove exactly their pass
    plain = standard_attention_io(b, h, n, d, backward=False)
    assert plain.hbm_bytes == pytest.approx(4 * nn * e + 4 * nd * e)  # write S, S->P, read P
    assert standard_attention_io(b, h, n, d, backward=False, softmax=False).hbm_bytes == pytest.approx(
        2 * nn * e + 4 * nd * e)
    assert standard_attention_io(b, h, n, d, causal=True, backward=False).hbm_bytes == pytest.approx(
        plain.hbm_bytes + 2 * nn * e)
    assert standard_attention_io(b, h, n, d, causal=True, mask=False, backward=False).hbm_bytes == \
        pytest.approx(plain.hbm_bytes)
    assert standard_attention_io(b, h, n, d, scale_pass=True, backward=False).hbm_bytes == pytest.approx(
        plain.hbm_bytes + 2 * nn * e)
    assert len(rep.passes) == 11
    assert rep.bytes_read + rep.bytes_written == pytest.approx(rep.hbm_bytes)


@pytest.mark.parametrize("version", ["fa1", "fa2"])
def test_matmul_flops_match_hand_formulas(rng, version):
    b, h = (int(x) for x in rng.integers(1, 5, size=2))
    n = int(rng.integers(1, 3000))
    d = int(rng.choice([16, 32, 64, 128]))
    fwd = 4.0 * b * h * n * n * d  # QK^T and PV, 2 N^2 d each
    assert standard_attention_io(b, h, n, d, backward=False).matmul_flops == pytest.approx(fwd)
    assert standard_attention_io(b, h, n, d).matmul_flops == pytest.approx(3 * fwd)  # bwd = 2x fwd
    fa_f = flash_attention_io(b, h, n, d, version=version, backward=False)
    fa = flash_attention_io(b, h, n, d, version=version)
    assert fa_f.matmul_flops == pytest.approx(fwd)
    assert fa.matmul_flops == pytest.approx(3.5 * fwd)  # bwd = 2.5x fwd (recomputes S)
    assert fa.flops > fa.matmul_flops and fa.elementwise_flops > 0
    # matmul FLOPs do not depend on the dtype (FA1's blocks do, so the per-tile rescaling work may)
    fa32 = flash_attention_io(b, h, n, d, version=version, dtype="fp32")
    assert fa32.matmul_flops == pytest.approx(fa.matmul_flops)


def test_causal_flash_skips_tiles():
    b, h, n, d = 2, 3, 4096, 64
    full = flash_attention_io(b, h, n, d, backward=False, block_q=64, block_k=64)
    causal = flash_attention_io(b, h, n, d, causal=True, backward=False, block_q=64, block_k=64)
    t = n // 64
    # visited tiles: t (t + 1) / 2 of t^2
    assert causal.matmul_flops == pytest.approx(full.matmul_flops * (t + 1) / (2 * t))
    assert causal.hbm_bytes < full.hbm_bytes
    # standard attention is dense whatever the mask
    assert standard_attention_io(b, h, n, d, causal=True).matmul_flops == pytest.approx(
        standard_attention_io(b, h, n, d).matmul_flops)


def test_fa1_blocks_and_hbm_hand_count():
    # Algorithm 1 line 1: B_c = ceil(M / 4d), B_r = min(B_c, d), M in elements
    assert flash_block_sizes(1024, 64, sram_bytes=192 * KIB, dtype="fp16") == (64, 384)
    assert flash_block_sizes(1024, 64, sram_bytes=192 * KIB, dtype="fp32") == (64, 192)
    assert flash_block_sizes(100, 64, sram_bytes=192 * KIB) == (64, 100)  # capped at N
    assert flash_block_sizes(1024, 64, sram_bytes=192 * KIB, version="fa2") == (128, 128)
    assert flash_block_sizes(1024, 64, version="fa2", block_q=32, block_k=16) == (32, 16)
    # forward, N a multiple of B_c: K,V once (2), Q and O read T_c times, O written T_c times + init
    n, d, e, s = 1536, 64, 2, 4
    rep = flash_attention_io(1, 1, n, d, sram_bytes=192 * KIB, backward=False)
    t_c = n // 384
    nd = n * d * e
    assert rep.hbm_bytes == pytest.approx(nd * (2 + 3 * t_c + 1) + n * s * (2 + 4 * t_c))
    fa2 = flash_attention_io(1, 1, n, d, version="fa2", backward=False)
    t_r = n // 128
    assert fa2.hbm_bytes == pytest.approx(nd * (1 + 2 * t_r + 1) + n * s)


def test_ragged_seq_len_counts_partial_tiles():
    # N not a multiple of the blocks: traffic lies between the neighbouring multiples
    d = 64
    lo, mid, hi = (flash_attention_io(1, 1, n, d, block_q=64, block_k=64) for n in (640, 650, 704))
    assert lo.hbm_bytes < mid.hbm_bytes < hi.hbm_bytes
    assert lo.matmul_flops < mid.matmul_flops < hi.matmul_flops
    assert mid.matmul_flops == pytest.approx(3.5 * 4 * 650 * 650 * d)


def test_theorem2_slope_in_sram():
    n, d = 8192, 64
    ms = np.array([8, 16, 32, 64, 128]) * KIB
    fa = [flash_attention_io(1, 1, n, d, sram_bytes=int(m), backward=False).hbm_bytes for m in ms]
    std = [standard_attention_io(1, 1, n, d, sram_bytes=int(m), backward=False).hbm_bytes for m in ms]
    assert abs(_slope(ms, fa) - (-1.0)) < 0.15
    assert abs(_slope(ms, std)) < 1e-9
    # backward follows the same law
    fab = [flash_attention_io(1, 1, n, d, sram_bytes=int(m)).hbm_bytes for m in ms]
    assert abs(_slope(ms, fab) - (-1.0)) < 0.15


def test_theorem2_slope_in_head_dim_and_seq_len():
    ds = np.array([32, 64, 128, 256])
    fa = [flash_attention_io(1, 1, 16384, int(d), backward=False).hbm_bytes for d in ds]
    assert abs(_slope(ds, fa) - 2.0) < 0.15
    ns = np.array([4096, 8192, 16384, 32768])
    fa_n = [flash_attention_io(1, 1, int(n), 64, backward=False).hbm_bytes for n in ns]
    std_n = [standard_attention_io(1, 1, int(n), 64, backward=False).hbm_bytes for n in ns]
    assert abs(_slope(ns, fa_n) - 2.0) < 0.15
    assert abs(_slope(ns, std_n) - 2.0) < 0.15
    # standard attention: Theta(N d + N^2), nearly flat in d for N >> d
    std_d = [standard_attention_io(1, 1, 16384, int(d), backward=False).hbm_bytes for d in ds]
    assert abs(_slope(ds, std_d)) < 0.1
    # and FlashAttention moves less than standard attention at this M whenever d^2 < M / 4-ish
    assert fa_n[-1] < std_n[-1]


def test_scaling_sweep_reports_slopes(capsys):
    out = iosim.scaling_sweep(verbose=True)
    assert "slope" in capsys.readouterr().out
    for key in ("vs_sram", "vs_head_dim", "vs_seq_len"):
        assert abs(out[key]["flash_slope"] - out[key]["expected"]) < 0.15


def test_monotonic(rng):
    d = 64
    ns = np.sort(rng.choice(np.arange(16, 5000), size=6, replace=False))
    for version in ("fa1", "fa2"):
        prev = 0.0
        for n in ns:
            cur = flash_attention_io(2, 2, int(n), d, version=version).hbm_bytes
            assert cur > prev
            prev = cur
    # more SRAM never means more FA1 traffic; more batch or heads scales linearly
    ms = [16 * KIB, 32 * KIB, 48 * KIB, 96 * KIB, 192 * KIB]
    fa = [flash_attention_io(1, 1, 2048, d, sram_bytes=m).hbm_bytes for m in ms]
    assert all(a >= b for a, b in zip(fa, fa[1:]))
    one = flash_attention_io(1, 1, 777, d)
    assert flash_attention_io(3, 5, 777, d).hbm_bytes == pytest.approx(15 * one.hbm_bytes)
    assert flash_attention_io(1, 1, 777, d, dtype="fp32").hbm_bytes > one.hbm_bytes


def test_matmul_io_algorithms():
    m = n = k = 512
    naive, row, tiled = (matmul_io(m, n, k, algorithm=a) for a in ("naive", "row", "tiled"))
    assert naive.hbm_bytes > row.hbm_bytes > tiled.hbm_bytes
    assert naive.flops == row.flops == tiled.flops == 2 * m * n * k
    t = tiled.params["tile"]
    assert t == math.isqrt((192 * KIB // 2) // 3)
    e = 2
    assert tiled.hbm_bytes == pytest.approx(e * (m * k * -(-n // t) + k * n * -(-m // t) + m * n))
    # Theta(1 / sqrt(M)) with exact tiles that divide the matrix
    tiles = [16, 32, 64, 128]
    b = [matmul_io(1024, 1024, 1024, tile=tt, sram_bytes=1 << 20).hbm_bytes for tt in tiles]
    assert abs(_slope(np.array(tiles) ** 2, b) - (-0.5)) < 0.05


def test_runtime_estimate_is_roofline():
    rep = flash_attention_io(*SEEDS)
    t = rep.runtime_estimate(hbm_bandwidth=1e12, matmul_flops_per_s=1e30, vector_flops_per_s=1e30)
    assert t == pytest.approx(rep.hbm_bytes / 1e12)
    t = rep.runtime_estimate(hbm_bandwidth=1e30, matmul_flops_per_s=1e12, vector_flops_per_s=1e30)
    assert t == pytest.approx(rep.matmul_flops / 1e12)
    both = standard_attention_io(*SEEDS, backward=False) + standard_attention_io(*SEEDS, backward=False)
    assert both.hbm_bytes == pytest.approx(2 * standard_attention_io(*SEEDS, backward=False).hbm_bytes)


def test_main_writes_json(tmp_path, capsys):
    path = tmp_path / "io.json"
    assert iosim.main(["--json", str(path)]) == 0
    import json

    data = json.loads(path.read_text())
    assert set(data) >= {"seeds_table", "scaling", "matmul"}
    assert data["seeds_table"]["flash"]["hbm_gb"] == pytest.approx(4.65, abs=0.01)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(batch=0), ValueError, "batch"),
    (dict(heads=2.5), TypeError, "heads"),
    (dict(seq_len=-3), ValueError, "seq_len"),
    (dict(head_dim=True), TypeError, "head_dim"),
    (dict(dtype="int8"), ValueError, "dtype"),
    (dict(dtype=np.int32), TypeError, "dtype"),
    (dict(dtype=0), ValueError, "dtype"),
    (dict(sram_bytes=0), ValueError, "sram_bytes"),
    (dict(sram_bytes=100), ValueError, "sram_bytes"),  # cannot hold 4d elements
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(dropout="0.1"), TypeError, "dropout"),
    (dict(causal=1), TypeError, "causal"),
    (dict(version="fa3"), ValueError, "version"),
    (dict(block_q=0), ValueError, "block_q"),
    (dict(block_k=8.0), TypeError, "block_k"),
])
def test_bad_input_flash(kwargs, exc, words):
    args = dict(batch=1, heads=1, seq_len=128, head_dim=64)
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        flash_attention_io(**args)


def test_bad_input_standard_and_matmul():
    with pytest.raises(ValueError, match="dropout"):
        standard_attention_io(1, 1, 8, 8, dropout=-0.1)
    with pytest.raises(TypeError, match="mask"):
        standard_attention_io(1, 1, 8, 8, mask="yes")
    with pytest.raises(ValueError, match="dropout_mask_bytes"):
        standard_attention_io(1, 1, 8, 8, dropout=0.1, dropout_mask_bytes=0)
    with pytest.raises(ValueError, match="algorithm"):
        matmul_io(4, 4, 4, algorithm="strassen")
    with pytest.raises(ValueError, match="tile"):
        matmul_io(64, 64, 64, tile=1000)
    with pytest.raises(TypeError, match="m must"):
        matmul_io(4.0, 4, 4)
    with pytest.raises(ValueError, match="hbm_bandwidth"):
        flash_attention_io(1, 1, 8, 8).runtime_estimate(hbm_bandwidth=0)


def test_dtype_spellings():
    import torch

    assert iosim.bytes_per_element("bf16") == 2
    assert iosim.bytes_per_element(np.float32) == 4
    assert iosim.bytes_per_element(torch.float16) == 2
    assert iosim.bytes_per_element(1) == 1
    with pytest.raises(TypeError, match="dtype"):
        iosim.bytes_per_element(torch.int64)
