"""Ulysses attention (all-to-all over heads), its hybrid with the ring, and all-gather context parallelism.

Three other ways than the ring (``ring_attention``) to attend over a sequence sharded across ranks; the
byte counts of each are ``comm_model``'s, the lecture compares them (lecture 10).

**Ulysses** (Jacobs et al., "DeepSpeed Ulysses", arXiv:2309.14509). Rank ``u`` of ``W`` holds ``c = n / W``
positions of every head. An all-to-all turns "my positions, all heads" into "all positions, my ``Hq / W``
heads"; each rank then runs ordinary attention (any local step that returns ``lse``) over the whole
sequence for its heads, and a second all-to-all turns the output back::

    q_h = all_to_all(q)   k_h, v_h = all_to_all(k), all_to_all(v)      (B, Hq/W, n, d), (B, Hkv/W, n, d)
    o_h = attention(q_h, k_h, v_h)                                      no communication inside
    o   = all_to_all(o_h)                                               (B, Hq, c, d)

GQA: query head ``h`` reads kv head ``h // (Hq / Hkv)``; rank ``u``'s query heads ``[u Hq/W, (u+1) Hq/W)``
need kv heads ``[u Hq/W // G, ...]`` with ``G = Hq / Hkv``. With ``Hkv >= W`` those are ``Hkv / W`` heads of its
own; with ``Hkv < W`` several ranks need the same kv head, which is sent to each of them (replicated), and in
the backward their dK/dV shares are summed on the way back. Backward: ``dO`` travels like ``q``; ``dQ``,
``dK``, ``dV`` travel back like ``o``; the attention backward in between is local (FA2 Algorithm 2).

**Hybrid** (Fang and Zhao, "USP: a unified sequence parallelism approach", arXiv:2405.07719): ``W = a x b``
ranks in ``b`` groups of ``a`` (rank ``g a + u``). Ulysses runs inside each group (the all-to-all stays on
the fast links of one node); the ring runs across groups, between the ranks that hold the same heads
(``u``). Positions: ``layout.hybrid_segments`` (the ring's zig-zag shares across groups, contiguous cuts
inside a group). ``a = W`` is Ulysses, ``b = W`` is the ring.

**All-gather** (Llama 3, arXiv:2407.21783, §3.3.2): every rank gathers all of K and V, attends its own
(zig-zag) queries to them; backward gathers again, and the dK/dV of every position are summed at its owner
(a reduce-scatter). Simple, exposed, and with GQA cheap (K/V are the small tensors).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .collectives import GroupInfo, all_to_all
from .layout import (check_layout, hybrid_segments, local_length, rank_segments, take_segments, unshard)
from .local_step import attend_segments, attend_segments_backward, default_scale, get_step
from .merge import RunningState, acc_dtype, state_dtype_for
from .ring_attention import (RingPlan, check_backward_inputs, check_qkv, ring_attention_backward,
                             ring_attention_forward)


# ----------------------------------------------------------------------------------------------------------
# heads and groups
# ----------------------------------------------------------------------------------------------------------
def head_split(hq: int, hkv: int, world: int) -> list[tuple[int, int, int, int]]:
    """Per member ``u`` of a Ulysses group of ``world``: ``(q_lo, q_hi, kv_lo, kv_hi)``, the query heads it
    attends and the kv heads they read (module docstring). Raises ``ValueError`` where the heads do not split."""
    for name, x in (("hq", hq), ("hkv", hkv), ("world", world)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    if hq % hkv:
        raise ValueError(f"query heads Hq={hq} must be a multiple of kv heads Hkv={hkv} (GQA)")
    if hq % world:
        raise ValueError(f"Ulysses splits query heads over the group: Hq={hq} must be a multiple of the Ulysses "
                         f"size {world}")
    per, group = hq // world, hq // hkv
    if per % group and group % per:
        raise ValueError(f"with Hq={hq}, Hkv={hkv} and Ulysses size {world}, a rank's {per} query heads would "
                         f"share kv heads with other ranks unevenly: Hq/size must divide or be divided by Hq/Hkv")
    out = []
    for u in range(world):
        lo = u * per
        kv_lo = lo // group
        kv_hi = kv_lo + (per // group if per % group == 0 else 1)
        out.append((lo, lo + per, kv_lo, kv_hi))
    return out


class _SoloInfo:
    """A group of one (no communication): what :class:`GroupInfo` says, for a rank alone."""

    group, rank, world = None, 0, 1

    def __init__(self):
        self.members = [dist.get_rank() if dist.is_initialized() else 0]


class HybridGroups:
    """The process groups of the hybrid: this rank's Ulysses group (``a`` consecutive ranks) and ring group
    (the ranks holding the same heads in every group). Build it with :func:`hybrid_groups` (a collective)."""

    def __init__(self, ulysses: int, ring: int, uly_group, ring_group):
        self.ulysses, self.ring = ulysses, ring
        self.uly = GroupInfo(uly_group) if ulysses > 1 else _SoloInfo()
        self.ring_group = ring_group
        self.ring_rank = dist.get_rank(ring_group) if ring > 1 else 0

    @property
    def index(self) -> int:
        """This rank's index in ``hybrid_segments`` order: ``g * ulysses + u``."""
        return self.ring_rank * self.ulysses + self.uly.rank


