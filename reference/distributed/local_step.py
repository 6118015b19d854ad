"""One rank's work at one ring step: attend its queries to the K/V chunk that is visiting.

A rank holds query segments and, at each step, a visiting chunk made of key segments (``layout``). Under the
global bottom-right causal mask (query position ``p`` sees key position ``t`` iff ``t <= p + Nk - Nq``), a pair
(query segment starting at ``qs``, key segment starting at ``ks``) sees, in local indices, ``j <= i + delta``
with ``delta = qs + (Nk - Nq) - ks``. :func:`block_calls` reduces any ``delta`` to at most two calls of an
ordinary attention kernel: rows that see every key (no mask) and rows that see a prefix of the keys, which is a
plain bottom-right causal block after slicing. Rows that see nothing are skipped (they keep ``lse = -inf``).
A ring step goes further (:func:`step_calls`): a rank's keys are in increasing position order, so every query
row sees a prefix of them, and rows join across segments into one call per zig-zag step.
So the local step is any FlashAttention-style ``forward -> (o, lse)`` / ``backward(o, lse, do)`` pair:

* ``"torch"``: dense float math in torch (fp32, fp64 for fp64 inputs); any device.
* ``"numpy"``: ``reference.numpy.flash`` (FA2 Algorithms 1 and 2 tiled in NumPy); CPU, fp16/32/64.
* ``"triton"``: ``reference.triton`` (the course's FA2 kernels; compiled on a GPU, interpreted on CPU).
* ``"gluon"``: the Hopper wing's FA3-style kernels (``reference.triton.hopper``: the persistent ping-pong forward
  and the warp-specialised backward); sm_90 only, bf16/fp16, ``d`` in {64, 128}.

The backward of a call is given the GLOBAL ``o`` and ``lse`` of its rows: FA2 Algorithm 2 recomputes
``P = exp(S - lse)`` and uses ``D = rowsum(dO * O)``, so with the global values each call's gradients are
exactly this key chunk's share of the full gradient, and the shares add up.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from reference.numpy import flash_attention_backward, flash_attention_forward

from .merge import RunningState, acc_dtype, merge_rows_


def block_calls(nq: int, nk: int, delta: int, causal: bool) -> list[tuple[int, int, int, bool]]:
    """Kernel calls ``(q_lo, q_hi, k_hi, causal)`` covering a pair where local row ``i`` sees ``j <= i + delta``.

    Each call attends rows ``[q_lo, q_hi)`` to keys ``[0, k_hi)``; a causal call is bottom-right aligned
    (``k_hi - (q_hi - q_lo) = delta + q_lo``). Non-causal pairs are one call over everything.
    """
    if nq == 0 or nk == 0:
        return []
    if not causal or delta >= nk - 1:
        return [(0, nq, nk, False)]          # every row sees every key
    if nq - 1 + delta < 0:
        return []                            # even the last row sees no key
    q_lo = max(0, -delta)                    # rows before q_lo see nothing
    q_hi = min(nq, nk - delta)               # rows from q_hi on see every key
    calls = [(q_lo, q_hi, q_hi + delta, True)] if q_hi > q_lo else []
    if q_hi < nq:
        calls.append((q_hi, nq, nk, False))
    return calls


def visible_pairs(nq: int, nk: int, delta: int, causal: bool) -> int:
    """Number of (query, key) pairs a pair of segments computes (the work of :func:`block_calls`)."""
    total = 0
    for q_lo, q_hi, k_hi, c in block_calls(nq, nk, delta, causal):
        rows = q_hi - q_lo
        if c:  # row t of the call sees k_hi - rows + 1 + t keys
            first = k_hi - rows + 1
            total += rows * first + rows * (rows - 1) // 2
        else:
            total += rows * k_hi
    return total


# ----------------------------------------------------------------------------------------------------------
# local steps
# ----------------------------------------------------------------------------------------------------------
def _expand(x: torch.Tensor, group: int) -> torch.Tensor:
    return x if group == 1 else x.repeat_interleave(group, dim=1)


class TorchStep:
    """Dense attention in torch: ``S = scale q k^T`` (bottom-right mask), ``lse = logsumexp(S)``, ``o = P v``."""

    name = "torch"

    @staticmethod
    def _scores(q, k, causal, scale):
        acc = acc_dtype(q)
        group = q.shape[1] // k.shape[1]
        s = (q.to(acc) @ _expand(k, group).to(acc).transpose(-1, -2)) * scale
        if causal:
            nq, nk = q.shape[2], k.shape[2]
            i = torch.arange(nq, device=q.device).unsqueeze(1)
            j = torch.arange(nk, device=q.device).unsqueeze(0)
            s = s.masked_fill(j > i + (nk - nq), float("-inf"))
        return s, group

    @staticmethod
    def _probs(s, lse):
        fin = torch.isfinite(lse).unsqueeze(-1)
        return torch.where(fin, torch.exp(s - torch.where(fin, lse.unsqueeze(-1), 0)), 0)

    def forward(self, q, k, v, causal, scale):
        s, group = self._scores(q, k, causal, scale)
        lse = torch.logsumexp(s, dim=-1)
        o = self._probs(s, lse) @ _expand(v, group).to(s.dtype)
        return o, lse

    def backward(self, q, k, v, o, lse, do, causal, scale):
        """FA2 Algorithm 2 without tiling: ``dV = P^T dO``, ``dS = P (dO V^T - D)``, ``dQ = scale dS K``."""
        s, group = self._scores(q, k, causal, scale)
        acc = s.dtype
        p = self._probs(s, lse.to(acc))
        do_ = do.to(acc)
        ve = _expand(v, group).to(acc)
        delta = (do_ * o.to(acc)).sum(-1, keepdim=True)           # line 4: D = rowsum(dO * O)
        ds = p * (do_ @ ve.transpose(-1, -2) - delta)
        dq = (ds @ _expand(k, group).to(acc)) * scale
        dk = (ds.transpose(-1, -2) @ q.to(acc)) * scale
        dv = p.transpose(-1, -2) @ do_
        if group > 1:  # GQA: a kv head's gradient sums over its query heads
            B, Hq, nk, d = dk.shape
            dk = dk.view(B, Hq // group, group, nk, d).sum(2)
            dv = dv.view(B, Hq // group, group, nk, d).sum(2)
        return dq, dk, dv


class NumpyStep:
    """``reference.numpy.flash`` (tiled FA2 in NumPy) on CPU tensors; fp16/fp32/fp64 only."""

    name = "numpy"

    def __init__(self, block_q: int = 64, block_k: int = 64):
        self.block_q, self.block_k = block_q, block_k

    @staticmethod
    def _np(x, name):
        if x.dtype not in (torch.float16, torch.float32, torch.float64):
            raise TypeError(f"the numpy local step needs {name} in float16/32/64, got {x.dtype}")
        return x.detach().cpu().numpy()

    def forward(self, q, k, v, causal, scale):
        o, lse = flash_attention_forward(self._np(q, "q"), self._np(k, "k"), self._np(v, "v"), causal=causal,
                                         scale=scale, block_q=self.block_q, block_k=self.block_k)
        return torch.from_numpy(o).to(q.device), torch.from_numpy(lse).to(q.device)

    def backward(self, q, k, v, o, lse, do, causal, scale):
        args = [self._np(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (lse, "lse"), (do, "do"))]
        grads = flash_attention_backward(*args, causal=causal, scale=scale, block_q=self.block_q,
                                         block_k=self.block_k)
        return tuple(torch.from_numpy(np.ascontiguousarray(g)).to(q.device) for g in grads)


class TritonStep:
    """The course's Triton FA2 kernels (``reference.triton``): bf16/fp16/fp32, ``d`` in {16, 32, 64, 128}."""

    name = "triton"

    def forward(self, q, k, v, causal, scale):
        from reference.triton import flash_attention_forward
        return flash_attention_forward(q, k, v, causal=causal, scale=scale)

    def backward(self, q, k, v, o, lse, do, causal, scale):
        from reference.triton import flash_attention_backward
        # the kernels read lse as a contiguous (B * H, N) array; o/do of the input dtype
        return flash_attention_backward(q, k, v, o.to(q.dtype), lse.to(torch.float32).contiguous(),
                                        do.to(q.dtype), causal=causal, scale=scale)


