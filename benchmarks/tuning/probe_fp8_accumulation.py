"""How many bits does the e4m3 tensor-core MMA keep while it accumulates? (one short GPU call; no timing)

    python3 -m benchmarks.tuning.probe_fp8_accumulation --out DIR     # DIR/<gpu>-fp8-accumulation.json
    python3 -m benchmarks.tuning.probe_fp8_accumulation --smoke       # CPU, Triton interpreter: tests the script

Why: the FP8 forwards' lse sits ~1e-3 from float64 on the same e4m3 inputs on an H100, but ~1e-6 under the
interpreter, and the Gluon and Triton FP8 kernels agree with each other to ~1e-6 on the GPU (notes/hopper.md,
"The FP8 lse bound crossed twice"). What they share is the MMA. This probe computes ``S = A B^T`` of e4m3 tiles
with ``tl.dot`` into a float32 accumulator (wgmma on Hopper at these shapes), the same for float16 tiles as a
control, and compares with float64 of the same values. Per entry the error is scaled by what the accumulation
saw, ``sum_i |a_i b_i|``; ``bits = -log2(max |dS| / sum_i |a_i b_i|)`` is the precision the accumulation kept
(float32: about 23-24; a truncating accumulator with a 13-14-bit mantissa: about 13-14).
The FP8 lse bound then follows per row: ``|d lse| <= max_j |dS_j| <= scale * max_j sum_i |q_i k_ji| * 2^-bits``.
"""
from __future__ import annotations

import argparse
import math

import torch
import triton
import triton.language as tl

from benchmarks import _common, write_json
from reference.triton import INTERPRET

FP8 = torch.float8_e4m3fn


@triton.jit
def _dot_kernel(A, B, C, K: tl.constexpr, M: tl.constexpr, N: tl.constexpr):
    """``C = A B^T`` of one ``(M, K) x (N, K)`` tile pair, float32 accumulator (one tl.dot: wgmma on Hopper)."""
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rn[:, None] * K + rk[None, :])
    c = tl.dot(a, tl.trans(b), out_dtype=tl.float32)
    tl.store(C + rm[:, None] * N + rn[None, :], c)


def kept_bits(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Run the kernel on ``a (M, K)``, ``b (N, K)`` (e4m3 or float16) and compare with float64 of the same values."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.float32, device=a.device)
    _dot_kernel[(1,)](a, b, c, K=k, M=m, N=n, num_warps=4)
    a64, b64 = a.double(), b.double()
    exact = a64 @ b64.T
    scale = a64.abs() @ b64.abs().T
    rel = ((c.double() - exact).abs() / scale.clamp_min(1e-300)).max().item()
    return dict(dtype=str(a.dtype).replace("torch.", ""), M=m, N=n, K=k, max_err_over_sum_abs=rel,
                bits=(-math.log2(rel) if rel > 0 else float("inf")),
                max_abs_err=(c.double() - exact).abs().max().item())


def draw(rng: torch.Generator, shape, dtype, device) -> torch.Tensor:
    """Values spread over e4m3's range as the quantisation leaves them (a block's largest element near 448)."""
    x = torch.randn(shape, generator=rng)
    x = x / x.abs().amax(dim=-1, keepdim=True) * 448.0
    return x.to(device).to(dtype)


def run(smoke: bool, trials: int) -> dict:
    device = "cpu" if smoke else "cuda"
    rng = torch.Generator().manual_seed(0)
    rows = []
    for k in ((32, 64) if smoke else (64, 128, 256)):
        m = n = 16 if smoke else 64
        for dtype in (FP8, torch.float16):
            worst = None
            for _ in range(trials):
                r = kept_bits(draw(rng, (m, k), dtype, device), draw(rng, (n, k), dtype, device))
                worst = r if worst is None or r["bits"] < worst["bits"] else worst
            rows.append(worst)
            print(f"{worst['dtype']:14s} K={k:3d}: bits kept {worst['bits']:5.1f} "
                  f"(max |dS| / sum |a b| = {worst['max_err_over_sum_abs']:.2e}; worst of {trials})")
    return dict(meta=_common.run_meta(smoke, trials=trials, interpreter=INTERPRET), rows=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(_common.RESULTS))
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, small tiles: tests the script")
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args(argv)

    def body(t0, log):
        doc = run(args.smoke, 2 if args.smoke else args.trials)
        path = write_json(args.out, f"{_common.result_tag(args.smoke)}-fp8-accumulation.json", doc)
        log(f"wrote {path}")
        return 0
    return _common.start_run("probe_fp8_accumulation.py", args.smoke, args.out, body)


if __name__ == "__main__":
    raise SystemExit(main())
