"""Builders shared by the attention-shaped tasks (a1.attention, a2 forward/backward, a3 and a3b Triton kernels).

Case parameters: ``B, Hq, Hkv, Nq, Nk, d`` (or ``single=True`` for rank-2 ``(N, d)``), ``dtype``, ``causal``,
``scale`` (None = 1/sqrt(d)), ``mag`` (multiplies q: large-magnitude logits), ``block_q``/``block_k``.
"""
from __future__ import annotations

import numpy as np

from .. import oracles
from ._base import TOL, TOL_TRITON, TOL_TRITON_GRAD, Call, tiled
from ._gen import NP, arr, lse_dtypes, out, ragged, randn


def tiled_qk(tile_q, tile_k=None):
    """``Task.tiled`` of an attention kernel tiled over queries and keys: ``tile_*`` an int (the spec's
    ``MAX_TILE``) or the name of the case's own block parameter (``"block_q"``)."""
    return (tiled("query length Nq", "Nq", tile_q), tiled("key length Nk", "Nk", tile_k or tile_q))


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
    the answer stays well conditioned). ``timing_only`` (GPU speed cases): zeros of the right shapes and dtype,
    drawn at once; the timing children redraw every value from seeds."""
    qs, ks = shapes(p)
    if p.get("timing_only"):
        dt = np.float32 if p["dtype"] == "bfloat16" else NP[p["dtype"]]
        return np.zeros(qs, dt), np.zeros(ks, dt), np.zeros(ks, dt)
    q = rng.standard_normal(qs) * p.get("mag", 1.0)
    k = rng.standard_normal(ks)
    if p.get("shift"):
        a = np.sqrt(p["shift"] / np.sqrt(p["d"]))
        q, k = q + a, k + a
    cast = (lambda x: randn_cast(x, p["dtype"]))
    return cast(q), cast(k), randn(rng, ks, p["dtype"])


def randn_cast(x, dtype):
    from ._gen import bf16_round
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


# --- torch / Triton variants (a3, a3b) -------------------------------------------------------------------------

def triton_case(rng, dtype="float32", nq=None, nk=None, hq=None, hkv=None, d=None, **extra):
    """Hidden-case parameters of the Triton attention tasks: B = 1, ragged N in 9..70 (unless given), d 16 or 32,
    ``Hq`` a multiple (1 or 2) of ``Hkv`` (default 1) unless given; ``extra`` (causal, scale, shift, gpu) kept."""
    hkv = hkv if hkv is not None else 1
    n = ragged(rng, 9, 70)
    return dict(B=1, Hq=hq or hkv * int(rng.integers(1, 3)), Hkv=hkv, Nq=nq or n, Nk=nk or n,
                d=d or int(rng.choice([16, 32])), dtype=dtype, **extra)


def triton_visible(**kw):
    """Visible-case parameters of the Triton attention tasks: B=1, Hq=Hkv=2, N=20, d=16, float32, then ``kw``."""
    base = dict(B=1, Hq=2, Hkv=2, Nq=20, Nk=20, d=16, dtype="float32")
    base.update(kw)
    return base


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
    """a3b.flash_attention(q, k, v, causal, scale): o = fn(q, k, v); o.backward(do); outputs o, dq, dk, dv."""
    q, k, v = make_qkv(p, rng)
    do = randn(rng, q.shape, p["dtype"])
    tol = tol_for(p, TOL_TRITON_GRAD)
    mk = (lambda n: _bf(n, tol)) if p["dtype"] == "bfloat16" else (lambda n: out(n, p["dtype"], tol, "torch"))
    c = Call([_t(q, p, True), _t(k, p, True), _t(v, p, True), _t(do, p)], _kw(p),
             [mk(n) for n in ("o", "dq", "dk", "dv")], mode="autograd")
    c.arg_names = ["q", "k", "v", "do"]
    return c


def build_triton_autograd_given_forward(p, rng):
    """a3b.flash_attention: as ``build_triton_autograd``; ``o`` comes from the notebook's given torch forward,
    whose ops the op audit exempts (``autograder.given``), so only the gradients are the student's kernels'."""
    return build_triton_autograd(p, rng)


def oracle_triton_autograd(call):
    q, k, v, do = (a.value for a in call.args)
    causal, scale = call.kwargs.get("causal", False), call.kwargs.get("scale")
    o, _ = oracles.attention(q, k, v, causal, scale)
    return [o, *oracles.attention_grads(q, k, v, do, causal, scale)]


# --- the staged Triton backward (a3b): each stage called on its own, with o and lse from the float64 oracle --

def _grad_out(name, p, tol):
    return _bf(name, tol) if p["dtype"] == "bfloat16" else out(name, p["dtype"], tol, "torch")


def _saved(p, rng):
    """q, k, v, do in the case's dtype, and the float64 forward's o and lse (what a forward would have saved)."""
    q, k, v = make_qkv(p, rng)
    do = randn(rng, q.shape, p["dtype"])
    kw = _kw(p)
    o, lse = oracles.attention(q, k, v, kw.get("causal", False), kw.get("scale"))
    return q, k, v, do, o, lse, kw


def build_triton_bwd_preprocess(p, rng):
    """a3b.flash_bwd_preprocess(o, do) -> delta (B, H, Nq) float32."""
    shape = (p["B"], p["Hq"], p["Nq"], p["d"])
    o, do = randn(rng, shape, p["dtype"]), randn(rng, shape, p["dtype"])
    c = Call([_t(o, p), _t(do, p)], {}, [out("delta", "float32", TOL_TRITON[p["dtype"]], "torch",
                                               dtypes=("float32",))])
    c.arg_names = ["o", "do"]
    return c


def oracle_triton_bwd_preprocess(call):
    o, do = (a.value for a in call.args)
    return [np.sum(o.astype(np.float64) * do.astype(np.float64), axis=-1)]


def _build_bwd_stage(p, rng, outs):
    """a3b.flash_bwd_dkdv / flash_bwd_dq(q, k, v, do, lse, delta, causal, scale): ``lse`` and ``delta``
    (float32) come from the exact forward, so a wrong preprocess or forward cannot cost this stage's points."""
    q, k, v, do, o, lse, kw = _saved(p, rng)
    delta = np.sum(o * do.astype(np.float64), axis=-1)
    f32 = dict(p, dtype="float32")
    tol = tol_for(p, TOL_TRITON_GRAD)
    c = Call([_t(q, p), _t(k, p), _t(v, p), _t(do, p), _t(lse.astype(np.float32), f32),
              _t(delta.astype(np.float32), f32)], kw, [_grad_out(n, p, tol) for n in outs])
    c.arg_names = ["q", "k", "v", "do", "lse", "delta"]
    return c