def hybrid_groups(ulysses: int) -> HybridGroups:
    """Split the world into ``W / ulysses`` groups of ``ulysses`` consecutive ranks (Ulysses inside, ring
    across). Every rank must call it, with the same ``ulysses`` (``torch.distributed.new_group`` is collective)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("torch.distributed is not initialised (reference.distributed.run_ranks does it)")
    world, rank = dist.get_world_size(), dist.get_rank()
    if isinstance(ulysses, bool) or not isinstance(ulysses, int) or ulysses < 1 or world % ulysses:
        raise ValueError(f"ulysses must be a positive divisor of the world size {world}, got {ulysses!r}")
    ring = world // ulysses
    mine_u = mine_r = None
    if ulysses > 1:
        for g in range(ring):
            grp = dist.new_group(list(range(g * ulysses, (g + 1) * ulysses)))
            if rank // ulysses == g:
                mine_u = grp
    if ring > 1:
        for u in range(ulysses):
            grp = dist.new_group([g * ulysses + u for g in range(ring)])
            if rank % ulysses == u:
                mine_r = grp
    return HybridGroups(ulysses, ring, mine_u, mine_r)


# ----------------------------------------------------------------------------------------------------------
# the plan of one call and its all-to-alls
# ----------------------------------------------------------------------------------------------------------
class _Plan:
    """Lengths, position segments and head ranges of one call, checked against this rank's inputs."""

    def __init__(self, groups: HybridGroups, q, k, layout, seq_lens):
        self.groups, uly = groups, groups.uly
        self.heads = head_split(q.shape[1], k.shape[1], uly.world)
        if seq_lens is None:  # group shares from the Ulysses group, totals across the ring
            t = torch.tensor([q.shape[2], k.shape[2]], dtype=torch.int64, device=q.device)
            if uly.world > 1:
                dist.all_reduce(t, group=uly.group)
            if groups.ring > 1:
                dist.all_reduce(t, group=groups.ring_group)
            seq_lens = tuple(int(x) for x in t.tolist())
        self.nq, self.nk = seq_lens
        a, b, g = uly.world, groups.ring, groups.ring_rank
        self.q_all = hybrid_segments(self.nq, a, b, layout)
        self.k_all = hybrid_segments(self.nk, a, b, layout)
        self.q_lens = [local_length(self.q_all[g * a + j]) for j in range(a)]
        self.k_lens = [local_length(self.k_all[g * a + j]) for j in range(a)]
        self.q_share = rank_segments(self.nq, b, layout)[g]   # this group's positions, in the ring's order
        self.k_share = rank_segments(self.nk, b, layout)[g]
        for name, x, want in (("q", q, self.q_lens[uly.rank]), ("k", k, self.k_lens[uly.rank])):
            if x.shape[2] != want:
                raise ValueError(f"{name} holds {x.shape[2]} positions, but rank {groups.index} of the "
                                 f"{a} x {b} hybrid holds {want} of the sequence (shard it with "
                                 f"reference.distributed.layout.hybrid_shard)")

    def scatter(self, x, kind):
        """"My positions, all heads" -> "the group's positions, my heads" (``kind``: ``"q"`` or ``"kv"``)."""
        uly = self.groups.uly
        lo_i, hi_i = (0, 1) if kind == "q" else (2, 3)
        lens = self.q_lens if kind == "q" else self.k_lens
        mine = self.heads[uly.rank]
        sends = [x[:, h[lo_i]:h[hi_i]] for h in self.heads]
        shapes = [(x.shape[0], mine[hi_i] - mine[lo_i], n, *x.shape[3:]) for n in lens]
        return torch.cat(all_to_all(sends, shapes, uly, x), dim=2)

    def gather(self, xh, kind, n_heads, acc=None):
        """The inverse: "the group's positions, my heads" -> "my positions, all heads". ``kind="kv"`` sums the
        pieces of replicated kv heads (their gradients), in ``acc`` (a dtype) if given."""
        uly = self.groups.uly
        lo_i, hi_i = (0, 1) if kind == "q" else (2, 3)
        lens = self.q_lens if kind == "q" else self.k_lens
        offs = [sum(lens[:j]) for j in range(len(lens))]
        sends = [xh[:, :, o:o + n] for o, n in zip(offs, lens)]
        my_len = lens[uly.rank]
        shapes = [(xh.shape[0], h[hi_i] - h[lo_i], my_len, *xh.shape[3:]) for h in self.heads]
        recvs = all_to_all(sends, shapes, uly, xh)
        if kind == "q":
            return torch.cat(recvs, dim=1)
        out = xh.new_zeros((xh.shape[0], n_heads, my_len, *xh.shape[3:]), dtype=acc or xh.dtype)
        for h, piece in zip(self.heads, recvs):
            out[:, h[lo_i]:h[hi_i]] += piece
        return out


