"""The Gluon attention benchmarks' shapes, inputs and cuDNN baseline (``bench_gluon``, ``bench_gluon_bwd``,
``bench_gluon_train``, ``bench_key_loop`` and the backward sweeps)."""
from __future__ import annotations

# (B, Hq, Hkv, Nq, Nk, d, causal, dtype)
CASES = [(2, 4, 4, 1024, 1024, 128, False, "bf16"), (2, 4, 4, 1024, 1024, 128, True, "bf16"),
         (1, 4, 4, 1000, 1000, 128, False, "bf16"), (1, 4, 4, 1000, 1000, 128, True, "bf16"),
         (2, 8, 2, 512, 512, 128, True, "bf16"), (1, 2, 2, 300, 1000, 128, True, "bf16"),
         (1, 2, 2, 1000, 300, 128, True, "bf16"), (1, 2, 2, 1000, 300, 128, False, "bf16"),
         (1, 4, 4, 777, 777, 64, False, "bf16"), (1, 4, 4, 777, 777, 64, True, "bf16"),
         (1, 4, 4, 1024, 1024, 128, True, "fp16"), (1, 2, 2, 1, 5, 64, False, "bf16"),
         (1, 2, 2, 4096, 4096, 128, True, "bf16"),
         # more query tiles than SMs (several waves of CTAs)
         (4, 8, 2, 1000, 1000, 128, True, "bf16"), (8, 16, 16, 600, 1200, 64, True, "bf16"),
         (4, 8, 8, 1000, 700, 128, False, "bf16")]
# the forward's check shapes small enough for a CPU float64 autograd oracle (the backward's checks)
BWD_CASES = [c for c in CASES if c[0] * c[1] * c[3] * c[4] <= 1 << 23] + [(1, 2, 2, 2048, 2048, 128, True, "bf16")]
#: the training-step bar's table (``bench_gluon_train --grid bar``, ``probe_bwd_persistent``): (d, causal, N, B, Hq,
#: Hkv), N = 2k..16k, batch x seqlen = 16k, causal and not, MHA with hidden 2048 (Hq = 2048 / d) and GQA 32/8
BAR_ROWS = [(d, c, N, 16384 // N, Hq, Hkv) for d in (64, 128) for Hq, Hkv in ((2048 // d,) * 2, (32, 8))
            for c in (False, True) for N in (2048, 4096, 8192, 16384)]


def case_tensors(B, Hq, Hkv, Nq, Nk, d, dt, with_do=False):
    """Fresh standard-normal ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` (and ``do`` like q) on the GPU."""
    import torch
    dtype = torch.bfloat16 if dt == "bf16" else torch.float16
    shapes = [(B, Hq, Nq, d), (B, Hkv, Nk, d), (B, Hkv, Nk, d)] + ([(B, Hq, Nq, d)] if with_do else [])
    return [torch.randn(*s, device="cuda", dtype=dtype) for s in shapes]


def train_steps(shapes, d):
    """For each ``(causal, N, B, Hq, Hkv)`` of ``shapes``: a training step's inputs and the step, yielded as
    ``(causal, N, B, Hq, Hkv, leaves, step)``; fresh bf16 ``q, do (B, Hq, N, d)`` and ``k, v (B, Hkv, N, d)`` on the
    GPU (in that order), ``leaves = [q, k, v]`` requiring grad; ``step(fn)`` clears their grads, runs
    ``fn(q, k, v, causal).backward(do)`` and returns ``dq``. After each case it drops its own references and
    empties torch's cache (what the caller still holds is freed when it lets go)."""
    import torch
    for causal, N, B, Hq, Hkv in shapes:
        q, do = (torch.randn(B, Hq, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(B, Hkv, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        leaves = [x.requires_grad_(True) for x in (q, k, v)]

        def step(fn, leaves=leaves, do=do, causal=causal):
            for x in leaves:
                x.grad = None
            fn(*leaves, causal).backward(do)
            return leaves[0].grad
        yield causal, N, B, Hq, Hkv, leaves, step
        del q, k, v, do, leaves, step
        torch.cuda.empty_cache()


def cudnn_attention(q, k, v, causal, gqa="native"):
    """SDPA's cuDNN backend on ``q (B, Hq, N, d)``, ``k, v (B, Hkv, N, d)``: with ``Hkv < Hq`` either natively
    (``enable_gqa=True``, ``gqa="native"``) or on K, V repeated per query head (``gqa="repeat"``: the repeat and,
    under autograd, its group sums are part of what is timed)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention
    group = q.shape[1] // k.shape[1]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        if group == 1:
            return scaled_dot_product_attention(q, k, v, is_causal=causal)
        if gqa == "native":
            return scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                            is_causal=causal)


def cudnn_bwd_timer(q, k, v, do, causal, gqa="native"):
    """``sdpa_bwd_timer`` for ``cudnn_attention``: a zero-argument callable running the backward once (the forward
    runs once here, outside what is timed); returns ``(dq, dk, dv)``, dK and dV per kv head."""
    import torch
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = cudnn_attention(qg, kg, vg, causal, gqa)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
