"""Spec of assignment a3_triton: fused softmax, FlashAttention-2 forward and the differentiable
``flash_attention`` (Triton backward), on torch tensors.

Without a GPU the kernels run in the Triton interpreter on small shapes and the speed tests are "not run"
(excluded from max_score). Points total 100 on a GPU. Each graded call must launch at least one Triton kernel.
"""
from __future__ import annotations

import numpy as np

from ._attn import build_triton_autograd, build_triton_forward, oracle_triton_autograd, oracle_triton_forward
from ._base import TOL_TRITON, Call, Spec, Task, Test
from ._gen import arr, out, ragged, randn
from .. import oracles

SHORT = "a3"
FORBIDDEN = ("scipy", "jax", "tensorflow", "flash_attn", "xformers")


def build_softmax(p, rng):
    x = randn(rng, p["shape"], p["dtype"])
    if p.get("shift"):
        x = (x.astype(np.float64) + p["shift"]).astype(x.dtype)
    tol = TOL_TRITON[p["dtype"]] * max(1.0, p.get("shift", 0.0) / 10.0)
    c = Call([arr(x, p["dtype"])], {}, [out("p", p["dtype"], tol, "torch", dtypes=(p["dtype"],))])
    c.arg_names = ["x"]
    return c


def oracle_softmax(call):
    return [oracles.softmax(call.args[0].value)]


def _att(rng, dtype="float32", nq=None, nk=None, hq=None, hkv=None, d=None, **extra):
    hkv = hkv if hkv is not None else 1
    n = ragged(rng, 9, 70)
    return dict(B=1, Hq=hq or hkv * int(rng.integers(1, 3)), Hkv=hkv, Nq=nq or n, Nk=nk or n,
                d=d or int(rng.choice([16, 32])), dtype=dtype, **extra)


def _v(**kw):
    base = dict(B=1, Hq=2, Hkv=2, Nq=20, Nk=20, d=16, dtype="float32")
    base.update(kw)
    return base


def _t(task, name, points, visible, hidden, **kw):
    return Test(f"{SHORT}.{task}: {name}", f"{SHORT}.{task}", points, visible, hidden, **kw)


GPU_ATT = [dict(B=4, Hq=16, Hkv=16, Nq=2048, Nk=2048, d=64, dtype="bfloat16"),
           dict(B=4, Hq=16, Hkv=16, Nq=2048, Nk=2048, d=64, dtype="bfloat16", causal=True),
           dict(B=2, Hq=16, Hkv=16, Nq=4096, Nk=4096, d=128, dtype="float16", causal=True)]

TESTS = [
    _t("softmax", "basic", 6, [dict(shape=(5, 37), dtype="float32")],
       lambda r: [dict(shape=(int(r.integers(2, 20)), ragged(r, 5, 300)), dtype="float32"),
                  dict(shape=(2, 3, ragged(r, 5, 100)), dtype="float32")]),
    _t("softmax", "long rows", 4, [dict(shape=(2, 1500), dtype="float32")],
       lambda r: [dict(shape=(3, ragged(r, 1025, 5000)), dtype="float32")]),
    _t("softmax", "large logits", 4, [dict(shape=(3, 40), dtype="float32", shift=100.0)],
       lambda r: [dict(shape=(4, ragged(r, 5, 300)), dtype="float32", shift=100.0)]),
    _t("softmax", "float16 / bfloat16", 2, [dict(shape=(3, 40), dtype="float16")],
       lambda r: [dict(shape=(4, ragged(r, 5, 300)), dtype="float16"),
                  dict(shape=(4, ragged(r, 5, 300)), dtype="bfloat16", gpu=True)]),
    _t("softmax", "speed vs reference fused softmax (GPU)", 4, [],
       lambda r: [dict(shape=(4096, 4096), dtype="float16"), dict(shape=(8192, 1000), dtype="bfloat16")],
       kind="speed", gpu_only=True, reps=5),

    _t("flash_attention_forward", "basic (ragged N)", 8, [_v()],
       lambda r: [_att(r), _att(r, nq=ragged(r, 5, 40), nk=ragged(r, 40, 90))]),
    _t("flash_attention_forward", "causal", 8, [_v(causal=True)],
       lambda r: [_att(r, causal=True), _att(r, causal=True, d=32)]),
    _t("flash_attention_forward", "causal, Nq != Nk (bottom-right; fully masked rows)", 6,
       [_v(Nq=7, Nk=19, causal=True), _v(Nq=19, Nk=7, causal=True)],
       lambda r: [_att(r, causal=True, nq=ragged(r, 5, 30), nk=ragged(r, 40, 80)),
                  _att(r, causal=True, nq=ragged(r, 40, 80), nk=ragged(r, 5, 30))]),
    _t("flash_attention_forward", "GQA / MQA", 6, [_v(Hq=4, Hkv=2)],
       lambda r: [_att(r, hq=4, hkv=2), _att(r, hq=4, hkv=1, causal=True)]),
    _t("flash_attention_forward", "large logits", 5, [_v(shift=100.0)],
       lambda r: [_att(r, shift=100.0)]),
    _t("flash_attention_forward", "float16 / bfloat16", 4, [_v(dtype="float16")],
       lambda r: [_att(r, "float16", causal=True), _att(r, "bfloat16", gpu=True)]),
    _t("flash_attention_forward", "speed vs reference FA2 forward (GPU)", 8, [], lambda r: GPU_ATT,
       kind="speed", gpu_only=True, reps=5),

    _t("flash_attention", "backward: basic (ragged N)", 10, [_v()], lambda r: [_att(r), _att(r, hq=2)]),
    _t("flash_attention", "backward: causal", 8, [_v(causal=True)], lambda r: [_att(r, causal=True)]),
    _t("flash_attention", "backward: GQA (dK/dV summed over the group)", 6, [_v(Hq=4, Hkv=2)],
       lambda r: [_att(r, hq=4, hkv=2, causal=True)]),
    _t("flash_attention", "backward: float16 / bfloat16", 5, [_v(dtype="float16")],
       lambda r: [_att(r, "float16"), _att(r, "bfloat16", gpu=True)]),
    _t("flash_attention", "speed vs reference FA2 forward + backward (GPU)", 6, [], lambda r: GPU_ATT[:2],
       kind="speed", gpu_only=True, reps=5),
]

TASKS = {
    "a3.softmax": Task("a3.softmax", "softmax", build_softmax, oracle_softmax, framework="torch",
                       reference="reference.triton:softmax", case_timeout=120),
    "a3.flash_attention_forward": Task("a3.flash_attention_forward", "flash_attention_forward",
                                       build_triton_forward, oracle_triton_forward, framework="torch",
                                       reference="reference.triton:flash_attention_forward", case_timeout=180),
    "a3.flash_attention": Task("a3.flash_attention", "flash_attention", build_triton_autograd,
                               oracle_triton_autograd, framework="torch",
                               reference="reference.triton:flash_attention", case_timeout=300),
}

SPEC = Spec("a3_triton", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, needs_torch=True,
            address_space=8 << 30, rss_limit=4 << 30,
            load_timeout=120, total_timeout=1200)
