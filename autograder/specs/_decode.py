"""Builders for the decode-shaped tasks: Flash-Decoding (a4, NumPy and Triton) and paged attention (a5).

Case parameters: ``B, Hq, Hkv, N`` (max keys), ``d``, ``dtype``, ``lens`` (list of per-sequence lengths, or
None = all N), ``num_splits``, ``shift`` (large logits), paged: ``block_size``, ``extra_blocks``.
"""
from __future__ import annotations

import numpy as np

from .. import oracles
from ._attn import randn_cast, tol_for
from ._base import TOL_TRITON, Call
from ._gen import arr, lse_dtypes, out, randn


def _qk(p, rng, kshape):
    q = rng.standard_normal((p["B"], p["Hq"], p["d"]))
    k = rng.standard_normal(kshape)
    if p.get("shift"):
        a = np.sqrt(p["shift"] / np.sqrt(p["d"]))
        q, k = q + a, k + a
    return randn_cast(q, p["dtype"]), randn_cast(k, p["dtype"])


def _torch(p):
    return p["dtype"] if p.get("torch") else None


def build_decoding(p, rng):
    """flash_decoding(q, k, v, num_splits=4, seq_lens=None, scale=None) -> (o, lse)  [NumPy]
    flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None) -> o          [Triton, p["torch"]]"""
    kshape = (p["B"], p["Hkv"], p["N"], p["d"])
    q, k = _qk(p, rng, kshape)
    v = randn(rng, kshape, p["dtype"])
    td = _torch(p)
    kw = {}
    if p.get("lens") is not None:
        kw["seq_lens"] = arr(np.asarray(p["lens"], dtype=np.int32), torch_dtype="int32" if td else None)
    if p.get("num_splits") is not None:
        kw["num_splits"] = int(p["num_splits"])
    if td:
        tol = tol_for(p, TOL_TRITON)
        outs = [out("o", p["dtype"], tol, "torch", dtypes=(p["dtype"],))]
    else:
        tol = tol_for(p)
        outs = [out("o", p["dtype"], tol), out("lse", p["dtype"], tol, dtypes=lse_dtypes(p["dtype"]))]
    c = Call([arr(q, td), arr(k, td), arr(v, td)], kw, outs)
    c.arg_names = ["q", "k", "v"]
    return c


def oracle_decoding(call):
    q, k, v = (a.value for a in call.args)
    lens = call.kwargs.get("seq_lens")
    o, lse = oracles.decode(q, k, v, None if lens is None else lens.value, call.kwargs.get("scale"))
    return [o, lse][:len(call.outs)]


def build_paged(p, rng):
    """paged_attention / paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None) -> o.

    Blocks are scattered: each sequence's blocks are a random subset of a shuffled pool, unused table slots
    are -1, and unused cache blocks hold random data (so reading the wrong block shows)."""
    bs = p["block_size"]
    lens = [int(x) for x in p["lens"]]
    need = [-(-n // bs) for n in lens]
    max_blocks = max(1, max(need) + p.get("pad_blocks", 1))
    num_blocks = sum(need) + p.get("extra_blocks", 3)
    pool = rng.permutation(num_blocks)
    tables = np.full((len(lens), max_blocks), -1, dtype=np.int32)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = pool[at:at + n]
        at += n
    cshape = (num_blocks, bs, p["Hkv"], p["d"])
    q, kc = _qk(dict(p, B=len(lens)), rng, cshape)
    vc = randn(rng, cshape, p["dtype"])
    td = _torch(p)
    if td:
        o = out("o", p["dtype"], tol_for(p, TOL_TRITON), "torch", dtypes=(p["dtype"],))
    else:
        o = out("o", p["dtype"], tol_for(p))
    c = Call([arr(q, td), arr(kc, td), arr(vc, td), arr(tables, "int32" if td else None),
              arr(np.asarray(lens, dtype=np.int32), "int32" if td else None)], {}, [o])
    c.arg_names = ["q", "k_cache", "v_cache", "block_tables", "seq_lens"]
    return c


def oracle_paged(call):
    return [oracles.paged(*(a.value for a in call.args[:5]), scale=call.kwargs.get("scale"))]
