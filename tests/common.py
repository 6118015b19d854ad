"""Inputs, tolerances and fixtures the torch/Triton test files share (test files import from here or from
``tests/common_numpy.py``, never from each other; ``tests/test_layout_tests_benchmarks.py`` checks it).

Tolerances are relative errors against the float64 oracle of ``tests/oracle.py``. The NumPy-only pieces
(NumPy tolerances and shapes, ``load_solution``) live in ``tests/common_numpy.py``, which imports neither torch
nor Triton.
"""
import numpy as np
import pytest
import torch

from reference.triton import DEVICE, INTERPRET
from tests.oracle import attention_ref, lse_err, rel_err

# ---- Triton kernels ----------------------------------------------------------------------------------------------
# FlashAttention. fp16/bf16: P is rounded to the input dtype before P @ V, as in FlashAttention. fp32: exact fp32
# dots in the interpreter; TF32 dots on a GPU (about 1e-3).
FLASH_O_TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5 if INTERPRET else 5e-3}
FLASH_G_TOL = {torch.float16: 6e-3, torch.bfloat16: 4e-2, torch.float32: 1e-5 if INTERPRET else 1e-2}
FLASH_LSE_TOL = {torch.float16: 1e-5, torch.bfloat16: 1e-5, torch.float32: 1e-6 if INTERPRET else 1e-3}

@pytest.fixture(autouse=True)
def pinned_flash_configs():
    """One block configuration per FlashAttention kernel (``configs.FWD_PINS["tests"]``, ``BWD_PINS["tests"]``
    on a GPU; the interpreter default is already a pin), so tests are fast and deterministic; a test file turns it
    on with ``from tests.common import pinned_flash_configs``."""
    from reference.triton import configs
    if INTERPRET:
        yield
        return
    with configs.pinned(fwd=configs.FWD_PINS["tests"], bwd=configs.BWD_PINS["tests"]):
        yield

# Decode: fp32 dots run in true fp32; fp16/bf16 round P to the input dtype before the P @ V dot.
DECODE_TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_decode(rng, B, Hq, Hkv, n, d, dtype, spread=1.0):
    """Fresh non-uniform random decode inputs ``q (B, Hq, d)``, ``k, v (B, Hkv, n, d)`` on DEVICE (never zeros)."""
    def t(*shape):
        x = rng.standard_normal(shape) * spread + rng.uniform(-0.5, 0.5)
        return torch.tensor(x, dtype=dtype, device=DEVICE)
    return t(B, Hq, d), t(B, Hkv, n, d), t(B, Hkv, n, d)


def decode_nan_tails(rng):
    """A bf16 decode case ``(q, k, v, lens, seq_lens)`` (B = 3, Hq = 8, Hkv = 2, d = 64) with ragged lengths (a
    partial last key block in most splits) whose cache slots past each length hold NaN: what a whole-block TMA box
    reads, and a kernel must mask out of the scores and zero in V."""
    n_max = 777 if DEVICE.type == "cuda" else 133
    q, k, v = make_decode(rng, 3, 8, 2, n_max, 64, torch.bfloat16)
    lens = [n_max, int(rng.integers(2, n_max)), 1]
    for b, n in enumerate(lens):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    return q, k, v, lens, torch.tensor(lens, dtype=torch.int32, device=DEVICE)


def gluon_bwd_inputs(rng, B, Hq, Hkv, Nq, Nk, d, dtype=torch.bfloat16):
    """Fresh standard-normal ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``, ``do (B, Hq, Nq, d)`` on DEVICE, for the
    Gluon backward tests (warp-specialised, autograd op)."""
    def t(*shape):
        return torch.tensor(rng.standard_normal(shape), dtype=dtype, device=DEVICE)
    return t(B, Hq, Nq, d), t(B, Hkv, Nk, d), t(B, Hkv, Nk, d), t(B, Hq, Nq, d)


