"""Builders shared by the attention-shaped tasks (a1.attention, a2 forward/backward, a3 Triton kernels).

Case parameters: ``B, Hq, Hkv, Nq, Nk, d`` (or ``single=True`` for rank-2 ``(N, d)``), ``dtype``, ``causal``,
``scale`` (None = 1/sqrt(d)), ``mag`` (multiplies q: large-magnitude logits), ``block_q``/``block_k``.
"""
from __future__ import annotations

import numpy as np

from .. import oracles
from ._base import TOL, TOL_TRITON, TOL_TRITON_GRAD, Call
from ._gen import arr, lse_dtypes, out, randn


def shapes(p):
    if p.get("single"):
        return (p["Nq"], p["d"]), (p["Nk"], p["d"])
    return (p["B"], p["Hq"], p["Nq"], p["d"]), (p["B"], p["Hkv"], p["Nk"], p["d"])


def tol_for(p, table=TOL):
    """Tolerance for this case: larger logits carry proportionally larger rounding of the scores."""
    return table[p["dtype"]] * max(1.0, p.get("mag", 1.0) / 10.0, p.get("shift", 0.0) / 10.0)


def make_qkv(p, rng):
    """Random q, k, v. ``shift`` adds a common component to q and k so that every scaled logit is about
    ``shift`` (e.g. 800: e^800 overflows float64, so only the max trick survives; softmax is shift-invariant so
    the answer stays well conditioned)."""
    qs, ks = shapes(p)
    q = rng.standard_normal(qs) * p.get("mag", 1.0)
    k = rng.standard_normal(ks)
    if p.get("shift"):
        a = np.sqrt(p["shift"] / np.sqrt(p["d"]))
        q, k = q + a, k + a
    cast = (lambda x: randn_cast(x, p["dtype"]))
    return cast(q), cast(k), randn(rng, ks, p["dtype"])


def randn_cast(x, dtype):
    from ._gen import NP, bf16_round
    return bf16_round(x) if dtype == "bfloat16" else x.astype(NP[dtype])


def _kw(p, blocks=False, lse=False):
    kw = {}
    if "causal" in p:
        kw["causal"] = bool(p["causal"])
    if p.get("scale") is not None:
        kw["scale"] = float(p["scale"])
    if blocks:
        for name in ("block_q", "block_k"):
            if name in p:
                kw[name] = int(p[name])
    if lse:
        kw["return_lse"] = True
    return kw


def build_attention(p, rng):
    """a1.attention(q, k, v, causal=False, scale=None, return_lse=False) -> o or (o, lse)."""
    q, k, v = make_qkv(p, rng)
    tol = tol_for(p)
    outs = [out("o", p["dtype"], tol)]
    if p.get("lse"):
        outs.append(out("lse", p["dtype"], tol, dtypes=lse_dtypes(p["dtype"])))
    c = Call([arr(q), arr(k), arr(v)], _kw(p, lse=p.get("lse", False)), outs)
    c.arg_names = ["q", "k", "v"]
    return c


def oracle_attention(call):
    q, k, v = (a.value for a in call.args)
    o, lse = oracles.attention(q, k, v, call.kwargs.get("causal", False), call.kwargs.get("scale"))
    return [o, lse][:len(call.outs)]


def build_flash_forward(p, rng):
    """a2.flash_attention_forward(q, k, v, causal, scale, block_q, block_k) -> (o, lse)."""
    q, k, v = make_qkv(p, rng)
    tol = tol_for(p)
    c = Call([arr(q), arr(k), arr(v)], _kw(p, blocks=True),
             [out("o", p["dtype"], tol), out("lse", p["dtype"], tol, dtypes=lse_dtypes(p["dtype"]))])
    c.arg_names = ["q", "k", "v"]
    return c


def oracle_flash_forward(call):
    q, k, v = (a.value for a in call.args)
    return list(oracles.attention(q, k, v, call.kwargs.get("causal", False), call.kwargs.get("scale")))


def build_flash_backward(p, rng):
    """a2.flash_attention_backward(q, k, v, o, lse, do, causal, scale, block_q, block_k) -> (dq, dk, dv).

    ``o`` and ``lse`` come from the float64 oracle (rounded to the input dtype / lse dtype), as the forward
    pass would have saved them.
    """
    q, k, v = make_qkv(p, rng)
    do = randn(rng, q.shape, p["dtype"])
    kw = _kw(p, blocks=True)
    o, lse = oracles.attention(q, k, v, kw.get("causal", False), kw.get("scale"))
    lse_dt = np.float64 if p["dtype"] == "float64" else np.float32
    tol = tol_for(p) * (5 if p["dtype"] == "float32" else 1)
    c = Call([arr(q), arr(k), arr(v), arr(o.astype(q.dtype)), arr(lse.astype(lse_dt)), arr(do)], kw,
             [out(n, p["dtype"], tol) for n in ("dq", "dk", "dv")])
    c.arg_names = ["q", "k", "v", "o", "lse", "do"]
    return c


def oracle_flash_backward(call):
    q, k, v, _, _, do = (a.value for a in call.args)
    return list(oracles.attention_grads(q, k, v, do, call.kwargs.get("causal", False), call.kwargs.get("scale")))


# --- torch / Triton variants (a3) --------------------------------------------------------------------------

def _t(x, p, grad=False):
    return arr(x, torch_dtype=p["dtype"], requires_grad=grad)


def build_triton_forward(p, rng):
    """a3.flash_attention_forward(q, k, v, causal=False, scale=None) -> (o, lse) on torch tensors."""
    q, k, v = make_qkv(p, rng)
    tol = tol_for(p, TOL_TRITON)
    c = Call([_t(q, p), _t(k, p), _t(v, p)], _kw(p),
             [out("o", p["dtype"], tol, "torch") if p["dtype"] != "bfloat16" else
              _bf("o", tol), out("lse", "float32", tol, "torch", dtypes=("float32",))])
    c.arg_names = ["q", "k", "v"]
    return c


def _bf(name, tol):
    from ._base import Out
    return Out(name, ("bfloat16",), tol, "torch")


def oracle_triton_forward(call):
    return oracle_flash_forward(call)


def build_triton_autograd(p, rng):
    """a3.flash_attention(q, k, v, causal, scale): o = fn(q, k, v); o.backward(do); outputs o, dq, dk, dv."""
    q, k, v = make_qkv(p, rng)
    do = randn(rng, q.shape, p["dtype"])
    tol = tol_for(p, TOL_TRITON_GRAD)
    mk = (lambda n: _bf(n, tol)) if p["dtype"] == "bfloat16" else (lambda n: out(n, p["dtype"], tol, "torch"))
    c = Call([_t(q, p, True), _t(k, p, True), _t(v, p, True), _t(do, p)], _kw(p),
             [mk(n) for n in ("o", "dq", "dk", "dv")], mode="autograd")
    c.arg_names = ["q", "k", "v", "do"]
    return c


def oracle_triton_autograd(call):
    q, k, v, do = (a.value for a in call.args)
    causal, scale = call.kwargs.get("causal", False), call.kwargs.get("scale")
    o, _ = oracles.attention(q, k, v, causal, scale)
    return [o, *oracles.attention_grads(q, k, v, do, causal, scale)]
