"""Inputs and tolerances the NumPy test files share, and ``load_solution``: NumPy only (no torch, no Triton, no
``reference.triton``), so that importing it never starts the Triton runtime. The torch/Triton pieces are in
``tests/common.py``. Test files import from these two modules, never from each other.

Tolerances are relative errors against the float64 oracle of ``tests/oracle.py``.
"""
import numpy as np

# ---- NumPy reference ---------------------------------------------------------------------------------------------
NP_TOL = {np.float16: 3e-3, np.float32: 2e-5, np.float64: 1e-12}
NP_GRAD_TOL = {np.float16: 6e-3, np.float32: 5e-5, np.float64: 1e-11}
NP_DTYPES = [np.float16, np.float32, np.float64]

# (q shape, kv shape): single head, batch/head dims, N=1, ragged, Nq != Nk both ways, GQA and MQA
NP_SHAPES = [
    ((1, 8), (1, 8)),
    ((13, 16), (13, 16)),
    ((2, 3, 29, 32), (2, 3, 29, 32)),
    ((2, 4, 17, 16), (2, 2, 23, 16)),   # GQA Hq=4, Hkv=2, Nq < Nk
    ((1, 4, 31, 8), (1, 1, 7, 8)),      # MQA, Nq > Nk: causal gives fully masked rows
    ((3, 2, 1, 16), (3, 2, 40, 16)),    # decode-like Nq = 1
    ((2, 2, 3, 5, 8), (2, 2, 1, 9, 8)),  # two batch dims, MQA
]


def rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def qkv(rng, qs, ks, dtype, scale=1.0):
    return rand(rng, qs, dtype, scale), rand(rng, ks, dtype, scale), rand(rng, ks, dtype)


def load_solution(aid: str, tmp_path):
    """Import the graded cells (not 'check'/'skip') of an assignment's solution source from a real file (Triton
    needs one). Needs no notebook library, so GPU runs of the assignment tests work without nbformat."""
    import importlib.util
    import sys
    from pathlib import Path

    from autograder.percent import parse_percent
    root = Path(__file__).resolve().parents[1]
    cells = parse_percent((root / "assignments" / aid / f"{aid}_solution.py").read_text(encoding="utf-8"))
    code = "\n\n\n".join(c.source for c in cells if c.kind == "code" and not {"check", "skip"} & set(c.tags))
    path = Path(tmp_path) / f"{aid}_graded.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"_sol_{aid}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fill_paged_cache(rng, lens, hkv, d, block_size, num_blocks, dtype=np.float64):
    """A ``reference.numpy.paged.PagedKVCache`` with the sequences appended in interleaved pieces (scattered blocks)."""
    from reference.numpy.paged import PagedKVCache
    cache = PagedKVCache(num_blocks, block_size, hkv, d, dtype=dtype)
    kv = []
    for s, n in enumerate(lens):
        cache.add_sequence(s)
        kv.append((rng.standard_normal((n, hkv, d)).astype(dtype), rng.standard_normal((n, hkv, d)).astype(dtype)))
    step = int(rng.integers(3, 9))
    for lo in range(0, max(lens), step):
        for s, (k, v) in enumerate(kv):
            cache.append(s, k[lo:lo + step], v[lo:lo + step])
    return cache, kv
