"""Spec of assignment a5_paged: BlockAllocator (behaviour), paged attention in NumPy and Triton.

BlockAllocator is graded by scripts of operations run on a fresh instance and judged against a model that
follows the submission's own block ids (any allocation order is fine). Copy-on-write (``cow_fork``,
``cow_append``) is graded as pure functions on a cache state: fresh blocks are the lowest-numbered free ones,
so the expected block table and reference counts are exact. Points total 115 (105 without a GPU).
Tiles: ``paged_decode``'s key tiles at most ``MAX_TILE`` = 64; hidden sequences reach 2-3 of them plus a tail.
"""
from __future__ import annotations

import numpy as np

from ._base import Call, Out, Spec, Task, Test, Tiled
from ._decode import build_paged, oracle_paged
from ._gen import arr, multi_tile, out, randn, ragged

SHORT = "a5"
FORBIDDEN = ("scipy", "jax", "tensorflow", "flash_attn", "vllm")
# The largest key tile the spec expects of ``paged_decode`` (the solution's BLOCK_N = 64): every grading has a
# hidden sequence of 2-3 such tiles plus a ragged tail, in a batch of B * Hkv = 8 kv heads (one split each with
# the solution's CPU heuristic), so the split kernel must loop over key tiles with the online softmax.
MAX_TILE = 64


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


# --- copy-on-write: fork and append ------------------------------------------------------------------------
INT_OUT = ("int64", "int32")


def build_fork(p, rng):
    """cow_fork(refcount, block_table) -> refcount with every block of the table shared once more."""
    n = p["num_blocks"]
    refcount = rng.integers(0, 3, size=n).astype(np.int64)
    table = rng.permutation(n)[:p["n_table"]].astype(np.int64)
    refcount[table] = np.maximum(refcount[table], 1)
    c = Call([arr(refcount), arr(table)], {}, [Out("refcount", INT_OUT, 0.0)])
    c.arg_names = ["refcount", "block_table"]
    return c


def oracle_fork(call):
    refcount, table = (a.value for a in call.args)
    r = refcount.astype(np.float64)
    np.add.at(r, table, 1.0)
    return [r]


