"""Spec of assignment a5_paged: BlockAllocator (behaviour), paged attention in NumPy and Triton.

BlockAllocator is graded by scripts of operations run on a fresh instance and judged against a model that
follows the submission's own block ids (any allocation order is fine). Points total 100 (90 without a GPU).
"""
from __future__ import annotations

from ._base import Call, Spec, Task, Test
from ._decode import build_paged, oracle_paged
from ._gen import ragged

SHORT = "a5"
FORBIDDEN = ("scipy", "jax", "tensorflow", "flash_attn", "vllm")


# --- BlockAllocator scripts ------------------------------------------------------------------------------------

def _script(p, rng):
    """A random sequence of operations that stays valid except where ``kind == "errors"`` asks for errors.

    The generator keeps its own model (allocation op index -> reference count) so it never asks for a block
    that a failed allocation did not produce; the judge re-derives everything from the submission's answers.
    """
    n, kind = p["num_blocks"], p["kind"]
    ops = [["new", n]]
    refs = {}                                     # op index of an allocate -> reference count (> 0: owned)
    for _ in range(p["steps"]):
        r = rng.random()
        owned = [j for j, c in refs.items() if c > 0]
        if kind == "errors" and r < 0.12:
            ops.append(["free_raw", int(rng.choice([n, n + 7, -1]))])       # out of range must raise
        elif kind == "errors" and r < 0.2:
            ops.append(["incref_raw", n + 3])
        elif (r < 0.45 or not owned) and len(owned) < n:
            ops.append(["allocate"])
            refs[len(ops) - 1] = 1
        elif owned and kind in ("refcount", "errors") and r < 0.65:
            j = int(rng.choice(owned))
            ops.append(["incref", j])
            refs[j] += 1
            ops.append(["refcount", j])
        elif owned:
            j = int(rng.choice(owned))
            ops.append(["free", j])
            refs[j] -= 1
            if kind != "basic":
                ops.append(["refcount", j])
            if kind == "errors" and refs[j] == 0 and rng.random() < 0.5:
                ops.append(["free", j])           # double free must raise
        if rng.random() < 0.3:
            ops.append(["num_free"])
    if kind == "errors":                          # exhaust the pool, then one more must raise
        free = n - sum(1 for c in refs.values() if c > 0)
        ops += [["allocate"] for _ in range(free + 1)] + [["num_free"]]
    ops.append(["num_free"])
    return ops


def build_allocator(p, rng):
    return Call([], {}, [], mode="script", script=_script(p, rng), label=p["kind"])


def oracle_allocator(call):
    return []


# --- paged attention -------------------------------------------------------------------------------------------

def _pg(rng, dtype="float32", torch=False, hq=None, hkv=None, zero_len=False, **extra):
    hkv = hkv if hkv is not None else int(rng.integers(1, 3))
    b = int(rng.integers(1, 4))
    bs = extra.pop("block_size", int(rng.choice([4, 8, 16])))
    lens = [int(ragged(rng, 1, 90 if not torch else 60)) for _ in range(b)]
    if zero_len and b > 1:
        lens[-1] = 0
    p = dict(Hq=hq or hkv, Hkv=hkv, d=int(rng.choice([16, 32])), dtype=dtype, block_size=bs, lens=lens, **extra)
    if torch:
        p["torch"] = True
    return p


def _v(**kw):
    base = dict(Hq=2, Hkv=2, d=16, dtype="float32", block_size=4, lens=[9, 4])
    base.update(kw)
    return base


def _t(task, name, points, visible, hidden, **kw):
    return Test(f"{SHORT}.{task}: {name}", f"{SHORT}.{task}", points, visible, hidden, **kw)


TESTS = [
    _t("BlockAllocator", "allocate / free / num_free", 10, [dict(kind="basic", num_blocks=4, steps=8)],
       lambda r: [dict(kind="basic", num_blocks=int(r.integers(3, 20)), steps=40) for _ in range(3)],
       kind="behaviour"),
    _t("BlockAllocator", "reference counts (incref / refcount / shared free)", 8,
       [dict(kind="refcount", num_blocks=4, steps=10)],
       lambda r: [dict(kind="refcount", num_blocks=int(r.integers(3, 20)), steps=40) for _ in range(3)],
       kind="behaviour"),
    _t("BlockAllocator", "errors (double free, bad index, out of blocks)", 7,
       [dict(kind="errors", num_blocks=3, steps=6)],
       lambda r: [dict(kind="errors", num_blocks=int(r.integers(2, 10)), steps=30) for _ in range(3)],
       kind="behaviour"),

    _t("paged_attention", "basic (scattered blocks)", 10, [_v()], lambda r: [_pg(r), _pg(r)]),
    _t("paged_attention", "ragged seq_lens (incl. 0)", 8, [_v(lens=[9, 1, 0])],
       lambda r: [_pg(r, zero_len=True), _pg(r, block_size=1)]),
    _t("paged_attention", "GQA / MQA", 7, [_v(Hq=4, Hkv=2)], lambda r: [_pg(r, hq=4, hkv=2), _pg(r, hq=6, hkv=1)]),
    _t("paged_attention", "block sizes (1, 16, larger than a sequence)", 5, [_v(block_size=16)],
       lambda r: [_pg(r, block_size=1), _pg(r, block_size=16), _pg(r, block_size=128)]),
    _t("paged_attention", "dtypes float16/float64", 5, [_v(dtype="float64")],
       lambda r: [_pg(r, "float16"), _pg(r, "float64")]),

    _t("paged_decode", "basic (Triton, scattered blocks)", 12, [_v(torch=True)],
       lambda r: [_pg(r, torch=True), _pg(r, torch=True, block_size=16)]),
    _t("paged_decode", "ragged seq_lens", 10, [_v(torch=True, lens=[9, 1, 5])],
       lambda r: [_pg(r, torch=True), _pg(r, torch=True, block_size=8)]),
    _t("paged_decode", "GQA / MQA", 8, [_v(torch=True, Hq=4, Hkv=2)],
       lambda r: [_pg(r, torch=True, hq=4, hkv=2), _pg(r, torch=True, hq=4, hkv=1)]),
    # Long contexts and 8 reps, as in a4's decode speed test (notes/speed_calibration.md).
    _t("paged_decode", "speed vs reference paged decode (GPU)", 10, [],
       lambda r: [dict(Hq=32, Hkv=8, d=128, dtype="float16", block_size=16, lens=[65536], torch=True),
                  dict(Hq=32, Hkv=8, d=128, dtype="bfloat16", block_size=16, lens=[32000, 16000, 24000, 16],
                       torch=True)],
       kind="speed", gpu_only=True, speed_full=1.25, speed_zero=3.0, reps=8),
]

TASKS = {
    "a5.BlockAllocator": Task("a5.BlockAllocator", "BlockAllocator", build_allocator, oracle_allocator,
                              framework="class", reference="reference.numpy.paged:BlockAllocator"),
    "a5.paged_attention": Task("a5.paged_attention", "paged_attention", build_paged, oracle_paged,
                               reference="reference.numpy.paged:paged_attention"),
    "a5.paged_decode": Task("a5.paged_decode", "paged_decode", build_paged, oracle_paged, framework="torch",
                            reference="autograder.baselines:paged_decode", case_timeout=120),
}

SPEC = Spec("a5_paged", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, needs_torch=True,
            address_space=8 << 30, rss_limit=4 << 30,
            load_timeout=120, total_timeout=900)