class GluonStep:
    """The Hopper wing's Gluon kernels (lecture 6): ``flash_attention_forward_gluon`` and the warp-specialised
    ``flash_attention_backward_gluon_ws``; an H100/H200 only (elsewhere the kernels' own device check says so)."""

    name = "gluon"

    def forward(self, q, k, v, causal, scale):
        from reference.triton import flash_attention_forward_gluon
        return flash_attention_forward_gluon(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal,
                                             scale=scale)

    def backward(self, q, k, v, o, lse, do, causal, scale):
        from reference.triton import flash_attention_backward_gluon_ws
        return flash_attention_backward_gluon_ws(q.contiguous(), k.contiguous(), v.contiguous(),
                                                 o.to(q.dtype).contiguous(), lse.to(torch.float32).contiguous(),
                                                 do.to(q.dtype).contiguous(), causal=causal, scale=scale)


STEPS = {"torch": TorchStep, "numpy": NumpyStep, "triton": TritonStep, "gluon": GluonStep}


def get_step(step):
    """A local step from its name (``"torch"``, ``"numpy"``, ``"triton"``, ``"gluon"``) or any object with ``forward`` and
    ``backward`` methods of the signatures of :class:`TorchStep`."""
    if isinstance(step, str):
        if step not in STEPS:
            raise ValueError(f"step must be one of {tuple(STEPS)} or an object with forward/backward, got {step!r}")
        return STEPS[step]()
    if callable(getattr(step, "forward", None)) and callable(getattr(step, "backward", None)):
        return step
    raise TypeError(f"step must be a name in {tuple(STEPS)} or an object with forward and backward methods, "
                    f"got {type(step).__name__}")