def build_cow_append(p, rng):
    """cow_append(k_cache, v_cache, refcount, block_table, seq_len, k_new, v_new) -> the four new arrays.

    ``shared``: how many of the sequence's blocks another sequence also holds (refcount 2), counted from the
    start of the table (a fork shares a prefix; -1: all); ``seq_len`` may leave the last block partly filled.
    """
    bs, hkv, d, dt = p["block_size"], p["Hkv"], p["d"], p["dtype"]
    seq_len, t_new = p["seq_len"], p["T"]
    n_table = -(-seq_len // bs)
    num_blocks = n_table + -(-(seq_len % bs + t_new) // bs) + 2 + p.get("extra", 2)
    refcount = np.zeros(num_blocks, dtype=np.int64)
    other = rng.choice(num_blocks, size=p.get("other_owned", 2), replace=False)
    refcount[other] = 1                                  # blocks of other sequences: never touched
    free = np.flatnonzero(refcount == 0)
    table = rng.permutation(free)[:n_table].astype(np.int64)
    refcount[table] = 1
    refcount[table[:n_table if p["shared"] < 0 else p["shared"]]] = 2
    kc, vc = randn(rng, (num_blocks, bs, hkv, d), dt), randn(rng, (num_blocks, bs, hkv, d), dt)
    kn, vn = randn(rng, (t_new, hkv, d), dt), randn(rng, (t_new, hkv, d), dt)
    outs = [out("k_cache", dt, 0.0), out("v_cache", dt, 0.0), Out("refcount", INT_OUT, 0.0),
            Out("block_table", INT_OUT, 0.0)]
    c = Call([arr(kc), arr(vc), arr(refcount), arr(table), seq_len, arr(kn), arr(vn)], {}, outs)
    c.arg_names = ["k_cache", "v_cache", "refcount", "block_table", "seq_len", "k_new", "v_new"]
    return c


def oracle_cow_append(call):
    """Token by token: copy a shared partly filled last block before the first write, take the lowest free
    block whenever a new one is needed."""
    kc, vc, refcount, table, seq_len, kn, vn = (a.value if hasattr(a, "value") else a for a in call.args)
    kc, vc, refcount, table = kc.astype(np.float64), vc.astype(np.float64), refcount.copy(), list(table)
    bs = kc.shape[1]

    def take():
        b = int(np.flatnonzero(refcount == 0)[0])
        refcount[b] = 1
        return b

    n = seq_len
    for t in range(kn.shape[0]):
        if n % bs == 0:
            table.append(take())
        elif refcount[table[-1]] > 1:
            new = take()
            kc[new], vc[new] = kc[table[-1]], vc[table[-1]]
            refcount[table[-1]] -= 1
            table[-1] = new
        kc[table[-1], n % bs], vc[table[-1], n % bs] = kn[t], vn[t]
        n += 1
    return [kc, vc, refcount.astype(np.float64), np.asarray(table, dtype=np.float64)]


def _cow(**kw):
    base = dict(block_size=4, Hkv=2, d=8, dtype="float32", seq_len=10, T=3, shared=0)
    base.update(kw)
    return base


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


def _pg_long(rng):
    """Four sequences, two kv heads (B * Hkv = 8 programs: one split each with the solution's CPU heuristic),
    two of them 2-3 key tiles of ``MAX_TILE`` plus a ragged tail long: the split kernel must rescale across
    tiles (8 query heads: some row's running max grows after the first tile)."""
    lens = [multi_tile(rng, MAX_TILE) for _ in range(2)] + [int(ragged(rng, 1, 60)) for _ in range(2)]
    return dict(Hq=8, Hkv=2, d=16, dtype="float32", block_size=int(rng.choice([4, 8, 16])),
                lens=[int(x) for x in rng.permutation(lens)], torch=True)


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

    _t("cow_fork", "fork shares every block (reference counts + 1)", 3,
       [dict(num_blocks=8, n_table=3)],
       lambda r: [dict(num_blocks=int(r.integers(4, 40)), n_table=int(r.integers(1, 4))) for _ in range(3)]),
    _t("cow_append", "unshared sequence: fill the last block, then the lowest free blocks", 4,
       [_cow()], lambda r: [_cow(block_size=int(r.choice([2, 4, 16])), seq_len=int(r.integers(1, 40)),
                                 T=int(r.integers(1, 20)), d=16) for _ in range(3)]),
    _t("cow_append", "shared partly filled last block: copy it before writing", 5,
       [_cow(shared=3)],
       lambda r: [_cow(block_size=bs, seq_len=bs * int(r.integers(1, 5)) + int(r.integers(1, bs)),
                       T=int(r.integers(1, 12)), shared=-1, d=16) for bs in (2, 4, 16)]),
    _t("cow_append", "shared full blocks: no copy, new blocks only", 3,
       [_cow(seq_len=8, shared=2)],
       lambda r: [_cow(block_size=bs, seq_len=bs * int(r.integers(1, 5)), T=int(r.integers(1, 12)), shared=-1,
                       d=16) for bs in (2, 4, 16)]),

    _t("paged_attention", "basic (scattered blocks)", 10, [_v()], lambda r: [_pg(r), _pg(r)]),
    _t("paged_attention", "ragged seq_lens (incl. 0)", 8, [_v(lens=[9, 1, 0])],
       lambda r: [_pg(r, zero_len=True), _pg(r, block_size=1)]),
    _t("paged_attention", "GQA / MQA", 7, [_v(Hq=4, Hkv=2, lens=[9, 1])],
       lambda r: [_pg(r, hq=4, hkv=2), _pg(r, hq=6, hkv=1)]),
    _t("paged_attention", "block sizes (1, 16, larger than a sequence)", 5, [_v(block_size=16)],
       lambda r: [_pg(r, block_size=1), _pg(r, block_size=16), _pg(r, block_size=128)]),
    _t("paged_attention", "dtypes float16/float64", 5,
       [_v(dtype="float16", lens=[9, 1]), _v(dtype="float64", lens=[9, 1])],
       lambda r: [_pg(r, "float16"), _pg(r, "float64")]),

    _t("paged_decode", "basic (Triton, scattered blocks)", 12, [_v(torch=True)],
       lambda r: [_pg(r, torch=True), _pg(r, torch=True, block_size=16), _pg_long(r)]),
    _t("paged_decode", "ragged seq_lens", 10, [_v(torch=True, lens=[9, 1, 5])],
       lambda r: [_pg(r, torch=True), _pg(r, torch=True, block_size=8), _pg_long(r)]),
    _t("paged_decode", "GQA / MQA", 8, [_v(torch=True, Hq=4, Hkv=2, lens=[9, 1])],
       lambda r: [_pg(r, torch=True, hq=4, hkv=2), _pg(r, torch=True, hq=4, hkv=1), _pg_long(r)]),
    # Long contexts, 8 reps and full points up to 1.5x (two launches vs the reference's one), as in a4's decode
    # speed test (notes/speed_calibration.md).
    _t("paged_decode", "speed vs reference paged decode (GPU)", 10, [],
       lambda r: [dict(Hq=32, Hkv=8, d=128, dtype="float16", block_size=16, lens=[65536], torch=True),
                  dict(Hq=32, Hkv=8, d=128, dtype="bfloat16", block_size=16, lens=[32000, 16000, 24000, 16],
                       torch=True)],
       kind="speed", gpu_only=True, speed_full=1.5, speed_zero=3.0, reps=8),
]

TASKS = {
    "a5.BlockAllocator": Task("a5.BlockAllocator", "BlockAllocator", build_allocator, oracle_allocator,
                              framework="class", reference="reference.numpy.paged:BlockAllocator"),
    "a5.cow_fork": Task("a5.cow_fork", "cow_fork", build_fork, oracle_fork),
    "a5.cow_append": Task("a5.cow_append", "cow_append", build_cow_append, oracle_cow_append),
    "a5.paged_attention": Task("a5.paged_attention", "paged_attention", build_paged, oracle_paged,
                               reference="reference.numpy.paged:paged_attention",
                               tiled=(Tiled("longest sequence (cache blocks)", lambda p: max(p["lens"]),
                                            lambda p: p["block_size"]),)),
    "a5.paged_decode": Task("a5.paged_decode", "paged_decode", build_paged, oracle_paged, framework="torch",
                            reference="autograder.baselines:paged_decode", case_timeout=120,
                            tiled=(Tiled("longest sequence", lambda p: max(p["lens"]), lambda p: MAX_TILE),)),
}

ASSIGNMENT = Spec("a5_paged", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, needs_torch=True,
            address_space=8 << 30, rss_limit=4 << 30,
            load_timeout=120, total_timeout=900)
