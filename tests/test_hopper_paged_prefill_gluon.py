"""The Gluon paged prefill (``reference.triton.hopper.paged_prefill_gluon``, ``paged_prefill(gather="tma")``).

CPU: the kernel compiled for sm_90a in a child process (compile-only mode): Hopper wgmma, one TMA box per page
(the UTMALDG count of a 16-token-page tile is 8x the one-box count), the contiguous kernel's shared memory, the
ping-pong register budgets, no spills in the key loops; ``gather="tma"`` off Hopper runs the Triton kernel.
GPU (H100/H200): against the float64 oracle on ragged requests (chunks of 0 and 1 tokens, keys not a multiple of
the page or the tile), pages permuted through the pool, GQA, causal and not, 8- to 256-token pages.
"""
import json

import numpy as np
import pytest
import torch

from reference.triton import INTERPRET, paged_prefill
from tests.common import FLASH_O_TOL, check_paged_prefill, make_paged_prefill
from tests import sm90_compile

pytestmark = pytest.mark.triton_serving
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _aot(*args) -> dict:
    out = sm90_compile.run(["-m", "reference.triton.hopper.paged_prefill_gluon", *map(str, args)], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("page, d, causal", [(16, 128, "causal"), (64, 128, "causal"), (256, 128, "causal"),
                                             (16, 64, "full")])
def test_compiles_for_hopper_one_box_per_page(page, d, causal):
    from reference.triton.configs import GLUON_FORWARD
    usage = _aot(page, d, causal)
    assert usage["HGMMA"] > 0 and usage["HMMA"] == 0, usage
    # TMA copies: each (rows, d) box is d * 2 / 128 copies of the 128-byte swizzle width; Q is 2 halves of one box,
    # a K or V tile is 128 / page boxes (one per page), or one 128-row box when the page holds whole tiles
    per_box = d * 2 // 128
    boxes = 128 // page if page <= 128 else 1
    assert usage["UTMALDG"] == per_box * (2 + 2 * boxes), usage
    assert 0 <= usage["shared_bytes"] - GLUON_FORWARD.shared_bytes(d) < 1024, usage  # the contiguous kernel's
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


def _tail_slot(table, sl, page, b):
    """(pool page, slot) of the first unused slot of sequence ``b``'s last page."""
    n = int(sl[b])
    return int(table[b, (n - 1) // page]), n % page


def test_tail_values_finite_looks_only_past_each_sequence_end(rng):
    """``tail_values_finite``: True for finite pools; False for a NaN or inf in an unused slot of a sequence's
    last page; a NaN in a used slot, or in a page no table names, is not its business."""
    from reference.triton.serving import tail_values_finite
    page = 16
    (q, kc, vc, table, cu_t, sl), _, _ = make_paged_prefill(rng, [40, 32, 21], [9, 32, 21], 4, 2, 8, page,
                                                            torch.float32)
    assert tail_values_finite(vc, table, sl)
    for b in (0, 2):                                   # 40 and 21 keys: last pages with 8 and 11 unused slots
        for bad in (float("nan"), float("inf")):
            v = vc.clone()
            pg, slot = _tail_slot(table, sl, page, b)
            v[pg, rng.integers(slot, page), int(rng.integers(2)), int(rng.integers(8))] = bad
            assert not tail_values_finite(v, table, sl), (b, bad)
    v = vc.clone()
    v[int(table[1, 1]), page - 1] = float("nan")       # sequence 1 fills its last page: that slot is used
    pg, slot = _tail_slot(table, sl, page, 0)
    v[pg, slot - 1] = float("nan")                     # the last used slot of sequence 0
    spare = sorted(set(range(vc.shape[0])) - set(table[table >= 0].tolist()))[0]
    v[spare] = float("nan")                            # a page no sequence holds
    assert tail_values_finite(v, table, sl)


def test_tma_path_falls_back_where_the_tail_is_not_finite(rng, monkeypatch):
    """``paged_prefill(gather="tma")`` with ``validate=True`` runs the Triton kernel when a sequence's last page
    holds NaN past its end (the Gluon kernel would give NaN; a stub stands in for it on a CPU); finite tails and
    ``validate=False`` reach the Gluon kernel."""
    from reference.triton import serving
    from reference.triton.hopper import paged_prefill_gluon as pg_mod
    calls = []

    def stub(q, k_cache, v_cache, o, lse, *args, **kwargs):
        calls.append(1)
        o.zero_()
        lse.zero_()
    monkeypatch.setattr(serving, "_gluon_takes", lambda *a: True)
    monkeypatch.setattr(pg_mod, "paged_prefill_gluon", stub)
    page = 16
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, [40, 21], [9, 21], 4, 2, 16, page,
                                                                torch.float32)
    paged_prefill(q, kc, vc, table, cu_t, sl, gather="tma")
    assert calls == [1]                                # finite tails: the Gluon kernel
    pg, slot = _tail_slot(table, sl, page, 1)
    vc[pg, slot:] = float("nan")
    out = paged_prefill(q, kc, vc, table, cu_t, sl, gather="tma")
    assert calls == [1]                                # the fallback ran, not the stub
    assert torch.isfinite(out[0]).all()
    # the Triton kernel's float32 dots run in TF32 on a GPU (1e-5 holds only under the interpreter)
    check_paged_prefill(out, q, seqs, cu, True, torch.float32, FLASH_O_TOL[torch.float32])
    paged_prefill(q, kc, vc, table, cu_t, sl, gather="tma", validate=False)
    assert calls == [1, 1]                             # validate=False: the caller's promise


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


@pytest.mark.skipif(HOPPER, reason="checks the backends where no Hopper GPU is present")
def test_backend_argument_picks_the_kernel_and_never_falls_back_silently(rng):
    """``backend="triton"`` is the page-aligned kernel (as ``"auto"`` off Hopper); ``backend="gluon"`` off Hopper
    raises ``ValueError`` naming the reason instead of running another kernel; bad combinations are named."""
    dt = torch.float32 if INTERPRET else torch.float16
    (q, kc, vc, table, cu_t, sl), _, _ = make_paged_prefill(rng, [40, 21], [9, 21], 4, 2, 16, 16, dt)
    page = paged_prefill(q, kc, vc, table, cu_t, sl, gather="page")
    for backend in ("auto", "triton"):
        out = paged_prefill(q, kc, vc, table, cu_t, sl, backend=backend)
        assert torch.equal(out[0], page[0]) and torch.equal(out[1], page[1]), backend
    with pytest.raises(ValueError, match="needs a Hopper GPU"):
        paged_prefill(q, kc, vc, table, cu_t, sl, backend="gluon")
    with pytest.raises(ValueError, match="backend must be one of"):
        paged_prefill(q, kc, vc, table, cu_t, sl, backend="cuda")
    with pytest.raises(ValueError, match="backend='triton' takes gather 'page'"):
        paged_prefill(q, kc, vc, table, cu_t, sl, backend="triton", gather="tma")
    with pytest.raises(ValueError, match="gather None or 'tma' and no config"):
        paged_prefill(q, kc, vc, table, cu_t, sl, backend="gluon", gather="page")


def test_gluon_backend_raises_where_auto_falls_back(rng, monkeypatch):
    """Where the Gluon kernel takes the inputs (a stub on a CPU), ``backend="gluon"`` runs it; a NaN past a
    sequence's end under ``validate=True`` makes ``"auto"`` run the Triton kernel and ``"gluon"`` raise;
    ``backend="triton"`` never reaches the Gluon kernel."""
    from reference.triton import serving
    from reference.triton.hopper import paged_prefill_gluon as pg_mod
    calls = []

    def stub(q, k_cache, v_cache, o, lse, *args, **kwargs):
        calls.append(1)
        o.zero_()
        lse.zero_()
    monkeypatch.setattr(serving, "_gluon_refusal", lambda *a: None)
    monkeypatch.setattr(pg_mod, "paged_prefill_gluon", stub)
    page = 16
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, [40, 21], [9, 21], 4, 2, 16, page,
                                                                torch.float32)
    paged_prefill(q, kc, vc, table, cu_t, sl, backend="gluon")
    assert calls == [1]
    paged_prefill(q, kc, vc, table, cu_t, sl, backend="triton")
    assert calls == [1]
    pg, slot = _tail_slot(table, sl, page, 1)
    vc[pg, slot:] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        paged_prefill(q, kc, vc, table, cu_t, sl, backend="gluon")
    out = paged_prefill(q, kc, vc, table, cu_t, sl, backend="auto")
    assert calls == [1] and torch.isfinite(out[0]).all()
    check_paged_prefill(out, q, seqs, cu, True, torch.float32, FLASH_O_TOL[torch.float32])
