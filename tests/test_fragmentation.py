"""reference.simulators.fragmentation: the seeds' 20-40 % figure, paging's < one block of waste per sequence, invariants
checked step by step on the trace, determinism, the first-fit allocator, bad input."""
import numpy as np
import pytest

from reference.simulators.fragmentation import (CATEGORIES, DEFAULT_POOL_TOKENS, FirstFitAllocator, Request,
                                     make_requests, pool_tokens_for, simulate)

pytestmark = pytest.mark.fragmentation

BLOCKS = (1, 2, 4, 8, 16, 32, 64)


@pytest.fixture(scope="module")
def default_reports():
    """The default workload (1000 ShareGPT-like requests, seed 0, 40 GB pool of OPT-13B slots)."""
    reqs = make_requests(1000, seed=0)
    out = {p: simulate(reqs, p) for p in ("static", "pow2", "oracle")}
    out.update({("paged", b): simulate(reqs, "paged", block_size=b) for b in (1, 16, 64)})
    return reqs, out


def test_pool_numbers():
    assert pool_tokens_for() == DEFAULT_POOL_TOKENS == 40_000_000_000 // 819_200 == 48_828
    assert pool_tokens_for(12e9, 819_200) == 14_648


def test_seeds_figure_static_20_to_40_percent(default_reports):
    reqs, rep = default_reports
    static = rep["static"]
    assert 0.20 <= static.utilisation <= 0.40  # "only 20-40 % of KV cache is utilized"
    assert static.max_concurrency == DEFAULT_POOL_TOKENS // 2048 == 23
    # the rest is reservation and internal fragmentation, as in the vLLM paper's Figure 2
    assert static.breakdown["internal_fragmentation"] > static.breakdown["reservation"] > 0.1


def test_paging_waste_under_one_block(default_reports):
    reqs, rep = default_reports
    p16 = rep[("paged", 16)]
    assert p16.max_waste_per_seq < 16
    assert p16.breakdown["internal_fragmentation"] < 0.04  # "< 4 % at block 16"
    assert p16.utilisation_of_allocated > 0.96
    assert p16.breakdown["reservation"] == 0 and p16.breakdown["external_fragmentation"] == 0
    p1 = rep[("paged", 1)]
    assert p1.max_waste_per_seq == 0 and p1.utilisation_of_allocated == 1.0
    assert rep[("paged", 64)].max_waste_per_seq < 64


def test_utilisation_ordering(default_reports):
    _, rep = default_reports
    u = {k: r.utilisation for k, r in rep.items()}
    assert u["static"] < u["pow2"] < u["oracle"] < u[("paged", 64)] < u[("paged", 16)] <= u[("paged", 1)]
    c = {k: r.mean_concurrency for k, r in rep.items()}
    assert c["static"] < c["oracle"] < c[("paged", 16)]
    assert rep[("paged", 16)].mean_concurrency > 3 * rep["static"].mean_concurrency
    for r in rep.values():
        assert sum(r.breakdown[k] for k in CATEGORIES) == pytest.approx(1.0)
        assert all(v >= 0 for v in r.breakdown.values())


@pytest.mark.parametrize("policy, block", [("static", None), ("pow2", None), ("oracle", None)]
                         + [("paged", b) for b in BLOCKS])
def test_invariants_on_trace(rng, policy, block):
    seed = int(rng.integers(2**31))
    reqs = make_requests(int(rng.integers(60, 160)), seed=seed, max_seq_len=512,
                         prompt_mean=float(rng.uniform(20, 120)), output_mean=float(rng.uniform(20, 200)))
    pool = int(rng.integers(512, 6000))
    rep = simulate(reqs, policy, pool_tokens=pool, block_size=block, max_seq_len=512, record_trace=True)
    t = rep.trace
    assert np.all(t["stored"] <= t["allocated"]) and np.all(t["allocated"] <= pool)
    assert np.all(t["stored"] >= t["running"])  # at least one token per running sequence
    if policy == "paged":
        assert np.all(t["max_waste"] < block)
        assert np.all((t["allocated"] % block) == 0)
        if block == 1:
            assert np.array_equal(t["stored"], t["allocated"])
    else:
        assert rep.preemptions == 0
    # every output token is produced exactly once (preempted sequences keep theirs, recomputation)
    assert rep.tokens_generated == sum(r.output_len for r in reqs) == int(t["running"].sum())
    assert rep.steps == len(t["stored"])
    assert 0 < rep.utilisation <= rep.utilisation_of_allocated <= 1