class _Timer:
    """Seconds spent in the all-to-alls (exposed communication) and in attention, for ``stats``."""

    def __init__(self, device, stats):
        self.stats, self.cuda = stats, device.type == "cuda"
        if stats is not None:
            stats.setdefault("a2a_s", 0.0)
            stats.setdefault("attn_s", 0.0)

    def __call__(self, key, fn, *args):
        if self.stats is None:
            return fn(*args)
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*args)
        if self.cuda:
            torch.cuda.synchronize()
        self.stats[key] += time.perf_counter() - t0
        return out


# ----------------------------------------------------------------------------------------------------------
# hybrid (and Ulysses: ring = 1) forward and backward
# ----------------------------------------------------------------------------------------------------------
def _attend_heads(plan, qh, kh, vh, causal, scale, layout, step):
    """Attention of the group's positions for this rank's heads: local (ring of one) or around the ring."""
    g = plan.groups
    if g.ring > 1:
        return ring_attention_forward(qh, kh, vh, causal, scale, layout, step, group=g.ring_group,
                                      seq_lens=(plan.nq, plan.nk))
    state = RunningState(qh.shape, state_dtype_for(qh, 1), acc_dtype(qh), qh.device)
    attend_segments(qh, kh, vh, plan.q_share, plan.k_share, plan.nk - plan.nq, causal, scale, step, state, None)
    o, lse = state.result()
    return o.to(qh.dtype), lse


