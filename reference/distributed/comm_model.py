"""Communication and compute of one attention layer under three kinds of context parallelism (a model, not a
measurement): ring attention, Ulysses (all-to-all over heads) and all-gather context parallelism (Llama 3).

One sequence of ``n`` tokens is split over ``world`` ranks, ``c = n / world`` tokens each; ``hq`` query heads,
``hkv`` key/value heads (GQA), head dimension ``d``; activations travel in ``act_bytes`` per number (bf16: 2),
gradient accumulators in ``grad_bytes`` (fp32: 4). Everything counts the bytes **one rank sends** per layer.

* **ring** (Liu et al., 2023; lecture 10 §3): forward, the K/V chunk makes ``world - 1`` hops:
  ``(W-1) c 2 hkv d act``. Backward (``reference.distributed.ring_attention.ring_attention_backward``): K/V make
  ``W - 1`` hops again and the fp32 dK/dV accumulators travel with their chunk for ``W`` hops, back to its
  owner: ``(W-1) c 2 hkv d act + W c 2 hkv d grad`` (nothing at ``W = 1``). Overlapped with compute, step by step.
* **ulysses** (Jacobs et al., DeepSpeed-Ulysses, 2023): an all-to-all turns "c tokens, all heads" into "all n
  tokens, H/W heads" for Q, K, V, and one turns O back; a rank keeps ``1/W`` of what it holds and sends the
  rest: ``(W-1)/W c d act (2 hq + 2 hkv)``. Backward: the transposed all-to-alls (dO in; dQ, dK, dV out), the
  same volume. Needs ``hq % W == 0``; with ``hkv < W`` each rank still needs a whole K/V head, so K/V heads are
  replicated to ``W`` (counted as ``hkv_eff = W``; ``W % hkv == 0`` required). Not overlapped: the all-to-all
  sits between the projections and attention.
* **allgather** (Llama 3 Herd of Models, 2024, §3.3.2): all-gather K and V before attention, then each rank
  attends its own queries (two chunks, ``r`` and ``2W-1-r``, for causal balance). Forward: a ring all-gather
  sends ``(W-1) c 2 hkv d act`` per rank (the ring forward's bytes, but in one exposed collective); backward:
  the gather again plus a reduce-scatter of dK/dV: ``(W-1) c 2 hkv d (act + grad)``.

Compute (FlashAttention counting: ``4 n^2 hq d`` forward FLOPs non-causal, half causal, backward ``2.5x``
forward: five matmuls against two) is ``1/W`` of the layer's on every rank, whatever the scheme (balanced
layouts assumed).
"""
from __future__ import annotations

SCHEMES = ("ring", "ulysses", "allgather")
#: backward / forward matmul FLOPs of FlashAttention (dQ, dK, dV, dP and the recomputed S: 5 against 2)
BWD_FLOP_RATIO = 2.5


def _positive_int(name: str, x) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name} must be a positive int, got {x!r}")
    return x


