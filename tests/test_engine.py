"""reference.serving_engine: the mini serving engine generates exactly the tokens of plain full-sequence decoding,
whatever the chunking, paging, preemption, static reservation or prefix sharing."""
import numpy as np
import pytest

from reference.serving_engine import MiniEngine, ToyModel, reference_generate


@pytest.mark.engine
@pytest.mark.parametrize("policy,shared,chunk", [("paged", False, 16), ("static", False, 64), ("paged", True, 40)])
def test_engine_matches_reference_decoding(rng, policy, shared, chunk):
    model = ToyModel(vocab=31, n_heads=4, n_kv_heads=2, head_dim=8, seed=int(rng.integers(1 << 30)))
    prefix = [int(t) for t in rng.integers(0, 31, 16)] if shared else []
    reqs = [(i, prefix + [int(t) for t in rng.integers(0, 31, int(rng.integers(1, 40)))], int(rng.integers(1, 12)))
            for i in range(10)]
    eng = MiniEngine(model, pool_tokens=256, block_size=8, chunk=chunk, max_running=6, policy=policy,
                     shared_prefix=prefix or None)
    for rid, p, n in reqs:
        eng.add(rid, p, n)
    stats = eng.run()
    assert len(eng.done) == len(reqs) and not eng.running and stats["generated"] == sum(n for *_, n in reqs)
    for r in eng.done:
        assert r.output == reference_generate(model, r.prompt, r.max_new), r.rid
    held = max(h["kv_slots_held"] for h in eng.history)
    assert held <= 256


@pytest.mark.engine
def test_engine_rejects_bad_input():
    model = ToyModel(vocab=11, n_heads=2, n_kv_heads=1, head_dim=4)
    with pytest.raises(ValueError, match="policy must be 'paged' or 'static'"):
        MiniEngine(model, policy="lazy")
    eng = MiniEngine(model, shared_prefix=[1, 2, 3])
    with pytest.raises(ValueError, match="must start with the shared prefix"):
        eng.add(0, [4, 5], 3)