# Paged prefill (the Triton page-tile kernels, the Gluon TMA kernel): packed chunk queries after cached keys.
def make_paged_prefill(rng, seq_lens, chunks, hq, hkv, d, page, dtype):
    """Fresh random pools whose pages (every sequence's, plus 3 spare) are permuted, so a table row is out of
    order; tables padded with -1 (one column more than the longest sequence needs); packed chunk queries.
    Returns the device tensors ``(q, k_cache, v_cache, table, cu_q, seq_lens)``, each sequence's K/V in token
    order (float64, NumPy) and ``cu`` (NumPy)."""
    n_pages = [-(-n // page) for n in seq_lens]
    total = sum(n_pages) + 3
    perm = rng.permutation(total)
    table = np.full((len(seq_lens), max(max(n_pages), 1) + 1), -1, np.int32)
    at = 0
    for b, p in enumerate(n_pages):
        table[b, :p] = perm[at:at + p]
        at += p
    kc = rng.standard_normal((total, page, hkv, d)) + rng.uniform(-0.5, 0.5)
    vc = rng.standard_normal((total, page, hkv, d))
    q = rng.standard_normal((sum(chunks), hq, d))
    seqs = []
    for b, n in enumerate(seq_lens):
        pages = table[b, np.arange(n) // page]
        slots = np.arange(n) % page
        seqs.append((kc[pages, slots], vc[pages, slots]))
    cu = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)

    def dev(x, dt=dtype):
        return torch.tensor(np.asarray(x), device=DEVICE).to(dt)
    return (dev(q), dev(kc), dev(vc), dev(table, torch.int32), dev(cu, torch.int32),
            dev(np.array(seq_lens, np.int32), torch.int32)), seqs, cu


def check_paged_prefill(out, q, seqs, cu, causal, dtype, tol):
    """Each request's rows of ``out = (o, lse)`` against the float64 oracle on its keys (rounded to ``dtype`` as
    the kernel read them): relative error of O and of the LSE below ``tol``."""
    o, lse = out
    for b, (k, v) in enumerate(seqs):
        sl = slice(cu[b], cu[b + 1])
        if cu[b + 1] == cu[b]:
            continue
        qq = q[sl].to(torch.float64).cpu().transpose(0, 1)
        kk, vv = (torch.tensor(x).to(dtype).to(torch.float64).transpose(0, 1) for x in (k, v))
        ro, rl, _ = attention_ref(qq, kk, vv, causal=causal)
        assert rel_err(o[sl].transpose(0, 1).double().cpu(), ro) < tol, b
        assert lse_err(lse[:, sl].double().cpu(), rl) < tol, b


def cascade_case(rng, B, hq, hkv, d, P, suffix, bs, dtype):
    """A cascade decode case on DEVICE: ``B`` queries ``(B, hq, d)``, a shared ``(P, hkv, d)`` prefix and each
    request's ``suffix[b]`` keys in scattered ``bs``-token pages; returns the device arguments of ``cascade_decode``
    and the float64 originals for ``cascade_oracle``."""
    n_blocks = [max(1, -(-n // bs)) for n in suffix]
    table = np.zeros((B, max(n_blocks)), dtype=np.int32)
    perm = rng.permutation(sum(n_blocks))  # scattered pages
    pos = 0
    for b, nb in enumerate(n_blocks):
        table[b, :nb] = perm[pos:pos + nb]
        pos += nb
    q = torch.tensor(rng.standard_normal((B, hq, d)), dtype=torch.float64)
    pk, pv = (torch.tensor(rng.standard_normal((P, hkv, d)), dtype=torch.float64) for _ in range(2))
    kc, vc = (torch.tensor(rng.standard_normal((sum(n_blocks), bs, hkv, d)), dtype=torch.float64) for _ in range(2))
    dev = [x.to(DEVICE, dtype) for x in (q, pk, pv, kc, vc)]
    args = (*dev, torch.tensor(table, device=DEVICE), torch.tensor(suffix, dtype=torch.int32, device=DEVICE))
    return args, (q, pk, pv, kc, vc, table)


def cascade_oracle(ref, suffix, bs):
    """float64 attention of each request over prefix + its own suffix, from the rounded inputs."""
    q, pk, pv, kc, vc, table = ref
    os_, ls = [], []
    for b, n in enumerate(suffix):
        ks = kc[table[b]].reshape(-1, *kc.shape[2:])[:n]
        vs = vc[table[b]].reshape(-1, *vc.shape[2:])[:n]
        k = torch.cat([pk, ks]).transpose(0, 1)
        v = torch.cat([pv, vs]).transpose(0, 1)
        o, lse, _ = attention_ref(q[b][:, None], k, v)
        os_.append(o[:, 0])
        ls.append(lse[:, 0])
    return torch.stack(os_), torch.stack(ls)


def run_smoke(module: str, out_dir, name: str, timeout: int = 300) -> dict:
    """Run ``python -m <module> --smoke --out <out_dir>`` from the repository root (a benchmark script on the CPU
    interpreter; tests may not import ``benchmarks``) and return its results file ``<out_dir>/<name>``."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", module, "--smoke", "--out", str(out_dir)], cwd=root,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    with open(os.path.join(str(out_dir), name)) as f:
        return json.load(f)