def _positive(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0:
        raise ValueError(f"{name} must be a positive number, got {x!r}")
    return float(x)


def _check_heads(hq: int, hkv: int) -> None:
    _positive_int("hq", hq), _positive_int("hkv", hkv)
    if hq % hkv:
        raise ValueError(f"hq must be a multiple of hkv (GQA), got hq={hq}, hkv={hkv}")


def attention_flops(n: int, world: int, hq: int, d: int, causal: bool = True, backward: bool = False) -> float:
    """FLOPs one rank computes for one layer: ``4 n^2 hq d / W`` (x 1/2 causal, x 2.5 backward)."""
    n, world, hq, d = (_positive_int(k, v) for k, v in (("n", n), ("world", world), ("hq", hq), ("d", d)))
    f = 4.0 * n * n * hq * d / world * (0.5 if causal else 1.0)
    return f * BWD_FLOP_RATIO if backward else f


def comm_bytes(scheme: str, n: int, world: int, hq: int, hkv: int, d: int, backward: bool = False,
               act_bytes: int = 2, grad_bytes: int = 4) -> float:
    """Bytes one rank sends for one attention layer (module docstring: the formula of each ``scheme``)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    n, world, d = _positive_int("n", n), _positive_int("world", world), _positive_int("d", d)
    _check_heads(hq, hkv)
    act, grad = _positive("act_bytes", act_bytes), _positive("grad_bytes", grad_bytes)
    c = n / world
    kv = 2 * c * hkv * d                      # numbers in one rank's K and V chunk
    if scheme == "ring":
        return (world - 1) * kv * act + (world * kv * grad if backward and world > 1 else 0.0)
    if scheme == "allgather":
        return (world - 1) * kv * (act + (grad if backward else 0.0))
    if hq % world:
        raise ValueError(f"Ulysses splits heads: hq ({hq}) must be a multiple of world ({world})")
    hkv_eff = hkv
    if hkv < world:
        if world % hkv:
            raise ValueError(f"Ulysses with hkv < world replicates K/V heads: world ({world}) must be a multiple of "
                             f"hkv ({hkv})")
        hkv_eff = world
    return (world - 1) / world * c * d * act * (2 * hq + 2 * hkv_eff)   # forward or backward: the same volume


def ring_step_ratio(c: float, hq: int, hkv: int, d: int, flops_per_s: float, link_bytes_per_s: float,
                    backward: bool = False, act_bytes: int = 2, grad_bytes: int = 4) -> float:
    """``t_compute / t_comm`` of one zig-zag causal ring step on ``c`` positions per rank.

    Compute: half a ``c x c`` block, ``2 c^2 d hq`` FLOPs (x 2.5 backward); send: the K/V chunk, ``2 c hkv d``
    numbers of ``act_bytes`` (backward: plus the dK/dV accumulators in ``grad_bytes``). Forward with bf16 this
    is ``c hq B / (2 hkv F)`` (lecture 10 §6).
    """
    _check_heads(hq, hkv)
    c, d = _positive("c", c), _positive_int("d", d)
    f, b = _positive("flops_per_s", flops_per_s), _positive("link_bytes_per_s", link_bytes_per_s)
    flops = 2.0 * c * c * d * hq * (BWD_FLOP_RATIO if backward else 1.0)
    sent = 2.0 * c * hkv * d * (act_bytes + (grad_bytes if backward else 0))
    return (flops / f) / (sent / b)


def ring_break_even(hq: int, hkv: int, flops_per_s: float, link_bytes_per_s: float, backward: bool = False,
                    act_bytes: int = 2, grad_bytes: int = 4) -> float:
    """Positions per rank ``c`` at which a ring step's compute time equals its send time (ratio 1): forward
    ``hkv act F / (hq B)``, backward that times ``(act + grad) / (act * 2.5)`` (bf16 / fp32: 6/5)."""
    _check_heads(hq, hkv)
    f, b = _positive("flops_per_s", flops_per_s), _positive("link_bytes_per_s", link_bytes_per_s)
    bytes_per_pos = hkv * (act_bytes + (grad_bytes if backward else 0))
    return bytes_per_pos * f / (hq * b * (BWD_FLOP_RATIO if backward else 1.0))


def compare(n: int, world: int, hq: int, hkv: int, d: int, flops_per_s: float, link_bytes_per_s: float,
            causal: bool = True, act_bytes: int = 2, grad_bytes: int = 4) -> list[dict]:
    """One row per (scheme, pass): bytes sent, their time at ``link_bytes_per_s``, the compute time at
    ``flops_per_s``, and the time the scheme *exposes* in this model (ring: ``max(0, comm - compute)`` since it
    overlaps; Ulysses and all-gather: all of it). Ulysses rows are left out where the heads do not split."""
    rows = []
    for scheme in SCHEMES:
        for backward in (False, True):
            try:
                sent = comm_bytes(scheme, n, world, hq, hkv, d, backward, act_bytes, grad_bytes)
            except ValueError:
                if scheme == "ulysses":
                    continue
                raise
            t_comm = sent / link_bytes_per_s
            t_comp = attention_flops(n, world, hq, d, causal, backward) / flops_per_s
            exposed = max(0.0, t_comm - t_comp) if scheme == "ring" else t_comm
            rows.append(dict(scheme=scheme, backward=backward, bytes=sent, comm_s=t_comm, compute_s=t_comp,
                             exposed_s=exposed))
    return rows