# ----------------------------------------------------------------------------------------------------------
# one ring step over a rank's segments
# ----------------------------------------------------------------------------------------------------------
def _pairs(q_segs, k_segs, offset, causal):
    """Yield ``(q_row0, k_row0, call)`` for every kernel call between local query and key segments."""
    qoff = 0
    for qs, qe in q_segs:
        koff = 0
        for ks, ke in k_segs:
            for call in block_calls(qe - qs, ke - ks, qs + offset - ks, causal):
                yield qoff, koff, call
            koff += ke - ks
        qoff += qe - qs


def _sorted_segments(segs) -> bool:
    starts = [a for a, b in segs if b > a]
    ends = [b for a, b in segs if b > a]
    return all(e <= s for e, s in zip(ends, starts[1:]))


def _visible_runs(q_segs, k_segs, offset):
    """Per local query row, the number ``n(i)`` of local keys it sees, as runs ``[row_lo, row_hi, n_first,
    n_last]`` on which ``n`` is constant or rises by one per row (key segments in increasing position order).

    Row ``i`` at global position ``p`` sees the keys at positions ``<= c = p + offset``; with the local keys in
    increasing position order that is a prefix of them, ``n(c) = sum_j clip(c - ks_j + 1, 0, ke_j - ks_j)``:
    slope 1 while ``c`` is inside a key segment, 0 between segments. So the cut points of a query segment's
    range of ``c`` are the key segments' ends.
    """
    ks = [(a, b) for a, b in k_segs if b > a]

    def n_at(c):
        return sum(min(max(c - a + 1, 0), b - a) for a, b in ks)

    runs, q0 = [], 0
    for qs, qe in q_segs:
        if qe <= qs:
            continue
        c_lo, c_hi = qs + offset, qe - 1 + offset
        cuts = sorted({x for a, b in ks for x in (a, b) if c_lo < x <= c_hi})
        for lo, hi in zip([c_lo] + cuts, cuts + [c_hi + 1]):   # c in [lo, hi): one slope
            n0 = n_at(lo)
            inside = any(a <= lo < b for a, b in ks)
            runs.append([q0 + lo - c_lo, q0 + hi - c_lo, n0, n0 + (hi - lo - 1 if inside else 0)])
        q0 += qe - qs
    return runs