def _attend_heads_backward(plan, qh, kh, vh, oh, lseh, doh, causal, scale, layout, step):
    g = plan.groups
    if g.ring > 1:
        return ring_attention_backward(qh, kh, vh, oh, lseh, doh, causal, scale, layout, step, group=g.ring_group,
                                       seq_lens=(plan.nq, plan.nk))
    acc = acc_dtype(qh)
    dq = torch.zeros(qh.shape, dtype=acc, device=qh.device)
    dk = torch.zeros(kh.shape, dtype=acc, device=qh.device)
    dv = torch.zeros(kh.shape, dtype=acc, device=qh.device)
    attend_segments_backward(qh, kh, vh, oh, lseh, doh, plan.q_share, plan.k_share, plan.nk - plan.nq, causal,
                             scale, step, dq, dk, dv)
    return dq, dk, dv


def _forward_heads(q, k, v, groups, causal, scale, layout, step, seq_lens, stats):
    """The forward, also returning what the backward needs in head-sharded form (``plan, qh, kh, vh, oh, lseh``)."""
    check_qkv(q, k, v)
    layout, step = check_layout(layout), get_step(step)
    scale = default_scale(q.shape[-1], scale)
    plan = _Plan(groups, q, k, layout, seq_lens)
    timer = _Timer(q.device, stats)
    qh = timer("a2a_s", plan.scatter, q, "q")
    kh = timer("a2a_s", plan.scatter, k, "kv")
    vh = timer("a2a_s", plan.scatter, v, "kv")
    oh, lseh = timer("attn_s", _attend_heads, plan, qh, kh, vh, causal, scale, layout, step)
    o = timer("a2a_s", plan.gather, oh, "q", q.shape[1])
    lse = timer("a2a_s", plan.gather, lseh, "q", q.shape[1])
    return (o, lse), (plan, qh, kh, vh, oh, lseh, scale, layout, step)


def _backward_heads(saved, do, hq, q_dtype, hkv, k_dtype, causal, stats):
    """``dO`` in (like ``q``), the local or ring backward, ``dQ`` out (like ``o``), ``dK, dV`` out summed over
    the ranks that shared a replicated kv head (in fp32, or fp64 for fp64 inputs)."""
    plan, qh, kh, vh, oh, lseh, scale, layout, step = saved
    timer = _Timer(do.device, stats)
    doh = timer("a2a_s", plan.scatter, do.contiguous(), "q")
    dqh, dkh, dvh = timer("attn_s", _attend_heads_backward, plan, qh, kh, vh, oh, lseh, doh, causal, scale, layout,
                          step)
    acc = torch.float64 if q_dtype == torch.float64 else torch.float32
    dq = timer("a2a_s", plan.gather, dqh, "q", hq)
    dk = timer("a2a_s", plan.gather, dkh, "kv", hkv, acc)
    dv = timer("a2a_s", plan.gather, dvh, "kv", hkv, acc)
    return dq.to(q_dtype), dk.to(k_dtype), dv.to(k_dtype)


def _solo_or(groups, group):
    if groups is not None:
        if not isinstance(groups, HybridGroups):
            raise TypeError(f"groups must be a HybridGroups (from hybrid_groups), got {type(groups).__name__}")
        return groups
    info = GroupInfo(group)
    hg = HybridGroups.__new__(HybridGroups)
    hg.ulysses, hg.ring, hg.uly, hg.ring_group, hg.ring_rank = info.world, 1, info, None, 0
    return hg


def hybrid_attention_forward(q, k, v, groups, causal=False, scale=None, layout="zigzag", step="torch",
                             seq_lens=None, stats=None):
    """Forward of the hybrid on this rank's shard (``layout.hybrid_shard``): ``(o, lse)`` of its positions.

    Args:
        q: ``(B, Hq, n_local, d)``; k, v: ``(B, Hkv, n_local, d)``. groups: :func:`hybrid_groups`'s result.
        causal: global bottom-right causal mask. layout: the ring's layout across groups (``"zigzag"`` or
            ``"contiguous"``). step: the local attention (``local_step``). seq_lens: global ``(Nq, Nk)``.
        stats: a dict that receives ``a2a_s`` (seconds in the all-to-alls: exposed communication) and
            ``attn_s`` (the attention, the ring's own communication included and overlapped inside it).
    """
    (o, lse), _ = _forward_heads(q, k, v, _solo_or(groups, None), causal, scale, layout, step, seq_lens, stats)
    return o, lse


