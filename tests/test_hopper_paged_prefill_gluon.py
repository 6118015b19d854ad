"""The Gluon paged prefill (``reference.triton.hopper.paged_prefill_gluon``, ``paged_prefill(gather="tma")``).

CPU: the kernel compiled for sm_90a in a child process (compile-only mode): Hopper wgmma, one TMA box per page
(the UTMALDG count of a 16-token-page tile is 8x the one-box count), the contiguous kernel's shared memory, the
ping-pong register budgets, no spills in the key loops; ``gather="tma"`` off Hopper runs the Triton kernel.
GPU (H100/H200): against the float64 oracle on ragged requests (chunks of 0 and 1 tokens, keys not a multiple of
the page or the tile), pages permuted through the pool, GQA, causal and not, 8- to 256-token pages.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from reference.triton import INTERPRET, paged_prefill
from tests.common import check_paged_prefill, make_paged_prefill

pytestmark = pytest.mark.triton_serving
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _aot(*args) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "reference.triton.hopper.paged_prefill_gluon", *map(str, args)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("page, d, causal", [(16, 128, "causal"), (64, 128, "causal"), (256, 128, "causal"),
                                             (16, 64, "full")])
def test_compiles_for_hopper_one_box_per_page(page, d, causal):
    from reference.triton.hopper.flash_gluon import DEFAULT_CONFIG, shared_bytes
    usage = _aot(page, d, causal)
    assert usage["HGMMA"] > 0 and usage["HMMA"] == 0, usage
    # TMA copies: each (rows, d) box is d * 2 / 128 copies of the 128-byte swizzle width; Q is 2 halves of one box,
    # a K or V tile is 128 / page boxes (one per page), or one 128-row box when the page holds whole tiles
    per_box = d * 2 // 128
    boxes = 128 // page if page <= 128 else 1
    assert usage["UTMALDG"] == per_box * (2 + 2 * boxes), usage
    assert 0 <= usage["shared_bytes"] - shared_bytes(DEFAULT_CONFIG, d) < 1024, usage  # the contiguous kernel's
    assert usage["registers"] == 168 and usage["USETMAXREG"] > 0, usage  # ping-pong register budgets
    loops = usage["key_loops"]
    assert sum(1 for lp in loops if lp["HGMMA"]) == 2, loops  # one key loop per consumer warpgroup
    assert sum(1 for lp in loops if lp["UTMALDG"] == 2 * per_box * boxes) == 1, loops  # the producer's
    assert all(lp["LDL"] == 0 and lp["STL"] == 0 for lp in loops), loops  # no spills on the hot path
    if d == 64:
        assert usage["LDL"] == usage["STL"] == usage["stack"] == 0, usage


def test_box_rows_and_what_the_kernel_takes():
    from reference.triton.hopper.paged_prefill_gluon import box_rows
    assert [box_rows(p, 128) for p in (8, 16, 64, 128, 256, 512)] == [8, 16, 64, 128, 128, 128]
    assert [box_rows(p, 128) for p in (1, 4, 5, 24, 96, 200)] == [None] * 6


@pytest.mark.skipif(HOPPER, reason="checks the fallback where no Hopper GPU is present")
def test_tma_gather_off_hopper_runs_the_triton_kernel(rng):
    """``gather="tma"`` on a machine without a Hopper GPU gives the page-aligned Triton kernel's output."""
    dt = torch.float32 if INTERPRET else torch.float16
    (q, kc, vc, table, cu_t, sl), _, _ = make_paged_prefill(rng, [40, 21], [9, 21], 4, 2, 16, 16, dt)
    o1, l1 = paged_prefill(q, kc, vc, table, cu_t, sl, gather="tma")
    o2, l2 = paged_prefill(q, kc, vc, table, cu_t, sl, gather="page")
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_bad_gather_is_named(rng):
    (q, kc, vc, table, cu_t, sl), _, _ = make_paged_prefill(rng, [8], [8], 2, 1, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="gather"):
        paged_prefill(q, kc, vc, table, cu_t, sl, gather="box")


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon kernel needs an H100/H200 (sm_90)")
@pytest.mark.parametrize("page", [8, 16, 64, 256])
@pytest.mark.parametrize("d, causal", [(128, True), (128, False), (64, True)])
def test_gluon_paged_prefill_matches_float64(rng, page, d, causal):
    seq_lens, chunks = [700, 333, 90, 1300, 17, 129], [300, 1, 0, 700, 17, 129]
    hq, hkv = 8, 2
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, seq_lens, chunks, hq, hkv, d, page,
                                                                torch.bfloat16)
    from reference.triton.hopper.paged_prefill_gluon import gluon_paged_ok
    assert gluon_paged_ok(q, kc) is None  # the Gluon kernel runs, not the fallback
    out = paged_prefill(q, kc, vc, table, cu_t, sl, causal=causal, gather="tma")
    assert out[0].shape == q.shape and out[1].shape == (hq, q.shape[0])
    check_paged_prefill(out, q, seqs, cu, causal, torch.bfloat16, TOL[torch.bfloat16])
    # against the Triton kernel on the same inputs (both bf16; independent code paths)
    ref = paged_prefill(q, kc, vc, table, cu_t, sl, causal=causal, gather="page")
    assert (out[0].float() - ref[0].float()).abs().max() < 3e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon kernel needs an H100/H200 (sm_90)")
def test_gluon_paged_prefill_int64_tables_and_the_benchmark_shape(rng):
    """int64 tables / lengths (converted), float16, a shape like the benchmark's (chunks after cached keys)."""
    seq_lens, chunks = [1024 + 256] * 3, [256] * 3
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, seq_lens, chunks, 8, 2, 128, 16, torch.float16)
    out = paged_prefill(q, kc, vc, table.long(), cu_t.long(), sl.long(), causal=True, gather="tma")
    check_paged_prefill(out, q, seqs, cu, True, torch.float16, TOL[torch.float16])
    assert np.isfinite(out[1].cpu().numpy()).all()
