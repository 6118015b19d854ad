FP8_MAX = tl.constexpr(448.0)  # the largest finite float8 e4m3 value (torch.float8_e4m3fn, Triton's float8e4nv)
FP8_HEAD_DIMS = (32, 64, 128)  # an FP8 tensor-core MMA reduces over at least 32 elements


@triton.jit
def to_fp8(x):
    """Given: round float32 ``x`` (|x| <= 448) to float8 e4m3, to nearest.

    On a GPU this is the cast. The Triton 3.6 interpreter's float32 -> float8 cast rounds wrongly when the
    rounding carries into the exponent (0.4963 -> 0.25, 100 -> 104), so there ``x`` is first rounded to the
    nearest e4m3 value in float32 -- 3 mantissa bits: step ``2^(e-3)`` for ``2^e <= |x| < 2^(e+1)``, and the
    subnormal step ``2^-9`` below ``2^-6`` -- which the cast then keeps exactly.
    """
    if INTERPRET:
        e = tl.floor(tl.log2(tl.maximum(tl.abs(x), 0.015625)))
        step = tl.exp2(e - 3.0)
        x = tl.floor(x / step + 0.5) * step
    return x.to(tl.float8e4nv)


@triton.jit
def dot_acc(a, b, acc):
    """Given: ``acc + a @ b`` in float32 as one tensor-core MMA (``tl.dot``'s accumulator form); ``a``, ``b``
    float8 e4m3. Under the interpreter both operands are widened to float32 first (exact for e4m3 values)."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


def check_fp8_device(device):
    """Given: FP8 tensor-core matmuls need compute capability 9.0 (Hopper: H100/H200) or newer; the
    interpreter runs anywhere. Raises ``RuntimeError`` naming the requirement."""
    if device.type != "cuda" or INTERPRET.value:
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (9, 0):
        raise RuntimeError(f"the FP8 forward needs a GPU of compute capability >= 9.0 (Hopper, sm_90) for float8 "
                           f"e4m3 tensor-core matmuls; {torch.cuda.get_device_name(device)} is sm_{major}{minor}")


def random_hadamard(d, seed, device):
    """Given: ``J = diag(s) H / sqrt(d)`` with ``H`` the d x d Sylvester Hadamard matrix and ``s`` random signs
    drawn from ``seed``. ``J`` is orthogonal (``J J^T = I``), so ``(Q J)(K J)^T = Q K^T``: the FlashAttention-3
    paper's incoherent processing (section 3.3), float32 on ``device``."""
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    signs = torch.randint(0, 2, (d,), generator=torch.Generator().manual_seed(seed)) * 2.0 - 1.0
    return (signs[:, None] * h / math.sqrt(d)).to(device)
