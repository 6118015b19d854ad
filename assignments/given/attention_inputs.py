import math

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_attention_inputs(q, k, v):
    """Given: validate ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``; return ``(B, Hq, Hkv, Nq, Nk, d)``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.dtype != q.dtype:
            raise TypeError(f"q, k, v must share one dtype among float16/bfloat16/float32, got {name} {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, N, d), got {tuple(x.shape)}")
    B, Hq, Nq, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"k and v must have shape (B={B}, Hkv, Nk, d={d}), got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    Hkv, Nk = k.shape[1], k.shape[2]
    if Hkv == 0 or Hq % Hkv or min(B, Nq, Nk) == 0:
        raise ValueError(f"need Hq % Hkv == 0 and B, Nq, Nk >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if d not in (16, 32, 64, 128):
        raise ValueError(f"head dimension d must be one of 16, 32, 64, 128, got {d}")
    return B, Hq, Hkv, Nq, Nk, d