def test_preemption_under_a_tight_pool():
    reqs = make_requests(80, seed=3, max_seq_len=1024)
    rep = simulate(reqs, "paged", pool_tokens=1100, block_size=16, max_seq_len=1024, record_trace=True)
    assert rep.preemptions > 0
    assert rep.tokens_generated == sum(r.output_len for r in reqs)


def test_deterministic():
    a = make_requests(300, seed=11)
    assert a == make_requests(300, seed=11)
    assert a != make_requests(300, seed=12)
    r1 = simulate(a, "paged", pool_tokens=8000, block_size=8)
    r2 = simulate(a, "paged", pool_tokens=8000, block_size=8)
    assert r1.as_dict() == r2.as_dict()


def test_make_requests_distribution():
    reqs = make_requests(4000, seed=1)
    p = np.array([r.prompt_len for r in reqs])
    o = np.array([r.output_len for r in reqs])
    assert p.min() >= 1 and o.min() >= 1 and (p + o).max() <= 2048
    # lognormal means 161 / 338 (clipping at 2048 trims the tail a little)
    assert 130 < p.mean() < 190 and 280 < o.mean() < 380
    short = make_requests(200, seed=1, max_seq_len=16)
    assert max(r.total_len for r in short) <= 16


def test_first_fit_allocator():
    a = FirstFitAllocator(100)
    s1, s2, s3 = a.allocate(30), a.allocate(30), a.allocate(30)
    assert (s1, s2, s3) == (0, 30, 60) and a.free == 10
    a.release(s1, 30)
    a.release(s3, 30)
    # 70 slots free, but the largest hole is 40: external fragmentation
    assert a.free == 70 and a.largest_hole == 40 and a.allocate(50) is None
    assert a.allocate(25) == 0  # first fit
    a.release(0, 25)
    a.release(s2, 30)  # merges both sides into one hole
    assert a.largest_hole == 100 and a.allocate(100) == 0
    with pytest.raises(ValueError, match="overlaps"):
        b = FirstFitAllocator(10)
        b.release(0, 5)


def test_external_fragmentation_is_reported():
    # short, long, short admitted; when the shorts leave, 1100 slots are free in holes of 500 and 600,
    # so the next long request (1000) waits: external fragmentation
    reqs = [Request(1, 999) if i % 2 else Request(1, 499) for i in range(12)]
    rep = simulate(reqs, "oracle", pool_tokens=2100, max_seq_len=1024, record_trace=True)
    assert rep.breakdown["external_fragmentation"] > 0.05
    paged = simulate(reqs, "paged", pool_tokens=2100, block_size=4, max_seq_len=1024)
    assert paged.breakdown["external_fragmentation"] == 0
    assert paged.mean_concurrency > rep.mean_concurrency


def test_bad_input():
    reqs = make_requests(5, seed=0)
    with pytest.raises(ValueError, match="policy"):
        simulate(reqs, "buddy")
    with pytest.raises(ValueError, match="block_size"):
        simulate(reqs, "paged")
    with pytest.raises(ValueError, match="block_size"):
        simulate(reqs, "static", block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        simulate(reqs, "paged", block_size=0)
    with pytest.raises(TypeError, match="block_size"):
        simulate(reqs, "paged", block_size=1.5)
    with pytest.raises(ValueError, match="pool_tokens"):
        simulate(reqs, "static", pool_tokens=1000)
    with pytest.raises(ValueError, match="pool_tokens"):
        simulate(reqs, "paged", pool_tokens=2050, block_size=1500)  # usable 1500 < 2 blocks for 2048 tokens
    with pytest.raises(ValueError, match="requests must not be empty"):
        simulate([], "static")
    with pytest.raises(TypeError, match=r"requests\[0\]"):
        simulate([(10, 20)], "static")
    with pytest.raises(ValueError, match="max_seq_len"):
        simulate([Request(2000, 100)], "static")
    with pytest.raises(ValueError, match="watermark"):
        simulate(reqs, "paged", block_size=16, watermark=1.5)
    with pytest.raises(ValueError, match="prompt_len"):
        Request(0, 5)
    with pytest.raises(TypeError, match="output_len"):
        Request(3, 2.5)
    with pytest.raises(ValueError, match="n must"):
        make_requests(0)
    with pytest.raises(TypeError, match="seed"):
        make_requests(5, seed=-1)
    with pytest.raises(ValueError, match="output_mean"):
        make_requests(5, output_mean=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        make_requests(5, max_seq_len=1)