def hybrid_attention_backward(q, k, v, o, lse, do, groups, causal=False, scale=None, layout="zigzag",
                              step="torch", seq_lens=None, stats=None):
    """``(dq, dk, dv)`` of ``sum(o * do)`` for this rank's shard. Functional form: it redoes the forward's
    all-to-alls of ``q, k, v`` and sends ``o, lse`` like them; :func:`hybrid_attention` keeps the head-sharded
    tensors from its forward instead and sends only ``dO`` in, ``dQ, dK, dV`` out."""
    check_backward_inputs(q, k, v, o, lse, do)
    groups = _solo_or(groups, None)
    layout, step_ = check_layout(layout), get_step(step)
    scale = default_scale(q.shape[-1], scale)
    plan = _Plan(groups, q, k, layout, seq_lens)
    timer = _Timer(q.device, stats)
    qh, kh, vh = (timer("a2a_s", plan.scatter, x, kind) for x, kind in ((q, "q"), (k, "kv"), (v, "kv")))
    oh = timer("a2a_s", plan.scatter, o, "q")
    lseh = timer("a2a_s", plan.scatter, lse.unsqueeze(-1), "q").squeeze(-1)
    return _backward_heads((plan, qh, kh, vh, oh, lseh, scale, layout, step_), do, q.shape[1], q.dtype, k.shape[1],
                           k.dtype, causal, stats)


class _HybridFunction(torch.autograd.Function):
    """Differentiable hybrid: forward keeps the head-sharded ``q, k, v, o, lse`` (O(n_local d) per rank, as the
    inputs); backward sends ``dO`` in and ``dQ, dK, dV`` out."""

    @staticmethod
    def forward(ctx, q, k, v, groups, causal, scale, layout, step, seq_lens, stats):
        (o, _), saved = _forward_heads(q, k, v, groups, causal, scale, layout, step, seq_lens, stats)
        plan, qh, kh, vh, oh, lseh, *cfg = saved
        ctx.save_for_backward(qh, kh, vh, oh, lseh)
        ctx.rest = (plan, cfg, causal, q.shape[1], q.dtype, k.shape[1], k.dtype, stats)
        return o

    @staticmethod
    def backward(ctx, do):
        qh, kh, vh, oh, lseh = ctx.saved_tensors
        plan, cfg, causal, hq, q_dtype, hkv, k_dtype, stats = ctx.rest
        grads = _backward_heads((plan, qh, kh, vh, oh, lseh, *cfg), do, hq, q_dtype, hkv, k_dtype, causal, stats)
        return (*grads, None, None, None, None, None, None, None)


def hybrid_attention(q, k, v, groups, causal=False, scale=None, layout="zigzag", step="torch", seq_lens=None,
                     stats=None):
    """Differentiable hybrid attention on this rank's shard: returns ``o``; ``o.backward(do)`` fills the local
    gradients (arguments as in :func:`hybrid_attention_forward`; ``stats`` accumulates both passes' times)."""
    return _HybridFunction.apply(q, k, v, _solo_or(groups, None), causal, scale, layout, get_step(step), seq_lens,
                                 stats)


def ulysses_attention_forward(q, k, v, causal=False, scale=None, step="torch", group=None, seq_lens=None,
                              stats=None):
    """Ulysses on ``group`` (default: the world): the hybrid with one group of every rank. Inputs are this
    rank's contiguous cut of the sequence (``hybrid_shard(x, rank, W, 1)``, i.e. ``shard(x, rank, W,
    "contiguous")``)."""
    return hybrid_attention_forward(q, k, v, _solo_or(None, group), causal, scale, "contiguous", step, seq_lens,
                                    stats)


