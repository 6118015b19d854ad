"""reference.triton.paged_tiles (paged prefill with page-aligned key tiles) vs the float64 oracle.

Fresh random caches with randomly permuted pages, ragged chunk and key lengths (chunks of 0 and 1 tokens, a
chunk longer than a page, keys not a multiple of the page), GQA, bottom-right causal offsets and non-causal.
Pages smaller than, equal to, larger than and not dividing the key tile, so every load path runs: one table
entry per block (``page % BLOCK_N == 0``), one per row (the rest); table entries looked up one block ahead and
in the same iteration. On a GPU also bf16 at the benchmark's page sizes with 64-key tiles.
"""
import pytest
import torch

from experiments.serving_baselines import paged_prefill_row_gather
from reference.triton import DEVICE, INTERPRET, paged_prefill
from reference.triton.paged_tiles import launch_paged_prefill
from tests.common import check_paged_prefill, make_paged_prefill
from tests.common import pinned_flash_configs  # noqa: F401  (autouse fixture)

DT = torch.float32 if INTERPRET else torch.float16
TOL = {torch.float32: 1e-5 if INTERPRET else 5e-3, torch.float16: 3e-3, torch.bfloat16: 2e-2}
def pin_of(block_m, block_n, num_warps, num_stages):
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps, "num_stages": num_stages}


#: interpreter: 16-key tiles; GPU: the tests pin (32-key tiles) and the benchmark's 64-key tiles;


#: 64-row tiles take the whole-page path (one table entry per page) where the page divides the key block
PINS = [None, pin_of(64, 32, 4, 1)] if INTERPRET else [None, pin_of(64, 64, 4, 3)]


@pytest.mark.triton_serving
@pytest.mark.parametrize("page", [5, 8, 16, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_page_aligned_prefill_matches_oracle(rng, page, causal):
    seq_lens, chunks = [70, 33, 9, 130, 17], [40, 1, 0, 70, 17]
    hq, hkv, d = 6, 2, 16
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, seq_lens, chunks, hq, hkv, d, page, DT)
    for pin in PINS:
        out = paged_prefill(q, kc, vc, table, cu_t, sl, causal=causal, config=pin, gather="page")
        assert out[0].shape == q.shape and out[1].shape == (hq, q.shape[0])
        check_paged_prefill(out, q, seqs, cu, causal, DT, TOL[DT])


@pytest.mark.triton_serving
@pytest.mark.parametrize("page", [8, 32])
def test_table_lookup_in_same_iteration_and_row_gather_agree(rng, page):
    """``ahead=False`` (table entries loaded in the iteration that uses them) and the row-gather kernel
    (``experiments.serving_baselines.paged_prefill_row_gather``) give the oracle's answer too, on a cache whose unused table entries are -1."""
    seq_lens, chunks = [45, 100], [45, 23]
    hq, hkv, d = 4, 1, 32
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, seq_lens, chunks, hq, hkv, d, page, DT)
    o = torch.empty_like(q)
    lse = torch.empty((hq, q.shape[0]), dtype=torch.float32, device=DEVICE)
    launch_paged_prefill(q, kc, vc, o, lse, cu_t, sl, table, max(chunks), True, d ** -0.5, hq, ahead=False)
    check_paged_prefill((o, lse), q, seqs, cu, True, DT, TOL[DT])
    check_paged_prefill(paged_prefill_row_gather(q, kc, vc, table, cu_t, sl), q, seqs, cu, True, DT, TOL[DT])


@pytest.mark.triton_serving
@pytest.mark.skipif(INTERPRET, reason="bf16 dots need a GPU (the interpreter's bf16 tl.dot is wrong)")
@pytest.mark.parametrize("page", [16, 64])
def test_bf16_benchmark_pages_gqa(rng, page):
    seq_lens, chunks = [300, 517, 64], [128, 200, 64]
    hq, hkv, d = 8, 2, 128
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, seq_lens, chunks, hq, hkv, d, page,
                                                                torch.bfloat16)
    for pin in PINS + [pin_of(128, 64, 8, 3), pin_of(128, 128, 8, 3)]:
        check_paged_prefill(paged_prefill(q, kc, vc, table, cu_t, sl, config=pin, gather="page"), q, seqs, cu, True,
                            torch.bfloat16, TOL[torch.bfloat16])


@pytest.mark.triton_serving
def test_bad_input_names_the_argument(rng):
    (q, kc, vc, table, cu_t, sl), _, _ = make_paged_prefill(rng, [20, 9], [4, 2], 2, 1, 16, 8, DT)
    with pytest.raises(ValueError, match="gather must be one of"):
        paged_prefill(q, kc, vc, table, cu_t, sl, gather="rows")
    with pytest.raises(ValueError, match="config must be"):
        paged_prefill(q, kc, vc, table, cu_t, sl, config={"BLOCK_M": 64})
    bad = table.clone()
    bad[0, 1] = kc.shape[0]
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\]"):
        paged_prefill(q, kc, vc, bad, cu_t, sl)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_prefill(q, kc, vc, table, cu_t, sl + 100)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        paged_prefill(q, kc, vc, table, cu_t.flip(0), sl)
    with pytest.raises(TypeError, match="same dtype"):
        paged_prefill(q, kc.to(torch.float16 if DT == torch.float32 else torch.float32), vc, table, cu_t, sl)
    with pytest.raises(ValueError, match="k_cache"):
        paged_prefill(q, kc[:, :, :, :8], vc[:, :, :, :8], table, cu_t, sl)


@pytest.mark.triton_serving
def test_a_config_never_picks_the_kernel(rng):
    """Under ``backend="auto"`` a Triton pin is refused where the Gluon kernel may run (it used to switch the call to
    the Triton kernel silently); ``backend="triton"`` or ``gather="page"`` take it, and give the oracle's answer."""
    seq_lens, chunks = [45, 100], [45, 23]
    (q, kc, vc, table, cu_t, sl), seqs, cu = make_paged_prefill(rng, seq_lens, chunks, 4, 1, 32, 8, DT)
    with pytest.raises(ValueError, match="backend='triton'"):
        paged_prefill(q, kc, vc, table, cu_t, sl, config=PINS[1])
    for kw in ({"backend": "triton"}, {"gather": "page"}):
        check_paged_prefill(paged_prefill(q, kc, vc, table, cu_t, sl, config=PINS[1], **kw), q, seqs, cu, True, DT,
                            TOL[DT])
