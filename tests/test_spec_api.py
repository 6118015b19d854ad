"""Conformance of the public API (docs/design.md §4) and a bad-input audit of every public function (§3).

1. Every name of docs/design.md §4 exists where the design says, with the design's parameters (names, order,
   defaults: ``inspect.signature`` against the design's text). Extra parameters are allowed only keyword-only and are
   listed in ``EXTRA_KWONLY`` so that a new one is a deliberate, visible change.
2. The lazy exports of ``reference.numpy`` and ``reference.triton`` resolve; importing ``reference.triton`` in a
   fresh process without CUDA prints the interpreter notice exactly once and sets ``TRITON_INTERPRET=1`` before
   any kernel is defined.
3. One table-driven test: (function, good base inputs, one bad edit, exception type, regex naming the argument).
   Every base is first called unedited and must succeed, so each error really comes from its edit.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest
import torch

import reference.numpy as rnp
import reference.triton as rtr
from reference import iosim  # the SPEC's path (a shim for reference.simulators.iosim)
from reference.simulators import cycle_model, fp8_error, fragmentation, scheduling
from reference.numpy import attention as np_attention
from reference.numpy import decoder_layer, decoding, flash, merge, paged, softmax
from reference.triton import DEVICE, INTERPRET
from reference.triton.flash_bwd import flash_attention_backward as tr_flash_backward

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------------------------------------------
# 1. docs/design.md §4 signatures
# ----------------------------------------------------------------------------------------------------------------
# (module, name, documented parameter list, pytest marker). Methods are "Class.method" (without self).
API = [
    ("reference.numpy.softmax", "naive_softmax", "x, axis=-1", "naive_softmax"),
    ("reference.numpy.softmax", "safe_softmax", "x, axis=-1", "safe_softmax"),
    ("reference.numpy.softmax", "online_softmax", "x, block_size=128", "online_softmax"),
    ("reference.numpy.softmax", "softmax_stats", "x", "softmax_stats"),
    ("reference.numpy.softmax", "merge_softmax_stats", "m1, l1, m2, l2", "softmax_stats"),
    ("reference.numpy.attention", "attention", "q, k, v, causal=False, scale=None, return_lse=False", "attention"),
    ("reference.numpy.attention", "attention_backward", "q, k, v, do, causal=False, scale=None",
     "attention_backward"),
    ("reference.numpy.attention", "causal_mask", "nq, nk", "causal_mask"),
    ("reference.numpy.attention", "multi_head_attention",
     "x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads=None, causal=False", "multi_head_attention"),
    ("reference.numpy.flash", "flash_attention_forward", "q, k, v, causal=False, scale=None, block_q=64, block_k=64",
     "flash_forward"),
    ("reference.numpy.flash", "flash_attention_backward",
     "q, k, v, o, lse, do, causal=False, scale=None, block_q=64, block_k=64", "flash_backward"),
    ("reference.numpy.merge", "merge_states", "o_a, lse_a, o_b, lse_b", "merge_states"),
    ("reference.numpy.merge", "merge_many", "os, lses", "merge_states"),
    ("reference.numpy.decoding", "KVCache.append", "k, v", "kv_cache"),
    ("reference.numpy.decoding", "flash_decoding", "q, k, v, num_splits=4, seq_lens=None, scale=None",
     "flash_decoding"),
    ("reference.numpy.paged", "BlockAllocator", "num_blocks", "block_allocator"),
    ("reference.numpy.paged", "BlockAllocator.allocate", "", "block_allocator"),
    ("reference.numpy.paged", "BlockAllocator.free", "block", "block_allocator"),
    ("reference.numpy.paged", "PagedKVCache", "num_blocks, block_size, n_kv_heads, head_dim, dtype",
     "paged_kv_cache"),
    ("reference.numpy.paged", "PagedKVCache.add_sequence", "seq_id", "paged_kv_cache"),
    ("reference.numpy.paged", "PagedKVCache.append", "seq_id, k, v", "paged_kv_cache"),
    ("reference.numpy.paged", "PagedKVCache.fork", "parent_id, child_id", "paged_kv_cache"),
    ("reference.numpy.paged", "PagedKVCache.free", "seq_id", "paged_kv_cache"),
    ("reference.numpy.paged", "PagedKVCache.block_table", "seq_id", "paged_kv_cache"),
    ("reference.numpy.paged", "PagedKVCache.gather", "seq_id", "paged_kv_cache"),
    ("reference.numpy.paged", "paged_attention", "q, k_cache, v_cache, block_tables, seq_lens, scale=None",
     "paged_attention"),
    ("reference.triton", "softmax", "x", "triton_softmax"),
    ("reference.triton", "flash_attention_forward", "q, k, v, causal=False, scale=None", "triton_flash_forward"),
    ("reference.triton", "flash_attention", "q, k, v, causal=False, scale=None", "triton_flash_backward"),
    ("reference.triton", "flash_decode", "q, k, v, seq_lens=None, num_splits=None, scale=None",
     "triton_flash_decode"),
    ("reference.triton", "paged_decode", "q, k_cache, v_cache, block_tables, seq_lens, scale=None",
     "triton_paged_decode"),
]

# Extra parameters beyond the design: keyword-only, with these defaults (the whole list; anything else fails).
EXTRA_KWONLY = {
    "reference.triton.softmax": {"max_single": None},           # override of the one-pass row limit (tests)
    # validate=False skips the seq_lens range check's sync; config: a DecodeConfig (reference/triton/configs.py);
    # fast_launch=False: never repeat a recorded launch
    "reference.triton.flash_decode": {"validate": True, "config": None, "fast_launch": True},
    "reference.triton.paged_decode": {"num_splits": None, "validate": True, "config": None, "fast_launch": True},
    # a pinned block configuration and the load path, passed explicitly (reference/triton/configs.py)
    "reference.triton.flash_attention_forward": {"config": None, "use_tma": None},
}
# Defaults the implementation adds to a parameter the design lists without one.
EXTRA_DEFAULTS = {
    "reference.numpy.paged.PagedKVCache": {"dtype": np.float32},
}


def _resolve(module: str, name: str):
    obj = import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _spec_signature(params: str) -> inspect.Signature:
    namespace: dict = {}
    exec(f"def _spec({params}): pass", namespace)  # the design's own text, parsed by Python
    return inspect.signature(namespace["_spec"])


def _actual_signature(obj) -> inspect.Signature:
    sig = inspect.signature(obj)  # a class gives its __init__ without self
    params = list(sig.parameters.values())
    if inspect.isfunction(obj) and "." in obj.__qualname__ and params and params[0].name == "self":
        params = params[1:]
    return sig.replace(parameters=params)


@pytest.mark.parametrize("module,name,params,marker", [pytest.param(*c, marks=getattr(pytest.mark, c[3]),
                                                                      id=f"{c[0]}.{c[1]}") for c in API])
def test_spec_signature(module, name, params, marker):
    obj = _resolve(module, name)
    assert callable(obj), f"{module}.{name} is not callable"
    full = f"{module}.{name}"
    want = _spec_signature(params)
    got = _actual_signature(obj)
    positional = [p for p in got.parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    kwonly = {p.name: p.default for p in got.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert [p.name for p in positional] == list(want.parameters), f"{full}{got} != docs/design.md §4 ({params})"
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in positional), f"{full}{got}"
    extra_defaults = EXTRA_DEFAULTS.get(full, {})
    for p in positional:
        spec_default = want.parameters[p.name].default
        expected = extra_defaults.get(p.name, spec_default)
        assert p.default is expected or p.default == expected, \
            f"{full}: default of {p.name} is {p.default!r}, docs/design.md §4 says {spec_default!r}"
    assert kwonly == EXTRA_KWONLY.get(full, {}), f"{full}: keyword-only extras {kwonly} not recorded in EXTRA_KWONLY"


@pytest.mark.kv_cache
def test_kv_cache_exposes_views_of_filled_part(rng):
    cache = decoding.KVCache(8, 2, 4)
    k = rng.standard_normal((2, 3, 4)).astype(np.float32)
    cache.append(k, k + 1)
    assert cache.k.shape == cache.v.shape == (2, 3, 4)
    assert np.shares_memory(cache.k, cache._k) and np.shares_memory(cache.v, cache._v), "k/v must be views"
    np.testing.assert_array_equal(cache.k, k)
    np.testing.assert_array_equal(cache.v, k + 1)


@pytest.mark.block_allocator
def test_block_allocator_has_reference_counts_and_num_free():
    a = paged.BlockAllocator(3)
    b = a.allocate()
    assert a.num_free == 2 and a.refcount(b) == 1
    a.incref(b)
    a.free(b)
    assert a.num_free == 2 and a.refcount(b) == 1
    a.free(b)
    assert a.num_free == 3 and a.refcount(b) == 0


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.flash_decoding
def test_return_structures_follow_spec(rng, dtype):
    """Tuple returns of docs/design.md §4 and the dtype rules of §3 (outputs in the input dtype, lse >= float32)."""
    f = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    q, k, v = f(1, 4, 5, 8), f(1, 2, 7, 8), f(1, 2, 7, 8)
    lse_dt = np.float64 if dtype == np.float64 else np.float32
    m, l = softmax.softmax_stats(f(3, 6))
    assert m.shape == l.shape == (3,)
    assert len(softmax.merge_softmax_stats(m, l, m, l)) == 2
    o, lse = np_attention.attention(q, k, v, return_lse=True)
    assert o.dtype == dtype and lse.dtype == lse_dt and lse.shape == (1, 4, 5)
    assert isinstance(np_attention.attention(q, k, v), np.ndarray)
    assert all(g.shape == x.shape and g.dtype == dtype
               for g, x in zip(np_attention.attention_backward(q, k, v, o), (q, k, v)))
    o2, lse2 = flash.flash_attention_forward(q, k, v)
    assert o2.dtype == dtype and lse2.dtype == lse_dt and lse2.shape == (1, 4, 5)
    grads = flash.flash_attention_backward(q, k, v, o2, lse2, o2)
    assert all(g.shape == x.shape and g.dtype == dtype for g, x in zip(grads, (q, k, v)))
    om, lm = merge.merge_states(o2, lse2, o2, lse2)
    assert om.dtype == dtype and lm.dtype == lse_dt
    assert len(merge.merge_many([o2], [lse2])) == 2
    od, ld = decoding.flash_decoding(q[:, :, 0], k, v)
    assert od.shape == (1, 4, 8) and od.dtype == dtype and ld.shape == (1, 4) and ld.dtype == lse_dt
    op = paged.paged_attention(q[:, :, 0], k[0].transpose(1, 0, 2)[None], v[0].transpose(1, 0, 2)[None],
                               np.array([[0]], np.int32), np.array([7], np.int32))
    assert isinstance(op, np.ndarray) and op.shape == (1, 4, 8) and op.dtype == dtype
    assert np_attention.causal_mask(2, 3).dtype == bool


# ----------------------------------------------------------------------------------------------------------------
# 2. lazy exports and the interpreter switch
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pkg", [rnp, rtr], ids=["reference.numpy", "reference.triton"])
def test_lazy_exports_resolve(pkg):
    for name, module in pkg._EXPORTS.items():
        obj = getattr(pkg, name)
        assert obj is getattr(import_module(f"{pkg.__name__}.{module}"), name), f"{pkg.__name__}.{name}"
        assert name in pkg.__all__ and name in dir(pkg)
    for name in pkg.__all__:
        assert hasattr(pkg, name), f"{pkg.__name__}.__all__ lists {name} but it does not resolve"
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(pkg, "no_such_name")


def test_every_spec_name_is_exported_from_its_package():
    for module, name, _, _ in API:
        top = name.split(".")[0]
        pkg = rtr if module == "reference.triton" else rnp
        if (module, top) == ("reference.numpy.attention", "attention"):
            # the module shares the function's name, so the package attribute is the module (documented)
            assert inspect.ismodule(rnp.attention) and callable(rnp.attention.attention)
            continue
        assert top in pkg._EXPORTS, f"{top} is not a lazy export of {pkg.__name__}"


def _fresh_python(code: str, **env_changes):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_numpy_package_import_is_lazy():
    r = _fresh_python("import sys, reference.numpy as r; from reference.numpy import merge_states; "
                      "print(sorted(m for m in sys.modules if m.startswith('reference.numpy.')))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['reference.numpy._validate', 'reference.numpy.merge']", r.stdout


@pytest.mark.triton_softmax
def test_triton_import_without_cuda_switches_to_interpreter_once():
    code = (
        "import os, importlib\n"
        "assert 'TRITON_INTERPRET' not in os.environ\n"
        "import reference.triton as t\n"
        "import reference.triton.fused_softmax as fs, reference.triton.flash_fwd, reference.triton.flash_bwd\n"
        "import reference.triton.flash_autograd, reference.triton.decode, reference.triton.paged\n"
        "from reference.triton import softmax, flash_attention_forward, flash_attention, flash_decode, paged_decode\n"
        "importlib.import_module('reference.triton._runtime')\n"
        "from triton.runtime.interpreter import InterpretedFunction\n"
        "print(os.environ['TRITON_INTERPRET'], t.INTERPRET, t.DEVICE.type, t.HAS_CUDA,\n"
        "      isinstance(fs._softmax_rows, InterpretedFunction), t.num_sms())\n"
    )
    r = _fresh_python(code, CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True", "cpu", "False", "True", "132"], r.stdout
    notice = "reference.triton: no CUDA device found; kernels run in the Triton interpreter"
    assert r.stderr.count(notice) == 1, r.stderr


# ----------------------------------------------------------------------------------------------------------------
# 3. bad input: one table
# ----------------------------------------------------------------------------------------------------------------
OTHER_DEVICE = "meta" if INTERPRET else "cpu"  # a device that is not reference.triton.DEVICE


class D:
    """An edit value derived from the (already built) good inputs: ``D(lambda kw: kw["k"][..., :4])``."""

    def __init__(self, fn):
        self.fn = fn


def _nf(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _tf(rng, *shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE)


def _it(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _base_flash_bwd(rng):
    kw = dict(q=_nf(rng, 1, 4, 5, 8), k=_nf(rng, 1, 2, 7, 8), v=_nf(rng, 1, 2, 7, 8))
    kw["o"], kw["lse"] = np_attention.attention(**kw, return_lse=True)
    kw["do"] = _nf(rng, 1, 4, 5, 8)
    return kw


def _base_tr_flash_bwd(rng):
    kw = dict(q=_tf(rng, 1, 4, 5, 16), k=_tf(rng, 1, 2, 7, 16), v=_tf(rng, 1, 2, 7, 16))
    kw["o"], kw["lse"] = rtr.flash_attention_forward(**kw)
    kw["do"] = _tf(rng, 1, 4, 5, 16)
    return kw


BASES = {
    "x": lambda r: dict(x=_nf(r, 3, 10)),
    "stats": lambda r: dict(m1=_nf(r, 3), l1=_nf(r, 3) ** 2, m2=_nf(r, 3), l2=_nf(r, 3) ** 2),
    "qkv": lambda r: dict(q=_nf(r, 1, 4, 5, 8), k=_nf(r, 1, 2, 7, 8), v=_nf(r, 1, 2, 7, 8)),
    "qkv_do": lambda r: dict(q=_nf(r, 1, 4, 5, 8), k=_nf(r, 1, 2, 7, 8), v=_nf(r, 1, 2, 7, 8),
                             do=_nf(r, 1, 4, 5, 8)),
    "mask": lambda r: dict(nq=3, nk=4),
    "mha": lambda r: dict(x=_nf(r, 2, 5, 16), w_q=_nf(r, 16, 16), w_k=_nf(r, 16, 8), w_v=_nf(r, 16, 8),
                          w_o=_nf(r, 16, 16), n_heads=4, n_kv_heads=2),
    "flash_bwd": _base_flash_bwd,
    "merge": lambda r: dict(o_a=_nf(r, 2, 5, 8), lse_a=_nf(r, 2, 5), o_b=_nf(r, 2, 5, 8), lse_b=_nf(r, 2, 5)),
    "merge_many": lambda r: dict(os=[_nf(r, 5, 8), _nf(r, 5, 8)], lses=[_nf(r, 5), _nf(r, 5)]),
    "decode": lambda r: dict(q=_nf(r, 2, 4, 8), k=_nf(r, 2, 2, 9, 8), v=_nf(r, 2, 2, 9, 8),
                             seq_lens=np.array([9, 4])),
    "kv_cache": lambda r: dict(max_len=4, n_kv_heads=2, head_dim=8),
    "kv_append": lambda r: dict(k=_nf(r, 2, 1, 8), v=_nf(r, 2, 1, 8)),
    "layer": lambda r: dict(d_model=32, n_heads=4, n_kv_heads=2, dtype=np.float32),
    "savings": lambda r: dict(prompt_len=8, new_tokens=4, d_model=32, n_heads=4, n_kv_heads=2),
    "allocator": lambda r: dict(num_blocks=3),
    "alloc_free": lambda r: dict(block=0),
    "paged_cache": lambda r: dict(num_blocks=4, block_size=2, n_kv_heads=2, head_dim=8, dtype=np.float32),
    "paged_append": lambda r: dict(seq_id=0, k=_nf(r, 3, 2, 8), v=_nf(r, 3, 2, 8)),
    "paged_add": lambda r: dict(seq_id=1),
    "paged_fork": lambda r: dict(parent_id=0, child_id=1),
    "paged_tables": lambda r: dict(seq_ids=[0], max_blocks=3),
    "paged": lambda r: dict(q=_nf(r, 2, 4, 8), k_cache=_nf(r, 4, 2, 2, 8), v_cache=_nf(r, 4, 2, 2, 8),
                            block_tables=np.array([[0, 1], [2, -1]], np.int32), seq_lens=np.array([3, 2], np.int32)),
    "io": lambda r: dict(batch=1, heads=2, seq_len=64, head_dim=16),
    "block_sizes": lambda r: dict(seq_len=64, head_dim=16),
    "matmul_io": lambda r: dict(m=8, n=8, k=8),
    "tile_visits": lambda r: dict(nq=8, nk=8, block_q=4, block_k=4, causal=True),
    "outliers": lambda r: dict(rng=np.random.default_rng(0), shape=(4, 4)),
    "fp8_exp": lambda r: dict(rng=np.random.default_rng(0), n=16, d=8, n_heads=1),
    "pingpong": lambda r: dict(mma_cycles=2, exp_cycles=1, overlap=False),
    "persistent": lambda r: dict(n_tiles=8, n_sms=2, mainloop=3, prologue=1, epilogue=1, persistent=False),
    "simulate": lambda r: dict(requests=fragmentation.make_requests(4, seed=1), policy="paged", pool_tokens=4096,
                               block_size=16, record_trace=True),
    # Triton (torch tensors on reference.triton.DEVICE; d must be a compiled head dim)
    "t_x": lambda r: dict(x=_tf(r, 4, 8)),
    "t_qkv": lambda r: dict(q=_tf(r, 1, 4, 5, 16), k=_tf(r, 1, 2, 7, 16), v=_tf(r, 1, 2, 7, 16)),
    "t_flash_bwd": _base_tr_flash_bwd,
    "t_decode": lambda r: dict(q=_tf(r, 2, 4, 16), k=_tf(r, 2, 2, 9, 16), v=_tf(r, 2, 2, 9, 16),
                               seq_lens=_it([9, 4])),
    "t_paged": lambda r: dict(q=_tf(r, 2, 4, 16), k_cache=_tf(r, 4, 2, 2, 16), v_cache=_tf(r, 4, 2, 2, 16),
                              block_tables=_it([[0, 1], [2, -1]]), seq_lens=_it([3, 2])),
}


def _kv_append(**kw):
    decoding.KVCache(4, 2, 8).append(**kw)


def _alloc_free(**kw):
    a = paged.BlockAllocator(3)
    a.allocate()
    a.free(**kw)


def _paged_cache_with_seq():
    c = paged.PagedKVCache(4, 2, 2, 8)
    c.add_sequence(0)
    return c


def _paged_append(**kw):
    _paged_cache_with_seq().append(**kw)


def _paged_fork(**kw):
    _paged_cache_with_seq().fork(**kw)


def _paged_add(**kw):
    _paged_cache_with_seq().add_sequence(**kw)


def _paged_tables(**kw):
    return _paged_cache_with_seq().block_tables(**kw)


def _np_nan(shape_of):
    return D(lambda kw: np.full_like(kw[shape_of], np.nan))


CASES = [
    # marker, function, base, edit, exception, regex naming the argument
    # --- reference.numpy.softmax
    ("safe_softmax", softmax.safe_softmax, "x", dict(x=np.ones(3, bool)), TypeError, r"^x must have dtype"),
    ("safe_softmax", softmax.safe_softmax, "x", dict(x=[1, 2, 3]), TypeError, r"^x must be a floating"),
    ("safe_softmax", softmax.safe_softmax, "x", dict(x=np.float32(1.0)), ValueError, r"^x must have at least 1"),
    ("safe_softmax", softmax.safe_softmax, "x", dict(x=np.ones(3, complex)), TypeError, r"^x must have dtype"),
    ("safe_softmax", softmax.safe_softmax, "x", dict(x=torch.ones(3)), TypeError, r"^x must be a numpy"),
    ("naive_softmax", softmax.naive_softmax, "x", dict(axis=5), ValueError, r"^axis must be in"),
    ("naive_softmax", softmax.naive_softmax, "x", dict(axis=1.0), TypeError, r"^axis must be an integer"),
    ("naive_softmax", softmax.naive_softmax, "x", dict(x=np.arange(3)), TypeError, r"^x must have dtype"),
    ("online_softmax", softmax.online_softmax, "x", dict(block_size=0), ValueError, r"^block_size must be a pos"),
    ("online_softmax", softmax.online_softmax, "x", dict(block_size=-3), ValueError, r"^block_size"),
    ("online_softmax", softmax.online_softmax, "x", dict(block_size=2.5), TypeError, r"^block_size"),
    ("online_softmax", softmax.online_softmax, "x", dict(block_size=True), TypeError, r"^block_size"),
    ("online_softmax", softmax.online_softmax, "x", dict(x=np.ones((2, 3), np.int32)), TypeError, r"^x must"),
    ("softmax_stats", softmax.softmax_stats, "x", dict(x=np.arange(3)), TypeError, r"^x must have dtype"),
    ("softmax_stats", softmax.merge_softmax_stats, "stats", dict(l2=np.ones(4, np.float32)), ValueError,
     r"^l2 must have the same shape as m1"),
    ("softmax_stats", softmax.merge_softmax_stats, "stats", dict(m1=np.zeros(3, int)), TypeError, r"^m1 must"),
    # --- reference.numpy.attention
    ("attention", np_attention.attention, "qkv", dict(k=D(lambda kw: kw["k"][..., :4]), v=D(lambda kw: kw["v"][..., :4])),
     ValueError, r"same head dimension d, got q d=8 and k d=4"),
    ("attention", np_attention.attention, "qkv", dict(k=D(lambda kw: np.concatenate([kw["k"], kw["k"][:, :1]], 1)),
                                                     v=D(lambda kw: np.concatenate([kw["v"], kw["v"][:, :1]], 1))),
     ValueError, r"Hq=4 must be a multiple of the kv heads Hkv=3"),
    ("attention", np_attention.attention, "qkv", dict(k=D(lambda kw: np.concatenate([kw["k"]] * 2)),
                                                     v=D(lambda kw: np.concatenate([kw["v"]] * 2))),
     ValueError, r"q and k must have the same batch dimensions.*nothing is broadcast"),
    ("attention", np_attention.attention, "qkv", dict(k=D(lambda kw: kw["k"][0]), v=D(lambda kw: kw["v"][0])),
     ValueError, r"q, k and v must have the same rank"),
    ("attention", np_attention.attention, "qkv", dict(q=D(lambda kw: kw["q"].astype(np.int64))), TypeError,
     r"^q must have dtype"),
    ("attention", np_attention.attention, "qkv", dict(v=D(lambda kw: kw["v"] > 0)), TypeError, r"^v must have dtype"),
    ("attention", np_attention.attention, "qkv", dict(q=np.ones(8, np.float32)), ValueError, r"^q must have at least 2"),
    ("attention", np_attention.attention, "qkv", dict(v=D(lambda kw: kw["v"][:, :, :6])), ValueError,
     r"k and v must have the same shape"),
    ("attention", np_attention.attention, "qkv", dict(q=torch.zeros(1, 4, 5, 8)), TypeError, r"^q must be a numpy"),
    ("attention", np_attention.attention, "qkv", dict(scale=float("nan")), ValueError, r"^scale must be finite"),
    ("attention", np_attention.attention, "qkv", dict(scale=float("inf")), ValueError, r"^scale must be finite"),
    ("attention", np_attention.attention, "qkv", dict(scale="0.5"), TypeError, r"^scale must be a real number"),
    ("attention", np_attention.attention, "qkv", dict(causal=1), TypeError, r"^causal must be a bool"),
    ("attention", np_attention.attention, "qkv", dict(return_lse=1), TypeError, r"^return_lse must be a bool"),
    ("attention_backward", np_attention.attention_backward, "qkv_do", dict(do=D(lambda kw: kw["do"][..., :4])),
     ValueError, r"^do must have the shape of q"),
    ("attention_backward", np_attention.attention_backward, "qkv_do", dict(do=np.zeros((1, 4, 5, 8), int)),
     TypeError, r"^do must have dtype"),
    ("attention_backward", np_attention.attention_backward, "qkv_do", dict(causal="yes"), TypeError, r"^causal"),
    ("causal_mask", np_attention.causal_mask, "mask", dict(nq=0), ValueError, r"^nq must be a positive integer"),
    ("causal_mask", np_attention.causal_mask, "mask", dict(nk=2.0), TypeError, r"^nk must be a positive integer"),
    ("multi_head_attention", np_attention.multi_head_attention, "mha", dict(n_kv_heads=3), ValueError,
     r"n_heads=4 must be a multiple of the kv heads n_kv_heads=3"),
    ("multi_head_attention", np_attention.multi_head_attention, "mha", dict(n_heads=0), ValueError, r"^n_heads must"),
    ("multi_head_attention", np_attention.multi_head_attention, "mha", dict(w_k=D(lambda kw: kw["w_k"][:, :4])),
     ValueError, r"^w_k must have shape"),
    ("multi_head_attention", np_attention.multi_head_attention, "mha", dict(w_o=D(lambda kw: kw["w_o"][None])),
     ValueError, r"^w_o must be a 2-D matrix"),
    ("multi_head_attention", np_attention.multi_head_attention, "mha", dict(x=np.ones((2, 5, 16), int)), TypeError,
     r"^x must have dtype"),
    ("multi_head_attention", np_attention.multi_head_attention, "mha", dict(causal=1), TypeError, r"^causal"),
    # --- reference.numpy.flash
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(block_q=0), ValueError, r"^block_q must be a pos"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(block_k=-1), ValueError, r"^block_k must be a pos"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(block_k=16.0), TypeError, r"^block_k must be a pos"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(block_q=True), TypeError, r"^block_q must be a pos"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(k=D(lambda kw: kw["k"][..., :4]),
                                                                v=D(lambda kw: kw["v"][..., :4])),
     ValueError, r"same head dimension d"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(k=D(lambda kw: np.concatenate([kw["k"]] * 3, 1)),
                                                                v=D(lambda kw: np.concatenate([kw["v"]] * 3, 1))),
     ValueError, r"Hq=4 must be a multiple of the kv heads Hkv=6"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(q=D(lambda kw: kw["q"].astype(np.int32))), TypeError,
     r"^q must have dtype"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(scale=float("nan")), ValueError, r"^scale"),
    ("flash_forward", flash.flash_attention_forward, "qkv", dict(causal=None), TypeError, r"^causal must be a bool"),
    ("flash_backward", flash.flash_attention_backward, "flash_bwd", dict(lse=D(lambda kw: kw["lse"][..., :-1])),
     ValueError, r"^lse must have shape"),
    ("flash_backward", flash.flash_attention_backward, "flash_bwd", dict(lse=D(lambda kw: kw["lse"].astype(int))),
     TypeError, r"^lse must have dtype"),
    ("flash_backward", flash.flash_attention_backward, "flash_bwd", dict(lse=_np_nan("lse")), ValueError,
     r"^lse must be finite or -inf"),
    ("flash_backward", flash.flash_attention_backward, "flash_bwd", dict(o=D(lambda kw: kw["o"][..., :4])),
     ValueError, r"^o must have the shape of q"),
    ("flash_backward", flash.flash_attention_backward, "flash_bwd", dict(do=D(lambda kw: kw["do"].astype(int))),
     TypeError, r"^do must have dtype"),
    ("flash_backward", flash.flash_attention_backward, "flash_bwd", dict(block_k=0), ValueError, r"^block_k"),
    # --- reference.numpy.merge
    ("merge_states", merge.merge_states, "merge", dict(lse_a=D(lambda kw: kw["lse_a"][:, :4])), ValueError,
     r"^lse_a must have shape"),
    ("merge_states", merge.merge_states, "merge", dict(o_b=D(lambda kw: kw["o_b"][..., :4])), ValueError,
     r"o_a and o_b must have the same shape"),
    ("merge_states", merge.merge_states, "merge", dict(lse_b=_np_nan("lse_b")), ValueError, r"^lse_b must be finite"),
    ("merge_states", merge.merge_states, "merge", dict(o_a=D(lambda kw: kw["o_a"].astype(int))), TypeError,
     r"^o_a must have dtype"),
    ("merge_states", merge.merge_states, "merge", dict(o_a=D(lambda kw: kw["o_a"][0, 0]),
                                                      lse_a=D(lambda kw: kw["lse_a"][0, 0])),
     ValueError, r"^o_a must have at least 2"),
    ("merge_states", merge.merge_many, "merge_many", dict(os=[], lses=[]), ValueError, r"^os must hold at least one"),
    ("merge_states", merge.merge_many, "merge_many", dict(lses=D(lambda kw: kw["lses"][:1])), ValueError,
     r"^os and lses must have the same length"),
    ("merge_states", merge.merge_many, "merge_many", dict(os=3, lses=4), TypeError, r"^os and lses must be sequences"),
    ("merge_states", merge.merge_many, "merge_many", dict(os=D(lambda kw: [kw["os"][0], kw["os"][1][:, :4]])),
     ValueError, r"os\[1\] is"),
    ("merge_states", merge.merge_many, "merge_many", dict(lses=D(lambda kw: [kw["lses"][0], kw["lses"][1][:4]])),
     ValueError, r"^lses\[1\] must have shape"),
    # --- reference.numpy.decoding
    ("flash_decoding", decoding.flash_decoding, "decode", dict(q=D(lambda kw: kw["q"][:, :, None])), ValueError,
     r"^q must have shape \(B, Hq, d\)"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(k=D(lambda kw: kw["k"][0])), ValueError,
     r"^k must have shape \(B, Hkv, Nmax, d\)"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(v=D(lambda kw: kw["v"][..., :5, :])), ValueError,
     r"k and v must have the same shape"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(k=D(lambda kw: kw["k"][:1]), v=D(lambda kw: kw["v"][:1])),
     ValueError, r"same batch dimensions"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(k=D(lambda kw: kw["k"][:, :1].repeat(3, 1)),
                                                              v=D(lambda kw: kw["v"][:, :1].repeat(3, 1))),
     ValueError, r"Hq=4 must be a multiple of the kv heads Hkv=3"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(k=D(lambda kw: kw["k"][..., :4]),
                                                              v=D(lambda kw: kw["v"][..., :4])),
     ValueError, r"same head dimension d"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(num_splits=0), ValueError, r"^num_splits must be a pos"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(num_splits=2.0), TypeError, r"^num_splits"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(num_splits=None), TypeError, r"^num_splits"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(num_splits=True), TypeError, r"^num_splits"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=np.array([3, 10])), ValueError,
     r"^seq_lens entries must lie in \[0, 9\]"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=np.array([3, -1])), ValueError,
     r"^seq_lens entries must lie in"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=np.array([[3, 1]])), ValueError,
     r"^seq_lens must have shape \(B,\) = \(2,\)"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=np.array([3])), ValueError,
     r"^seq_lens must have shape \(B,\)"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=np.array([3.0, 1.0])), TypeError,
     r"^seq_lens must hold integers"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=np.array([True, False])), TypeError,
     r"^seq_lens must hold integers"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=3), TypeError, r"^seq_lens must be a 1-D"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(seq_lens=torch.tensor([3, 3])), TypeError,
     r"^seq_lens must be a 1-D"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(scale=float("nan")), ValueError, r"^scale"),
    ("flash_decoding", decoding.flash_decoding, "decode", dict(q=D(lambda kw: kw["q"].astype(np.int32))), TypeError,
     r"^q must have dtype"),
    ("kv_cache", decoding.KVCache, "kv_cache", dict(max_len=0), ValueError, r"^max_len must be a positive"),
    ("kv_cache", decoding.KVCache, "kv_cache", dict(head_dim=1.5), TypeError, r"^head_dim must be a positive"),
    ("kv_cache", decoding.KVCache, "kv_cache", dict(dtype=np.int32), TypeError, r"^dtype must be float16"),
    ("kv_cache", decoding.KVCache, "kv_cache", dict(dtype=None), TypeError, r"^dtype must be float16"),
    ("kv_cache", decoding.KVCache, "kv_cache", dict(dtype="bogus"), TypeError, r"^dtype must be float16"),
    ("kv_cache", decoding.KVCache, "kv_cache", dict(batch_size=0), ValueError, r"^batch_size must be a positive"),
    ("kv_cache", _kv_append, "kv_append", dict(k=D(lambda kw: kw["k"][..., :4])), ValueError,
     r"^k must have shape \(Hkv, T, d\)"),
    ("kv_cache", _kv_append, "kv_append", dict(k=D(lambda kw: kw["k"][None])), ValueError, r"^k must have shape"),
    ("kv_cache", _kv_append, "kv_append", dict(v=np.zeros((2, 1, 8), int)), TypeError, r"^v must have dtype"),
    ("kv_cache", _kv_append, "kv_append", dict(v=D(lambda kw: np.concatenate([kw["v"]] * 2, 1))), ValueError,
     r"k and v must have the same shape"),
    ("kv_cache", decoder_layer.TinyDecoderLayer, "layer", dict(dtype=None), TypeError, r"^dtype must be float16"),
    ("kv_cache", decoder_layer.TinyDecoderLayer, "layer", dict(dtype=np.int32), TypeError, r"^dtype must be float16"),
    ("kv_cache", decoder_layer.TinyDecoderLayer, "layer", dict(d_model=30), ValueError, r"d_model=30 must be a mult"),
    ("kv_cache", decoder_layer.TinyDecoderLayer, "layer", dict(n_kv_heads=3), ValueError, r"n_kv_heads=3"),
    ("kv_cache", decoder_layer.cache_savings, "savings", dict(n_kv_heads=3), ValueError, r"n_kv_heads=3"),
    ("kv_cache", decoder_layer.cache_savings, "savings", dict(n_heads=0), ValueError, r"^n_heads must be a pos"),
    ("kv_cache", decoder_layer.cache_savings, "savings", dict(d_model=30), ValueError, r"d_model=30"),
    # --- reference.numpy.paged
    ("block_allocator", paged.BlockAllocator, "allocator", dict(num_blocks=0), ValueError, r"^num_blocks must be a"),
    ("block_allocator", paged.BlockAllocator, "allocator", dict(num_blocks=2.0), TypeError, r"^num_blocks must be a"),
    ("block_allocator", _alloc_free, "alloc_free", dict(block=5), ValueError, r"^block must be in \[0, 3\)"),
    ("block_allocator", _alloc_free, "alloc_free", dict(block=-1), ValueError, r"^block must be in"),
    ("block_allocator", _alloc_free, "alloc_free", dict(block=0.0), TypeError, r"^block must be an integer"),
    ("block_allocator", _alloc_free, "alloc_free", dict(block=1), ValueError, r"double free: block 1"),
    ("paged_kv_cache", paged.PagedKVCache, "paged_cache", dict(block_size=0), ValueError, r"^block_size must be a"),
    ("paged_kv_cache", paged.PagedKVCache, "paged_cache", dict(n_kv_heads=-2), ValueError, r"^n_kv_heads must be"),
    ("paged_kv_cache", paged.PagedKVCache, "paged_cache", dict(dtype=np.int64), TypeError, r"^dtype must be float16"),
    ("paged_kv_cache", paged.PagedKVCache, "paged_cache", dict(dtype=None), TypeError, r"^dtype must be float16"),
    ("paged_kv_cache", _paged_append, "paged_append", dict(k=D(lambda kw: kw["k"][..., :4])), ValueError,
     r"^k must have shape \(T, Hkv, d\)"),
    ("paged_kv_cache", _paged_append, "paged_append", dict(v=np.zeros((3, 2, 8), int)), TypeError, r"^v must have"),
    ("paged_kv_cache", _paged_append, "paged_append", dict(v=D(lambda kw: kw["v"][:2])), ValueError,
     r"k and v must have the same shape"),
    ("paged_kv_cache", _paged_append, "paged_append", dict(seq_id=9), ValueError, r"^seq_id 9 is not a sequence"),
    ("paged_kv_cache", _paged_add, "paged_add", dict(seq_id=0), ValueError, r"^seq_id 0 already exists"),
    ("paged_kv_cache", _paged_add, "paged_add", dict(seq_id={}), TypeError, r"^seq_id must be hashable"),
    ("paged_kv_cache", _paged_fork, "paged_fork", dict(parent_id=9), ValueError, r"^parent_id 9 is not a sequence"),
    ("paged_kv_cache", _paged_fork, "paged_fork", dict(child_id=0), ValueError, r"^child_id 0 already exists"),
    ("paged_kv_cache", _paged_fork, "paged_fork", dict(child_id=[1]), TypeError, r"^child_id must be hashable"),
    ("paged_kv_cache", _paged_tables, "paged_tables", dict(max_blocks=2.0), TypeError, r"^max_blocks must be an int"),
    ("paged_kv_cache", _paged_tables, "paged_tables", dict(max_blocks=-1), ValueError, r"^max_blocks must be at"),
    ("paged_kv_cache", _paged_tables, "paged_tables", dict(seq_ids=[7]), ValueError, r"^seq_id 7 is not"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=np.array([[0, -1, 1], [2, -1, -1]], np.int32),
                                                            seq_lens=np.array([1, 2], np.int32)),
     ValueError, r"^block_tables row 0 has a valid block after a -1"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=D(lambda kw: kw["block_tables"].astype(float))),
     TypeError, r"^block_tables must hold integers"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=D(lambda kw: kw["block_tables"] > 0)),
     TypeError, r"^block_tables must hold integers"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=D(lambda kw: kw["block_tables"][0])),
     ValueError, r"^block_tables must have shape \(B, max_blocks\)"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=D(lambda kw: kw["block_tables"][:1])),
     ValueError, r"^block_tables must have shape \(B, max_blocks\) with B=2"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=[[0, 1], [2, -1]]), TypeError,
     r"^block_tables must be a numpy integer array"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=np.array([[0, 9], [2, -1]], np.int32)),
     ValueError, r"^block_tables entries must be -1 \(padding\) or in \[0, 4\)"),
    ("paged_attention", paged.paged_attention, "paged", dict(block_tables=np.array([[0, 1], [2, -2]], np.int32)),
     ValueError, r"^block_tables entries must be -1"),
    ("paged_attention", paged.paged_attention, "paged", dict(seq_lens=np.array([5, 2])), ValueError,
     r"^seq_lens entries must lie in \[0, 4\]"),
    ("paged_attention", paged.paged_attention, "paged", dict(seq_lens=np.array([3, 3])), ValueError,
     r"^block_tables row 1 has 1 block\(s\) but seq_lens\[1\]=3 needs 2"),
    ("paged_attention", paged.paged_attention, "paged", dict(seq_lens=np.array([3.0, 2.0])), TypeError,
     r"^seq_lens must hold integers"),
    ("paged_attention", paged.paged_attention, "paged", dict(seq_lens=np.array([[3, 2]])), ValueError,
     r"^seq_lens must have shape \(B,\)"),
    ("paged_attention", paged.paged_attention, "paged", dict(seq_lens=None), TypeError, r"^seq_lens must be a 1-D"),
    ("paged_attention", paged.paged_attention, "paged", dict(k_cache=D(lambda kw: kw["k_cache"][..., :4]),
                                                            v_cache=D(lambda kw: kw["v_cache"][..., :4])),
     ValueError, r"q and k_cache must have the same head dimension d"),
    ("paged_attention", paged.paged_attention, "paged", dict(q=D(lambda kw: kw["q"][:, :3])), ValueError,
     r"Hq=3 must be a multiple of the kv heads Hkv=2"),
    ("paged_attention", paged.paged_attention, "paged", dict(v_cache=D(lambda kw: kw["v_cache"][:3])), ValueError,
     r"^v_cache must have the shape of k_cache"),
    ("paged_attention", paged.paged_attention, "paged", dict(q=D(lambda kw: kw["q"][:, :, None])), ValueError,
     r"^q must have shape \(B, Hq, d\)"),
    ("paged_attention", paged.paged_attention, "paged", dict(k_cache=D(lambda kw: kw["k_cache"][0])), ValueError,
     r"^k_cache must have shape \(num_blocks, block_size, Hkv, d\)"),
    ("paged_attention", paged.paged_attention, "paged", dict(q=D(lambda kw: kw["q"].astype(int))), TypeError,
     r"^q must have dtype"),
    ("paged_attention", paged.paged_attention, "paged", dict(scale=float("nan")), ValueError, r"^scale"),
    # --- reference.simulators.iosim
    ("iosim", iosim.standard_attention_io, "io", dict(batch=0), ValueError, r"^batch must be a positive integer"),
    ("iosim", iosim.standard_attention_io, "io", dict(heads=1.5), TypeError, r"^heads must be a positive integer"),
    ("iosim", iosim.standard_attention_io, "io", dict(dtype="int8"), ValueError, r"^dtype must be one of"),
    ("iosim", iosim.standard_attention_io, "io", dict(dtype=np.int32), TypeError, r"^dtype must be a floating"),
    ("iosim", iosim.standard_attention_io, "io", dict(dtype=None), TypeError, r"^dtype must be a dtype name"),
    ("iosim", iosim.standard_attention_io, "io", dict(backward=1), TypeError, r"^backward must be a bool"),
    ("iosim", iosim.flash_attention_io, "io", dict(sram_bytes=0), ValueError, r"^sram_bytes must be a positive"),
    ("iosim", iosim.flash_attention_io, "io", dict(sram_bytes=16), ValueError, r"^sram_bytes=16 holds"),
    ("iosim", iosim.flash_attention_io, "io", dict(version="fa3"), ValueError, r"^version must be 'fa1' or 'fa2'"),
    ("iosim", iosim.flash_attention_io, "io", dict(causal=1), TypeError, r"^causal must be a bool"),
    ("iosim", iosim.flash_attention_io, "io", dict(dropout=1.0), ValueError, r"^dropout must be a probability"),
    ("iosim", iosim.flash_attention_io, "io", dict(dropout=float("nan")), ValueError, r"^dropout must be"),
    ("iosim", iosim.flash_attention_io, "io", dict(block_q=0), ValueError, r"^block_q must be a positive"),
    ("iosim", iosim.flash_block_sizes, "block_sizes", dict(version="x"), ValueError, r"^version must be"),
    ("iosim", iosim.flash_block_sizes, "block_sizes", dict(block_k=-4), ValueError, r"^block_k must be a pos"),
    ("iosim", iosim.matmul_io, "matmul_io", dict(algorithm="x"), ValueError, r"^algorithm must be"),
    ("iosim", iosim.matmul_io, "matmul_io", dict(tile=0), ValueError, r"^tile must be a positive"),
    # --- reference.simulators / reference.simulators.fragmentation (simulators used by the lectures)
    ("hopper", scheduling.tile_visits, "tile_visits", dict(causal=1), TypeError, r"^causal must be a bool"),
    ("hopper", scheduling.tile_visits, "tile_visits", dict(block_q=0), ValueError, r"^block_q must be a positive"),
    ("hopper", fp8_error.outlier_qkv, "outliers", dict(rng=0), TypeError, r"^rng must be a numpy.random.Generator"),
    ("hopper", fp8_error.outlier_qkv, "outliers", dict(outlier_frac=2), ValueError, r"^outlier_frac must be in"),
    ("hopper", fp8_error.outlier_qkv, "outliers", dict(outlier_frac="x"), TypeError, r"^outlier_frac must be a num"),
    ("hopper", fp8_error.fp8_incoherent_experiment, "fp8_exp", dict(rng=0), TypeError, r"^rng must be a numpy"),
    ("hopper", cycle_model.pingpong_utilisation, "pingpong", dict(overlap=2), TypeError, r"^overlap must be a bool"),
    ("hopper", cycle_model.persistent_time, "persistent", dict(persistent="no"), TypeError, r"^persistent must be a bool"),
    ("fragmentation", fragmentation.simulate, "simulate", dict(record_trace=1), TypeError, r"^record_trace must be"),
    ("fragmentation", fragmentation.simulate, "simulate", dict(policy="x"), ValueError, r"^policy must be one of"),
    ("fragmentation", fragmentation.simulate, "simulate", dict(block_size=None), ValueError, r"^block_size is req"),
    # --- reference.triton.softmax
    ("triton_softmax", rtr.softmax, "t_x", dict(x=D(lambda kw: kw["x"].to(torch.int32))), TypeError,
     r"^x must have dtype float16, bfloat16 or float32"),
    ("triton_softmax", rtr.softmax, "t_x", dict(x=D(lambda kw: kw["x"] > 0)), TypeError, r"^x must have dtype"),
    ("triton_softmax", rtr.softmax, "t_x", dict(x=D(lambda kw: kw["x"].double())), TypeError, r"^x must have dtype"),
    ("triton_softmax", rtr.softmax, "t_x", dict(x=np.ones(3, np.float32)), TypeError, r"^x must be a torch.Tensor"),
    ("triton_softmax", rtr.softmax, "t_x", dict(x=D(lambda kw: kw["x"][0, 0])), ValueError, r"^x must have at least"),
    ("triton_softmax", rtr.softmax, "t_x", dict(x=D(lambda kw: kw["x"].to(OTHER_DEVICE))), ValueError,
     r"^x must be on device"),
    ("triton_softmax", rtr.softmax, "t_x", dict(max_single=3), ValueError, r"^max_single must be a positive power"),
    ("triton_softmax", rtr.softmax, "t_x", dict(max_single=2.5), TypeError, r"^max_single must be a positive"),
    ("triton_softmax", rtr.softmax, "t_x", dict(max_single=True), TypeError, r"^max_single must be a positive"),
]
# --- reference.triton attention: the same checks for the forward and the differentiable version
_T_ATTN = [
    (dict(k=D(lambda kw: kw["k"].repeat(1, 1, 1, 2)), v=D(lambda kw: kw["v"].repeat(1, 1, 1, 2))), ValueError,
     r"same head dimension d, got q d=16 and k d=32"),
    (dict(q=D(lambda kw: kw["q"][..., :8]), k=D(lambda kw: kw["k"][..., :8]), v=D(lambda kw: kw["v"][..., :8])),
     ValueError, r"^head dimension d \(q.shape\[-1\]\) must be one of \(16, 32, 64, 128\)"),
    (dict(k=D(lambda kw: kw["k"][:, :1].repeat(1, 3, 1, 1)), v=D(lambda kw: kw["v"][:, :1].repeat(1, 3, 1, 1))),
     ValueError, r"Hq=4 must be a multiple of the kv heads Hkv=3"),
    (dict(k=D(lambda kw: kw["k"].repeat(2, 1, 1, 1)), v=D(lambda kw: kw["v"].repeat(2, 1, 1, 1))), ValueError,
     r"q and k must have the same batch size.*nothing is broadcast"),
    (dict(q=D(lambda kw: kw["q"][0]), k=D(lambda kw: kw["k"][0]), v=D(lambda kw: kw["v"][0])), ValueError,
     r"^q must have 4 dimensions"),
    (dict(q=D(lambda kw: kw["q"].to(torch.int32))), TypeError, r"^q must have dtype"),
    (dict(k=D(lambda kw: kw["k"] > 0)), TypeError, r"^k must have dtype"),
    (dict(q=D(lambda kw: kw["q"].double()), k=D(lambda kw: kw["k"].double()), v=D(lambda kw: kw["v"].double())),
     TypeError, r"^q must have dtype float16, bfloat16 or float32"),
    (dict(q=D(lambda kw: kw["q"].half())), TypeError, r"^q, k, v must have the same dtype"),
    (dict(v=D(lambda kw: kw["v"].bfloat16())), TypeError, r"^q, k, v must have the same dtype"),
    (dict(k=D(lambda kw: kw["k"].to(OTHER_DEVICE))), ValueError, r"^k must be on device"),
    (dict(v=D(lambda kw: kw["v"][:, :, :6])), ValueError, r"k and v must have the same shape \(B, Hkv, Nk, d\)"),
    (dict(q=D(lambda kw: kw["q"][:, :, :0])), ValueError, r"q and k need B, H, N >= 1"),
    (dict(q=D(lambda kw: kw["q"].numpy(force=True))), TypeError, r"^q must be a torch.Tensor"),
    (dict(scale=float("nan")), ValueError, r"^scale must be finite"),
    (dict(scale=torch.tensor(0.5)), TypeError, r"^scale must be a real number"),
    (dict(causal=1), TypeError, r"^causal must be a bool"),
]
for _edit, _exc, _match in _T_ATTN:
    CASES.append(("triton_flash_forward", rtr.flash_attention_forward, "t_qkv", _edit, _exc, _match))
    CASES.append(("triton_flash_backward", rtr.flash_attention, "t_qkv", _edit, _exc, _match))
CASES += [
    ("triton_flash_backward", tr_flash_backward, "t_flash_bwd", dict(lse=D(lambda kw: kw["lse"][..., :-1])),
     ValueError, r"^lse must have shape \(B, Hq, Nq\)"),
    ("triton_flash_backward", tr_flash_backward, "t_flash_bwd", dict(lse=D(lambda kw: kw["lse"].half())), TypeError,
     r"^lse must have dtype float32"),
    ("triton_flash_backward", tr_flash_backward, "t_flash_bwd", dict(do=D(lambda kw: kw["do"][..., :8])),
     ValueError, r"^do must have q's shape"),
    ("triton_flash_backward", tr_flash_backward, "t_flash_bwd", dict(do=D(lambda kw: kw["do"].half())), TypeError,
     r"^q, o, do must have the same dtype"),
    ("triton_flash_backward", tr_flash_backward, "t_flash_bwd", dict(lse=D(lambda kw: kw["lse"].to(OTHER_DEVICE))),
     ValueError, r"^lse must be on device"),
    ("triton_flash_backward", tr_flash_backward, "t_flash_bwd", dict(causal=0), TypeError, r"^causal must be a bool"),
    # --- reference.triton.flash_decode
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(q=D(lambda kw: kw["q"][:, :, None])), ValueError,
     r"^q must have 3 dimensions"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(q=D(lambda kw: kw["q"][:, :, :8])), ValueError,
     r"^head dimension d \(q.shape\[-1\]\) must be one of"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(k=D(lambda kw: kw["k"][0])), ValueError,
     r"^k must have 4 dimensions"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(k=D(lambda kw: kw["k"][:1]), v=D(lambda kw: kw["v"][:1])),
     ValueError, r"^k must have batch size B=2"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(k=D(lambda kw: kw["k"][:, :1].repeat(1, 3, 1, 1)),
                                                              v=D(lambda kw: kw["v"][:, :1].repeat(1, 3, 1, 1))),
     ValueError, r"Hq=4 must be a multiple of the kv heads Hkv=3"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(k=D(lambda kw: kw["k"].repeat(1, 1, 1, 2)),
                                                              v=D(lambda kw: kw["v"].repeat(1, 1, 1, 2))),
     ValueError, r"same head dimension d, got q d=16 and k d=32"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(v=D(lambda kw: kw["v"][:, :, :5])), ValueError,
     r"k and v must have the same shape \(B, Hkv, Nmax, d\)"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(k=D(lambda kw: kw["k"][:, :, :0]),
                                                              v=D(lambda kw: kw["v"][:, :, :0]), seq_lens=None),
     ValueError, r"Nmax >= 1"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(num_splits=0), ValueError, r"^num_splits must be a"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(num_splits=2.0), TypeError, r"^num_splits must be a"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(num_splits=True), TypeError, r"^num_splits must be a"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=_it([3, 10])), ValueError,
     r"^seq_lens must lie in \[0, 9\]"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=_it([3, -1])), ValueError,
     r"^seq_lens must lie in"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=_it([[3, 1]])), ValueError,
     r"^seq_lens must have 1 dimensions"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=_it([3])), ValueError,
     r"^seq_lens must have shape \(B,\) = \(2,\)"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=_it([3, 1], torch.float32)), TypeError,
     r"^seq_lens must have dtype int32 or int64"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=_it([3, 1], torch.int16)), TypeError,
     r"^seq_lens must have dtype"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=_it([True, False], torch.bool)), TypeError,
     r"^seq_lens must have dtype"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=[3, 1]), TypeError,
     r"^seq_lens must be a torch.Tensor"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=np.array([3, 1])), TypeError,
     r"^seq_lens must be a torch.Tensor"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(seq_lens=D(lambda kw: kw["seq_lens"].to(OTHER_DEVICE))),
     ValueError, r"^seq_lens must be on device"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(scale=float("nan")), ValueError, r"^scale must be"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(q=D(lambda kw: kw["q"].int())), TypeError,
     r"^q must have dtype"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(k=D(lambda kw: kw["k"].half())), TypeError,
     r"^q, k, v must have the same dtype"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(v=D(lambda kw: kw["v"].to(OTHER_DEVICE))), ValueError,
     r"^v must be on device"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", dict(validate="no"), TypeError,
     r"^validate must be a bool"),
    # --- reference.triton.paged_decode
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=_it([[0, -1, 1], [2, -1, -1]])),
     ValueError, r"^block_tables\[0, 1\] = -1 is not a block index in \[0, 4\)"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=_it([[0, 9], [2, -1]])), ValueError,
     r"^block_tables\[0, 1\] = 9 is not a block index"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=_it([[0, 1], [2, -1]], torch.float32)),
     TypeError, r"^block_tables must have dtype int32 or int64"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=_it([[0, 1], [2, 0]], torch.bool)),
     TypeError, r"^block_tables must have dtype"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=_it([0, 1])), ValueError,
     r"^block_tables must have 2 dimensions"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=_it([[0, 1]])), ValueError,
     r"^block_tables must have shape \(B, max_blocks\) with B=2"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=np.array([[0, 1], [2, -1]], np.int32)),
     TypeError, r"^block_tables must be a torch.Tensor"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(block_tables=D(lambda kw: kw["block_tables"][:, :0])),
     ValueError, r"^block_tables must have at least one column"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged",
     dict(block_tables=D(lambda kw: kw["block_tables"].to(OTHER_DEVICE))), ValueError, r"^block_tables must be on"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(seq_lens=_it([5, 2])), ValueError,
     r"^seq_lens must lie in \[0, 4\]"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(seq_lens=_it([3, 3])), ValueError,
     r"^block_tables\[1, 1\] = -1 is not a block index.*sequence 1 \(seq_lens 3\)"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(seq_lens=_it([3, 2], torch.float32)), TypeError,
     r"^seq_lens must have dtype"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(seq_lens=_it([[3, 2]])), ValueError,
     r"^seq_lens must have 1 dimensions"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(seq_lens=None), TypeError,
     r"^seq_lens must be a torch.Tensor"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(k_cache=D(lambda kw: kw["k_cache"].repeat(1, 1, 1, 2)),
                                                             v_cache=D(lambda kw: kw["v_cache"].repeat(1, 1, 1, 2))),
     ValueError, r"q and k_cache must have the same head dimension d"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(q=D(lambda kw: kw["q"][:, :3])), ValueError,
     r"Hq=3 must be a multiple of the kv heads Hkv=2"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(v_cache=D(lambda kw: kw["v_cache"][:3])), ValueError,
     r"k_cache and v_cache must have the same shape"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(q=D(lambda kw: kw["q"][:, :, None])), ValueError,
     r"^q must have 3 dimensions"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(k_cache=D(lambda kw: kw["k_cache"][0])), ValueError,
     r"^k_cache must have 4 dimensions"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(q=D(lambda kw: kw["q"].int())), TypeError,
     r"^q must have dtype"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(q=D(lambda kw: kw["q"].half())), TypeError,
     r"^q, k_cache, v_cache must have the same dtype"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(v_cache=D(lambda kw: kw["v_cache"].to(OTHER_DEVICE))),
     ValueError, r"^v_cache must be on device"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(scale=float("nan")), ValueError, r"^scale must be"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(num_splits=0), ValueError, r"^num_splits must be a"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", dict(validate=1), TypeError, r"^validate must be a bool"),
]


def _build(base: str, edit: dict, rng) -> dict:
    kw = BASES[base](rng)
    for name, value in edit.items():
        kw[name] = value.fn(kw) if isinstance(value, D) else value
    return kw


def _case_id(case) -> str:
    marker, fn, base, edit, exc, _ = case
    what = ",".join(f"{k}={'<derived>' if isinstance(v, D) else type(v).__name__ if hasattr(v, 'shape') else v!r}"
                    for k, v in edit.items())
    return f"{getattr(fn, '__qualname__', fn)}[{what}]"[:110]


@pytest.mark.parametrize("base", list(BASES))
def test_every_base_input_is_accepted(base, rng):
    """Each bad-input case edits one argument of these inputs, so unedited they must work."""
    fns = {c[1] for c in CASES if c[2] == base}
    assert fns, f"base {base} is unused"
    for fn in fns:
        fn(**_build(base, {}, rng))


@pytest.mark.parametrize("marker,fn,base,edit,exc,match",
                         [pytest.param(*c, marks=getattr(pytest.mark, c[0]), id=_case_id(c)) for c in CASES])
def test_bad_input_raises_naming_the_argument(marker, fn, base, edit, exc, match, rng):
    kw = _build(base, edit, rng)
    with pytest.raises(exc, match=match):
        fn(**kw)


# ----------------------------------------------------------------------------------------------------------------
# the q, k, v checks every NumPy attention entry point shares (reference.numpy._validate.check_qkv)
# ----------------------------------------------------------------------------------------------------------------
BAD_QKV = [
    ((np.zeros((4, 8)), np.zeros((4, 6)), np.zeros((4, 6))), ValueError, "same head dimension d"),
    ((np.zeros((1, 3, 4, 8)), np.zeros((1, 2, 4, 8)), np.zeros((1, 2, 4, 8))), ValueError,
     "Hq=3 must be a multiple of the kv heads Hkv=2"),
    ((np.zeros((4, 8), dtype=np.int32), np.zeros((4, 8)), np.zeros((4, 8))), TypeError,
     "q must have dtype float16, float32 or float64"),
    ((np.zeros(8), np.zeros(8), np.zeros(8)), ValueError, "q must have at least 2 dimension"),
    ((np.zeros((2, 4, 8)), np.zeros((4, 8)), np.zeros((4, 8))), ValueError, "same rank"),
    ((np.zeros((2, 2, 4, 8)), np.zeros((3, 2, 4, 8)), np.zeros((3, 2, 4, 8))), ValueError,
     "same batch dimensions"),
    ((np.zeros((4, 8)), np.zeros((5, 8)), np.zeros((6, 8))), ValueError, "k and v must have the same shape"),
    ((torch.zeros(1, 2), np.zeros((1, 2)), np.zeros((1, 2))), TypeError, "q must be a numpy.ndarray"),
]

_Z48 = np.zeros((4, 8))
QKV_ENTRY_POINTS = [
    ("attention", np_attention.attention),
    ("attention_backward", lambda q, k, v: np_attention.attention_backward(q, k, v, _Z48)),
    ("flash_forward", flash.flash_attention_forward),
    ("flash_backward", lambda q, k, v: flash.flash_attention_backward(q, k, v, _Z48, np.zeros(4), _Z48)),
]


@pytest.mark.parametrize("marker,fn", [pytest.param(m, f, marks=getattr(pytest.mark, m), id=m)
                                       for m, f in QKV_ENTRY_POINTS])
@pytest.mark.parametrize("args,exc,msg", BAD_QKV)
def test_numpy_qkv_checks(marker, fn, args, exc, msg):
    with pytest.raises(exc, match=msg):
        fn(*args)


BAD_BLOCKS = [(0, ValueError), (-64, ValueError), (64.0, TypeError), (True, TypeError), (None, TypeError)]


@pytest.mark.flash_forward
@pytest.mark.parametrize("bad,exc", BAD_BLOCKS)
@pytest.mark.parametrize("which", ["block_q", "block_k"])
def test_forward_bad_block_size(which, bad, exc):
    x = np.zeros((4, 8))
    with pytest.raises(exc, match=f"{which} must be a positive integer"):
        flash.flash_attention_forward(x, x, x, **{which: bad})


@pytest.mark.flash_backward
@pytest.mark.parametrize("bad,exc", BAD_BLOCKS)
@pytest.mark.parametrize("which", ["block_q", "block_k"])
def test_backward_bad_block_size(which, bad, exc):
    x = np.zeros((4, 8))
    with pytest.raises(exc, match=f"{which} must be a positive integer"):
        flash.flash_attention_backward(x, x, x, x, np.zeros(4), x, **{which: bad})


@pytest.mark.flash_backward
def test_backward_bad_o_lse_do():
    q = np.zeros((2, 3, 5, 8))
    k = np.zeros((2, 1, 6, 8))
    lse = np.zeros((2, 3, 5))
    with pytest.raises(ValueError, match=r"o must have the shape of q \(2, 3, 5, 8\)"):
        flash.flash_attention_backward(q, k, k, q[..., :4, :], lse, q)
    with pytest.raises(ValueError, match=r"do must have the shape of q \(2, 3, 5, 8\)"):
        flash.flash_attention_backward(q, k, k, q, lse, q[:1])
    with pytest.raises(ValueError, match=r"lse must have shape q.shape\[:-1\] = \(2, 3, 5\)"):
        flash.flash_attention_backward(q, k, k, q, lse[..., :4], q)
    with pytest.raises(ValueError, match=r"lse must have shape"):
        flash.flash_attention_backward(q, k, k, q, q, q)
    with pytest.raises(TypeError, match="lse must have dtype float16, float32 or float64"):
        flash.flash_attention_backward(q, k, k, q, lse.astype(np.int64), q)
    with pytest.raises(TypeError, match="do must have dtype"):
        flash.flash_attention_backward(q, k, k, q, lse, q.astype(np.int16))
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash.flash_attention_backward(q, k, k, q, lse, q, causal="yes")


# ----------------------------------------------------------------------------------------------------------------
# Triton wrappers: bad q/k/v raise before any kernel launch
# ----------------------------------------------------------------------------------------------------------------
def _tr_flash_bad_inputs():
    t = lambda *s, dtype=torch.float16: torch.ones(*s, dtype=dtype, device=DEVICE)  # noqa: E731
    q, k = t(1, 4, 8, 32), t(1, 2, 8, 32)
    return [
        ((q.cpu().numpy(), k, k), {}, TypeError, "q must be a torch.Tensor"),
        ((q, k, k.to("meta")), {}, ValueError, "v must be on device"),
        ((q[0], k, k), {}, ValueError, "q must have 4 dimensions"),
        ((q, t(1, 3, 8, 32), t(1, 3, 8, 32)), {}, ValueError, "multiple of the kv heads"),
        ((q, k, t(1, 2, 9, 32)), {}, ValueError, "k and v must have the same shape"),
        ((q, t(1, 2, 8, 16), t(1, 2, 8, 16)), {}, ValueError, "same head dimension"),
        ((t(2, 4, 8, 32), k, k), {}, ValueError, "same batch size"),
        ((t(1, 4, 8, 48), t(1, 2, 8, 48), t(1, 2, 8, 48)), {}, ValueError, r"head dimension d .* must be one of"),
        ((q.int(), k.int(), k.int()), {}, TypeError, "q must have dtype"),
        ((q.double(), k.double(), k.double()), {}, TypeError, "q must have dtype"),
        ((q, k.float(), k), {}, TypeError, "must have the same dtype"),
        ((q, t(1, 2, 0, 32), t(1, 2, 0, 32)), {}, ValueError, "N >= 1"),
        ((q, k, k), {"causal": "yes"}, TypeError, "causal must be a bool"),
        ((q, k, k), {"scale": float("nan")}, ValueError, "scale must be finite"),
    ]


@pytest.mark.triton_flash_forward
@pytest.mark.parametrize("case", range(len(_tr_flash_bad_inputs())))
def test_triton_flash_forward_bad_input_raises_before_launch(case):
    args, kwargs, exc, match = _tr_flash_bad_inputs()[case]
    with pytest.raises(exc, match=match):
        rtr.flash_attention_forward(*args, **kwargs)


@pytest.mark.triton_flash_backward
@pytest.mark.parametrize("case", [0, 3, 7, 10, 12])
def test_triton_flash_attention_bad_input_raises_before_launch(case):
    args, kwargs, exc, match = _tr_flash_bad_inputs()[case]
    with pytest.raises(exc, match=match):
        rtr.flash_attention(*args, **kwargs)


@pytest.mark.triton_flash_decode
@pytest.mark.parametrize("bad,exc,match", [
    (lambda q, k, v: (q[0], k, v), ValueError, "q must have 3 dimensions"),
    (lambda q, k, v: (q, k[0], v), ValueError, "k must have 4 dimensions"),
    (lambda q, k, v: (q, k, v[:, :, :5]), ValueError, "k and v must have the same shape"),
    (lambda q, k, v: (q.half(), k, v), TypeError, "must have the same dtype"),
    (lambda q, k, v: (q.to(torch.int32), k, v), TypeError, "q must have dtype"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "q must have dtype"),
    (lambda q, k, v: (q[:, :3], k, v), ValueError, "multiple of the kv heads"),
    (lambda q, k, v: (q[:1], k, v), ValueError, "batch size"),
    (lambda q, k, v: (q[..., :16], k, v), ValueError, "same head dimension"),
    (lambda q, k, v: (q[..., :24], k[..., :24], v[..., :24]), ValueError, "head dimension d"),
    (lambda q, k, v: (q.numpy(), k, v), TypeError, "q must be a torch.Tensor"),
])
def test_triton_decode_bad_inputs_raise_before_launch(bad, exc, match):
    q = torch.randn(2, 4, 32)
    k = torch.randn(2, 2, 10, 32)
    v = torch.randn(2, 2, 10, 32)
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    if "numpy" in match or "torch.Tensor" in match:
        q = q.cpu()
    with pytest.raises(exc, match=match):
        rtr.flash_decode(*bad(q, k, v))


# One bool rule for every flag (reference._args.check_flag): True/False and NumPy's np.True_/np.False_ are
# accepted and mean the same; a 0-d tensor, 1 and None are not.
FLAGS = [
    ("attention", np_attention.attention, "qkv", "causal"),
    ("attention", np_attention.attention, "qkv", "return_lse"),
    ("flash_forward", flash.flash_attention_forward, "qkv", "causal"),
    ("iosim", iosim.flash_attention_io, "io", "causal"),
    ("hopper", scheduling.tile_visits, "tile_visits", "causal"),
    ("triton_flash_forward", rtr.flash_attention_forward, "t_qkv", "causal"),
    ("triton_flash_backward", tr_flash_backward, "t_flash_bwd", "causal"),
    ("triton_flash_decode", rtr.flash_decode, "t_decode", "validate"),
    ("triton_paged_decode", rtr.paged_decode, "t_paged", "validate"),
]


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    return repr(a) == repr(b)


@pytest.mark.parametrize("marker,fn,base,flag", [pytest.param(*c, marks=getattr(pytest.mark, c[0]),
                                                              id=f"{c[1].__qualname__}-{c[3]}") for c in FLAGS])
def test_flags_take_numpy_bools_and_nothing_truthy(marker, fn, base, flag):
    for value in (True, False):
        want = fn(**_build(base, {flag: value}, np.random.default_rng(0)))
        got = fn(**_build(base, {flag: np.bool_(value)}, np.random.default_rng(0)))
        assert _same(got, want), (flag, value)
    for bad in (torch.tensor(True), 1, None):
        with pytest.raises(TypeError, match=f"^{flag} must be a bool"):
            fn(**_build(base, {flag: bad}, np.random.default_rng(0)))


# ----------------------------------------------------------------------------------------------------------------
# strided inputs: every Triton wrapper accepts them (no silent garbage from assumed strides)
# ----------------------------------------------------------------------------------------------------------------
def _strided(x: torch.Tensor, how: str) -> torch.Tensor:
    """The same values as ``x`` in a non-contiguous layout."""
    if how == "last":    # stride(-1) == 2
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
        wide[..., ::2] = x
        return wide[..., ::2]
    wide = x.transpose(-2, -3).contiguous().transpose(-2, -3)  # (B, N, H, d) storage seen as (B, H, N, d)
    return wide


@pytest.mark.parametrize("how", ["last", "heads"])
@pytest.mark.triton_flash_forward
def test_triton_wrappers_accept_strided_inputs(how, rng):
    q, k, v = (_tf(rng, 1, 4, 5, 16), _tf(rng, 1, 2, 7, 16), _tf(rng, 1, 2, 7, 16))
    s = lambda t: _strided(t, how)  # noqa: E731
    assert not s(q).is_contiguous()
    x = _tf(rng, 4, 3, 8)
    torch.testing.assert_close(rtr.softmax(s(x)), rtr.softmax(x), rtol=0, atol=0)
    o, lse = rtr.flash_attention_forward(q, k, v, causal=True)
    o2, lse2 = rtr.flash_attention_forward(s(q), s(k), s(v), causal=True)
    torch.testing.assert_close(o2, o, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse2, lse, rtol=1e-6, atol=1e-6)
    qd, lens = q[:, :, 0], _it([7])
    od = rtr.flash_decode(qd, k, v, seq_lens=lens, num_splits=2)
    torch.testing.assert_close(rtr.flash_decode(s(q)[:, :, 0], s(k), s(v), seq_lens=lens, num_splits=2), od,
                               rtol=1e-6, atol=1e-6)
    kc, vc = k[0].transpose(0, 1)[None].contiguous(), v[0].transpose(0, 1)[None].contiguous()  # (1, 7, 2, 16)
    op = rtr.paged_decode(qd, kc, vc, _it([[0]]), lens, num_splits=1)
    torch.testing.assert_close(rtr.paged_decode(qd, _strided(kc, "last"), _strided(vc, "last"), _it([[0]]), lens,
                                                num_splits=1), op, rtol=1e-6, atol=1e-6)


@pytest.mark.triton_flash_backward
def test_triton_backward_accepts_strided_grad_output(rng):
    q, k, v = (_tf(rng, 1, 2, 5, 16).requires_grad_(), _tf(rng, 1, 1, 6, 16).requires_grad_(),
               _tf(rng, 1, 1, 6, 16).requires_grad_())
    do = _tf(rng, 1, 2, 5, 16)
    grads = []
    for g in (do, _strided(do, "last")):
        o = rtr.flash_attention(q, k, v, causal=True)
        grads.append(torch.autograd.grad(o, (q, k, v), g))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# reference.simulators.iosim: what its docstring promises
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.iosim
def test_iosim_exposes_what_its_docstring_promises():
    for name in iosim.__all__:
        assert hasattr(iosim, name), f"iosim.__all__ lists {name}"
    for name in ("standard_attention_io", "flash_attention_io", "flash_block_sizes", "matmul_io", "seeds_table",
                 "scaling_sweep", "matmul_sweep", "main"):
        assert callable(getattr(iosim, name)), name
    for fn in (iosim.standard_attention_io, iosim.flash_attention_io):
        params = inspect.signature(fn).parameters
        assert list(params)[:4] == ["batch", "heads", "seq_len", "head_dim"]
        assert {"dtype", "sram_bytes", "causal", "backward"} <= set(params)
    fwd = iosim.flash_attention_io(1, 2, 256, 64, backward=False)
    both = iosim.flash_attention_io(1, 2, 256, 64)
    for rep in (fwd, both):
        assert rep.flops > 0 and rep.matmul_flops > 0
        assert rep.hbm_bytes == pytest.approx(rep.bytes_read + rep.bytes_written)
        assert rep.runtime_estimate() > 0
    assert both.hbm_bytes > fwd.hbm_bytes
    table = iosim.seeds_table(verbose=False)
    assert table["standard"]["hbm_gb"] == pytest.approx(40.3, rel=0.02)
    assert table["flash"]["hbm_gb"] == pytest.approx(4.4, rel=0.1)
    r = subprocess.run([sys.executable, "-m", "reference.simulators.iosim", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "--json" in r.stdout
