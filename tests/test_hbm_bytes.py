"""a2's ``forward_hbm_bytes`` part: the grader's closed-form oracle, the solution's counting loop and the IO
model of lecture 2 (``reference.simulators.iosim``) count the same bytes.

* oracle == ``iosim.flash_attention_io`` (forward, one head) for square shapes, both loop orders, causal or not,
  ragged block sizes: the model and the oracle were written independently (the model sums over tile pairs, the
  oracle per query block);
* solution == oracle on fresh random shapes, ragged, causal with Nq != Nk (whole query blocks masked), blocks
  larger than N, every element size; the hidden cases of the spec's two tests;
* the solution rejects bad arguments, naming them.
"""
from __future__ import annotations

import numpy as np
import pytest

from autograder.specs import a2_flash_numpy as spec
from reference.simulators import iosim
from tests.common_numpy import load_solution as _load_solution

pytestmark = pytest.mark.autograder


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return _load_solution("a2_flash_numpy", tmp_path_factory.mktemp("a2"))


def _oracle(nq, nk, d, **kw):
    p = dict(spec._hbm(), Nq=nq, Nk=nk, d=d, **kw)
    return spec.oracle_hbm(spec.build_hbm(p, None))[0]


@pytest.mark.parametrize("order", ["fa2", "fa1"])
@pytest.mark.parametrize("causal", [False, True])
def test_oracle_matches_io_model(rng, order, causal):
    for _ in range(20):
        n, d = int(rng.integers(1, 700)), int(rng.choice([16, 64, 128]))
        bq, bk = (int(x) for x in rng.integers(1, 200, size=2))
        e = int(rng.choice([1, 2, 4]))
        got = _oracle(n, n, d, block_q=bq, block_k=bk, element_bytes=e, causal=causal, order=order)
        model = iosim.flash_attention_io(1, 1, n, d, dtype=e, causal=causal, version=order, block_q=bq,
                                         block_k=bk, backward=False)
        assert (got[0].sum(), got[1].sum()) == (model.bytes_read, model.bytes_written), (n, d, bq, bk, e)


def test_solution_matches_oracle_on_hidden_cases(rng, solution):
    for test in spec.HBM_TESTS:
        for _ in range(15):
            for p in test.hidden_cases(rng) + list(test.visible):
                call = spec.build_hbm(p, rng)
                got = solution.forward_hbm_bytes(*call.args, **call.kwargs)
                assert got.dtype == np.int64 and got.shape == (2, 5)
                np.testing.assert_array_equal(got, spec.oracle_hbm(call)[0], err_msg=str(p))


def test_solution_edge_cases(solution):
    # N = 1; Nq > Nk causal: the first Nq - Nk rows see nothing, whole query blocks read Q and write O only
    np.testing.assert_array_equal(solution.forward_hbm_bytes(1, 1, 4, 8, 8, 2),
                                  [[8, 8, 8, 0, 0], [0, 0, 0, 8, 4]])
    got = solution.forward_hbm_bytes(20, 4, 1, block_q=8, block_k=2, element_bytes=1, causal=True)
    # query blocks [0,8) [8,16) [16,20): last allowed keys -9, -1, 3 -> 0, 0, 4 keys read
    np.testing.assert_array_equal(got, [[20, 4, 4, 0, 0], [0, 0, 0, 20, 80]])
    fa1 = solution.forward_hbm_bytes(20, 4, 1, block_q=8, block_k=2, element_bytes=1, causal=True, order="fa1")
    # only the last query block (4 rows) is visited, by both key blocks: 8 streamed rows
    np.testing.assert_array_equal(fa1, [[8, 4, 4, 8, 64], [0, 0, 0, 28, 8 * 28]])


@pytest.mark.parametrize("kw,exc,word", [
    (dict(nq=0), ValueError, "nq"), (dict(d=2.0), TypeError, "d"), (dict(block_k=-1), ValueError, "block_k"),
    (dict(element_bytes=True), TypeError, "element_bytes"), (dict(causal=1), TypeError, "causal"),
    (dict(order="fa3"), ValueError, "order"),
])
def test_solution_rejects_bad_arguments(solution, kw, exc, word):
    args = {**dict(nq=8, nk=8, d=4), **kw}
    with pytest.raises(exc, match=word):
        solution.forward_hbm_bytes(**args)