def step_calls(q_segs, k_segs, offset: int, causal: bool) -> list[tuple[int, int, int, int, bool]]:
    """Kernel calls ``(q_lo, q_hi, k_lo, k_hi, causal)`` for one ring step, over LOCAL rows and keys.

    The local queries are ``q_segs`` concatenated, the visiting keys ``k_segs`` concatenated; a call attends rows
    ``[q_lo, q_hi)`` to keys ``[k_lo, k_hi)``, bottom-right causal when ``causal``. When the key segments are in
    increasing position order (both layouts: zig-zag holds chunks ``r < 2W-1-r``), a row sees a PREFIX of the
    local keys (:func:`_visible_runs`), so rows whose prefix length is constant (a plain call) or rises by one
    per row (a causal call) join across segment boundaries, ``k_lo = 0``, and every row is in at most one call
    (none when it sees no key): ONE call per zig-zag step whatever ``W`` with equal chunks (the diagonal step is
    one causal ``2c x 2c`` call; an off-diagonal one is all rows to the first key chunk, or the second query
    chunk to both). Unsorted key segments fall back to :func:`block_calls` per segment pair, where a row can be
    in several calls.
    """
    nq = sum(max(b - a, 0) for a, b in q_segs)
    nk = sum(max(b - a, 0) for a, b in k_segs)
    if nq == 0 or nk == 0:
        return []
    if not causal:
        return [(0, nq, 0, nk, False)]
    if not _sorted_segments(k_segs):
        return [(q0 + lo, q0 + hi, k0, k0 + kh, c) for q0, k0, (lo, hi, kh, c) in _pairs(q_segs, k_segs, offset,
                                                                                           causal)]
    merged = []
    for run in _visible_runs(q_segs, k_segs, offset):
        if merged and merged[-1][1] == run[0]:
            p = merged[-1]
            flat = p[2] == p[3] == run[2] == run[3]
            rise = (p[3] - p[2] == p[1] - p[0] - 1 and run[3] - run[2] == run[1] - run[0] - 1
                    and run[2] == p[3] + 1)
            if flat or rise:
                p[1], p[3] = run[1], run[3]
                continue
        merged.append(list(run))
    # n_last > 0: rows that see no key of this chunk are skipped; a rising run is bottom-right causal
    # (its first row sees n_first = n_last - rows + 1 >= 1 keys)
    return [(lo, hi, 0, n1, n1 != n0) for lo, hi, n0, n1 in merged if n1 > 0]


def attend_segments(q, k, v, q_segs, k_segs, offset, causal, scale, step, o_acc, lse_acc):
    """Merge the attention of local queries ``q`` (segments ``q_segs``) to the visiting ``k, v`` (segments
    ``k_segs``) into the running state, in place (``merge_states`` per kernel call of :func:`step_calls`).

    ``offset = Nk - Nq`` of the GLOBAL sequence (bottom-right causal alignment). ``o_acc, lse_acc``: the
    accumulators (float32/64, or the input's 16-bit dtype: merged in fp32, rounded once per merge), or
    ``o_acc`` a :class:`~reference.distributed.merge.RunningState` and ``lse_acc = None`` (the ring's: it
    adopts a step's first output instead of merging it into zeros).
    """
    state = o_acc if isinstance(o_acc, RunningState) else None
    for q_lo, q_hi, k_lo, k_hi, c in step_calls(q_segs, k_segs, offset, causal):
        o_c, lse_c = step.forward(q[:, :, q_lo:q_hi], k[:, :, k_lo:k_hi], v[:, :, k_lo:k_hi], c, scale)
        if state is not None:
            state.absorb(q_lo, q_hi, o_c, lse_c)
        else:
            merge_rows_(o_acc[:, :, q_lo:q_hi], lse_acc[:, :, q_lo:q_hi], o_c, lse_c)


def attend_segments_backward(q, k, v, o, lse, do, q_segs, k_segs, offset, causal, scale, step,
                             dq_acc, dk_acc, dv_acc):
    """Add this K/V chunk's share of ``dq`` (local queries) and of ``dk, dv`` (the visiting chunk) in place."""
    for q_lo, q_hi, k_lo, k_hi, c in step_calls(q_segs, k_segs, offset, causal):
        rows, keys = slice(q_lo, q_hi), slice(k_lo, k_hi)
        dq, dk, dv = step.backward(q[:, :, rows], k[:, :, keys], v[:, :, keys], o[:, :, rows],
                                   lse[:, :, rows], do[:, :, rows], c, scale)
        dq_acc[:, :, rows] += dq
        dk_acc[:, :, keys] += dk
        dv_acc[:, :, keys] += dv


def default_scale(d: int, scale) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite real number or None, got {scale!r}")
    return float(scale)