def ulysses_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, step="torch", group=None,
                               seq_lens=None, stats=None):
    """Gradients of :func:`ulysses_attention_forward` (functional form)."""
    return hybrid_attention_backward(q, k, v, o, lse, do, _solo_or(None, group), causal, scale, "contiguous",
                                     step, seq_lens, stats)


def ulysses_attention(q, k, v, causal=False, scale=None, step="torch", group=None, seq_lens=None):
    """Differentiable Ulysses attention on this rank's contiguous shard."""
    return _HybridFunction.apply(q, k, v, _solo_or(None, group), causal, scale, "contiguous", get_step(step),
                                 seq_lens, None)


# ----------------------------------------------------------------------------------------------------------
# all-gather context parallelism
# ----------------------------------------------------------------------------------------------------------
def _gather_kv(ring, info, k, v):
    shapes = [(k.shape[0], k.shape[1], local_length(s), k.shape[3]) for s in ring.k_segs]
    ks = all_to_all([k] * info.world, shapes, info, k)
    vs = all_to_all([v] * info.world, shapes, info, v)
    return unshard(ks, ring.layout), unshard(vs, ring.layout)


def _allgather_setup(q, k, v, layout, step, scale, group, seq_lens, stats):
    """Checks, this rank's plan, and every rank's K/V gathered into the whole sequence (timed as ``a2a_s``)."""
    layout, step = check_layout(layout), get_step(step)
    ring, info = RingPlan(group, q, k, layout, seq_lens), GroupInfo(group)
    ring.layout = layout
    timer = _Timer(q.device, stats)
    kf, vf = timer("a2a_s", _gather_kv, ring, info, k, v)
    return ring, info, timer, step, default_scale(q.shape[-1], scale), kf, vf


def allgather_attention_forward(q, k, v, causal=False, scale=None, layout="zigzag", step="torch", group=None,
                                seq_lens=None, stats=None):
    """All-gather context parallelism (module docstring): ``(o, lse)`` of this rank's queries (sharded as the
    ring's, ``layout.shard``). ``stats`` receives ``a2a_s`` (the gather) and ``attn_s``."""
    check_qkv(q, k, v)
    ring, info, timer, step, scale, kf, vf = _allgather_setup(q, k, v, layout, step, scale, group, seq_lens, stats)
    state = RunningState(q.shape, state_dtype_for(q, 1), acc_dtype(q), q.device)
    timer("attn_s", attend_segments, q, kf, vf, ring.q_segs[ring.rank], [(0, ring.nk)], ring.nk - ring.nq, causal,
          scale, step, state, None)
    o, lse = state.result()
    return o.to(q.dtype), lse


def allgather_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, layout="zigzag", step="torch",
                                 group=None, seq_lens=None, stats=None):
    """Gradients for this rank's shard: gather K/V again, dQ local, dK/dV of every position summed at its owner."""
    check_backward_inputs(q, k, v, o, lse, do)
    ring, info, timer, step, scale, kf, vf = _allgather_setup(q, k, v, layout, step, scale, group, seq_lens, stats)
    acc = acc_dtype(q)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dkf = torch.zeros(kf.shape, dtype=acc, device=q.device)
    dvf = torch.zeros(kf.shape, dtype=acc, device=q.device)
    timer("attn_s", attend_segments_backward, q, kf, vf, o, lse, do, ring.q_segs[ring.rank], [(0, ring.nk)],
          ring.nk - ring.nq, causal, scale, step, dq, dkf, dvf)

    def reduce_scatter(full):
        mine = (k.shape[0], k.shape[1], k.shape[2], k.shape[3])
        parts = all_to_all([take_segments(full, s) for s in ring.k_segs], [mine] * info.world, info, full)
        return torch.stack(parts).sum(0)

    dk = timer("a2a_s", reduce_scatter, dkf)
    dv = timer("a2a_s", reduce_scatter, dvf)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