def build_triton_bwd_dkdv(p, rng):
    return _build_bwd_stage(p, rng, ("dk", "dv"))


def build_triton_bwd_dq(p, rng):
    return _build_bwd_stage(p, rng, ("dq",))


def _stage_grads(call):
    q, k, v, do = (a.value for a in call.args[:4])
    return oracles.attention_grads(q, k, v, do, call.kwargs.get("causal", False), call.kwargs.get("scale"))


def oracle_triton_bwd_dkdv(call):
    return list(_stage_grads(call)[1:])


def oracle_triton_bwd_dq(call):
    return [_stage_grads(call)[0]]


def build_triton_backward(p, rng):
    """a3b.flash_attention_backward(q, k, v, o, lse, do, causal, scale) -> (dq, dk, dv) on torch tensors.

    A GPU speed case (``timing_only``) draws ``o`` and ``lse`` at random instead of running the float64 forward
    on 16k tokens (scores of 8 GB): the timing children redraw every value from seeds anyway, and compare the
    student's outputs with the reference's, not with an oracle."""
    if p.get("timing_only"):
        q, k, v = make_qkv(p, rng)
        do, o, lse, kw = np.zeros_like(q), np.zeros_like(q), np.zeros(q.shape[:3]), _kw(p)
    else:
        q, k, v, do, o, lse, kw = _saved(p, rng)
    tol = tol_for(p, TOL_TRITON_GRAD)
    c = Call([_t(q, p), _t(k, p), _t(v, p), _t(randn_cast(o, p["dtype"]), p),
              _t(lse.astype(np.float32), dict(p, dtype="float32")), _t(do, p)], kw,
             [_grad_out(n, p, tol) for n in ("dq", "dk", "dv")])
    c.arg_names = ["q", "k", "v", "o", "lse", "do"]
    return c


def oracle_triton_backward(call):
    return oracle_flash_backward(call)
