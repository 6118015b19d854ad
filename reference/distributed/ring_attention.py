"""Ring attention (context parallelism) on ``torch.distributed``: exact attention over a sequence sharded
across ranks, with K/V chunks travelling around a ring of point-to-point sends.

Each of ``W`` ranks holds the queries, keys and values of its positions (``reference.distributed.layout``).
Forward, on rank ``r`` (Liu, Zaharia, Abbeel, "Ring Attention with Blockwise Transformers", arXiv:2310.01889):

    state = (o = 0, lse = -inf)
    for s = 0 .. W-1:
        start sending the K/V chunk held now to rank r+1, receiving the next one from rank r-1   (async)
        state = merge_states(state, attention(q_r, chunk of rank (r - s) mod W))                (compute)
        wait for the receive

so communication of step ``s + 1``'s chunk overlaps with step ``s``'s compute, and ``merge_states``
(``reference.distributed.merge``) makes the result exact whatever order the chunks arrive in. Backward: ``dQ``
stays local (``dq += this chunk's share``, from the GLOBAL ``o`` and ``lse`` as in FA2 Algorithm 2), and the
fp32 ``dK, dV`` accumulators travel with their K/V chunk: each rank adds its share and passes them on; after
``W`` hops they are back at the chunk's owner. Sends are ``torch.distributed.batch_isend_irecv`` (gloo on CPU
processes, NCCL on GPUs, where a batch avoids the send/send deadlock of a ring of blocking calls).

Causal masks use the global positions (bottom-right aligned: ``t <= p + Nk - Nq``); with ``layout="zigzag"``
every rank does the same work at every step (``reference.distributed.schedule``).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .collectives import GroupInfo
from .layout import check_layout, local_length, rank_segments, shard, unshard
from .local_step import attend_segments, attend_segments_backward, default_scale, get_step
from .merge import RunningState, acc_dtype, state_dtype_for

_KV_TAG, _DKV_TAG = 1, 2


# ----------------------------------------------------------------------------------------------------------
# checks and ring bookkeeping
# ----------------------------------------------------------------------------------------------------------
def check_qkv(q, k, v):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, N_local, d), got {tuple(x.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, Hkv, N_local, d), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share batch size and head dim, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads Hq={q.shape[1]} must be a multiple of kv heads Hkv={k.shape[1]} (GQA)")


def check_backward_inputs(q, k, v, o, lse, do):
    """:func:`check_qkv`, and the forward's ``o, lse`` and the incoming ``do`` shaped as ``q`` says."""
    check_qkv(q, k, v)
    if o.shape != q.shape or do.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"o and do must have q's shape {tuple(q.shape)} and lse {tuple(q.shape[:3])}, got "
                         f"o {tuple(o.shape)}, do {tuple(do.shape)}, lse {tuple(lse.shape)}")


class RingPlan:
    """This rank's place in the ring of ``group`` and the global lengths / segments of the sequence."""

    def __init__(self, group, q, k, layout, seq_lens):
        info = GroupInfo(group)
        self.group, self.rank, self.world = group, info.rank, info.world
        self.next, self.prev = info.members[(self.rank + 1) % self.world], info.members[(self.rank - 1) % self.world]
        if seq_lens is None:  # one tiny all-reduce: the global lengths are the sums of the local ones
            t = torch.tensor([q.shape[2], k.shape[2]], dtype=torch.int64, device=q.device)
            dist.all_reduce(t, group=group)
            seq_lens = tuple(int(x) for x in t.tolist())
        self.nq, self.nk = seq_lens
        self.q_segs = rank_segments(self.nq, self.world, layout)
        self.k_segs = rank_segments(self.nk, self.world, layout)
        for name, x, segs, n in (("q", q, self.q_segs, self.nq), ("k", k, self.k_segs, self.nk)):
            want = local_length(segs[self.rank])
            if x.shape[2] != want:
                raise ValueError(f"{name} holds {x.shape[2]} positions, but rank {self.rank} of {self.world} "
                                 f"holds {want} of a length-{n} sequence in the {layout!r} layout "
                                 f"(shard it with reference.distributed.shard)")

    def held_len(self, step: int) -> int:
        """Length of the K/V chunk this rank holds at ring step ``step`` (that of rank ``rank - step``)."""
        return local_length(self.k_segs[(self.rank - step) % self.world])

    def exchange(self, send, recv, tag):
        """Start sending ``send`` to the next rank and receiving ``recv`` from the previous one."""
        return _Exchange(send, recv, self.next, self.prev, self.group, tag)


class _Exchange:
    """In-flight sends/receives; ``wait()`` returns the receive buffers (kept alive until then, with the sends)."""

    def __init__(self, send, recv, nxt, prev, group, tag):
        ops = ([dist.P2POp(dist.isend, t, nxt, group, tag) for t in send if t.numel()]
               + [dist.P2POp(dist.irecv, t, prev, group, tag) for t in recv if t.numel()])
        self.works = dist.batch_isend_irecv(ops) if ops else []
        self.send, self.recv = send, recv

    def wait(self):
        for w in self.works:
            w.wait()
        return self.recv


class _Clock:
    """Step timings for ``stats``: CUDA events on a GPU (no device-wide sync that would hide overlap); on CPU
    wall time, plus this process's CPU time (the work itself, unaffected by other processes on the machine)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((e, 0.0))
        else:
            self.marks.append((time.perf_counter(), time.process_time()))
        return len(self.marks) - 1

    def seconds(self, a, b, cpu=False):
        (ta, ca), (tb, cb) = self.marks[a], self.marks[b]
        if self.cuda:
            if cpu:
                return None
            tb.synchronize()
            return ta.elapsed_time(tb) / 1e3
        return cb - ca if cpu else tb - ta


def _record(stats, clock, steps):
    if stats is not None:
        stats["compute_s"] = [clock.seconds(a, b) for a, b, _ in steps]
        stats["wait_s"] = [clock.seconds(b, c) for _, b, c in steps]
        if not clock.cuda:
            stats["compute_cpu_s"] = [clock.seconds(a, b, cpu=True) for a, b, _ in steps]


# ----------------------------------------------------------------------------------------------------------
# forward and backward
# ----------------------------------------------------------------------------------------------------------
def ring_attention_forward(q, k, v, causal=False, scale=None, layout="zigzag", step="torch", group=None,
                           seq_lens=None, stats=None, state_dtype=None):
    """Forward ring attention on this rank's shard: ``(o, lse)`` of its queries over the whole sequence.

    Args:
        q: ``(B, Hq, nq_local, d)``; k, v: ``(B, Hkv, nk_local, d)``: this rank's positions of the global
            sequences (``shard(x, rank, world, layout)``), any float dtype, on the process group's device.
        causal: global bottom-right causal mask. scale: defaults to ``1/sqrt(d)``.
        layout: ``"zigzag"`` (balanced causal work) or ``"contiguous"``; must match how the inputs were sharded.
        step: the local attention (``"torch"``, ``"numpy"``, ``"triton"`` or an object, see ``local_step``).
        group: the process group (default: the world). seq_lens: global ``(Nq, Nk)`` if known (else one
            all-reduce finds them).
        stats: a dict to fill with per-step ``compute_s`` and ``wait_s`` (time blocked on the receive), and on
            CPU ``compute_cpu_s`` (process CPU time of the compute).
        state_dtype: dtype of the running output between steps (``merge.state_dtype_for``; default: float32,
            float64 for float64 inputs, the input's 16-bit dtype for 16-bit inputs on up to
            ``RING_PINS["half_state_max_world"]`` ranks: error vs float64 within 1.15x of the kernel's own).

    Returns:
        ``o`` (q's dtype and shape) and ``lse`` ``(B, Hq, nq_local)`` float32 (float64 for float64 inputs);
        rows that see no key give ``o = 0``, ``lse = -inf``.
    """
    check_qkv(q, k, v)
    layout, step = check_layout(layout), get_step(step)
    scale = default_scale(q.shape[-1], scale)
    ring = RingPlan(group, q, k, layout, seq_lens)
    state = RunningState(q.shape, state_dtype_for(q, ring.world, state_dtype), acc_dtype(q), q.device)
    B, _, _, d = q.shape
    k_cur, v_cur = k.contiguous(), v.contiguous()
    clock, steps = _Clock(q.device), []
    for s in range(ring.world):
        ex = None
        if s < ring.world - 1:   # prefetch the next chunk while this one is computed
            shape = (B, k.shape[1], ring.held_len(s + 1), d)
            ex = ring.exchange([k_cur, v_cur], [k.new_empty(shape), v.new_empty(shape)], _KV_TAG)
        a = clock.mark()
        attend_segments(q, k_cur, v_cur, ring.q_segs[ring.rank], ring.k_segs[(ring.rank - s) % ring.world],
                        ring.nk - ring.nq, causal, scale, step, state, None)
        b = clock.mark()
        if ex is not None:
            k_cur, v_cur = ex.wait()
        steps.append((a, b, clock.mark()))
    _record(stats, clock, steps)
    o, lse = state.result()
    return o.to(q.dtype), lse


def ring_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, layout="zigzag", step="torch",
                            group=None, seq_lens=None, stats=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(o * do)`` for this rank's shard (module docstring: dQ local, dK/dV
    accumulators travelling around the ring with their chunk). ``o, lse`` are the forward's outputs."""
    check_backward_inputs(q, k, v, o, lse, do)
    layout, step = check_layout(layout), get_step(step)
    scale = default_scale(q.shape[-1], scale)
    ring = RingPlan(group, q, k, layout, seq_lens)
    acc = acc_dtype(q)
    B, Hkv, _, d = k.shape
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    k_cur, v_cur = k.contiguous(), v.contiguous()
    dkv_ex, clock, steps = None, _Clock(q.device), []
    for s in range(ring.world):
        kv_ex = None
        if s < ring.world - 1:
            shape = (B, Hkv, ring.held_len(s + 1), d)
            kv_ex = ring.exchange([k_cur, v_cur], [k.new_empty(shape), v.new_empty(shape)], _KV_TAG)
        a = clock.mark()
        dk_b = torch.zeros(k_cur.shape, dtype=acc, device=q.device)
        dv_b = torch.zeros(k_cur.shape, dtype=acc, device=q.device)
        attend_segments_backward(q, k_cur, v_cur, o, lse, do, ring.q_segs[ring.rank],
                                 ring.k_segs[(ring.rank - s) % ring.world], ring.nk - ring.nq, causal, scale,
                                 step, dq, dk_b, dv_b)
        b = clock.mark()
        if dkv_ex is not None:   # the accumulators of this chunk, from the ranks that held it before
            dk_in, dv_in = dkv_ex.wait()
            dk_b += dk_in
            dv_b += dv_in
        if ring.world > 1:       # pass them on; after the last step they reach the chunk's owner
            shape = (B, Hkv, ring.held_len(s + 1), d)
            dkv_ex = ring.exchange([dk_b, dv_b], [dk_b.new_empty(shape), dv_b.new_empty(shape)], _DKV_TAG)
        else:
            dk_home, dv_home = dk_b, dv_b
        if kv_ex is not None:
            k_cur, v_cur = kv_ex.wait()
        steps.append((a, b, clock.mark()))
    if dkv_ex is not None:
        dk_home, dv_home = dkv_ex.wait()
    _record(stats, clock, steps)
    return dq.to(q.dtype), dk_home.to(k.dtype), dv_home.to(v.dtype)


def kv_ring_pass(k, v, layout="zigzag", group=None, seq_lens=None):
    """The forward's communication alone: pass the K/V chunks ``world - 1`` hops around the ring, with no
    compute (what the benchmark compares the exposed wait time with). Returns the chunk held at the end."""
    ring = RingPlan(group, k, k, check_layout(layout), None if seq_lens is None else (seq_lens[1], seq_lens[1]))
    k_cur, v_cur = k.contiguous(), v.contiguous()
    for s in range(ring.world - 1):
        shape = (k.shape[0], k.shape[1], ring.held_len(s + 1), k.shape[3])
        k_cur, v_cur = ring.exchange([k_cur, v_cur], [k.new_empty(shape), v.new_empty(shape)], _KV_TAG).wait()
    return k_cur, v_cur


class RingAttentionFunction(torch.autograd.Function):
    """Differentiable ring attention: forward saves ``q, k, v, o, lse`` (O(N_local d)); backward rings again."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, step, group, seq_lens):
        o, lse = ring_attention_forward(q, k, v, causal, scale, layout, step, group, seq_lens)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.cfg = (causal, scale, layout, step, group, seq_lens)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        grads = ring_attention_backward(q, k, v, o, lse, do.contiguous(), *ctx.cfg)
        return (*grads, None, None, None, None, None, None)


def ring_attention(q, k, v, causal=False, scale=None, layout="zigzag", step="torch", group=None, seq_lens=None):
    """Differentiable ring attention on this rank's shard: returns ``o``; ``o.backward(do)`` fills the local
    ``q.grad, k.grad, v.grad`` (arguments as in :func:`ring_attention_forward`)."""
    return RingAttentionFunction.apply(q, k, v, causal, scale, layout, get_step(step), group, seq_lens)


# ----------------------------------------------------------------------------------------------------------
# the same schedule in one process (no communication): lecture and single-GPU emulation
# ----------------------------------------------------------------------------------------------------------
def simulate_ring_attention(q, k, v, world, causal=False, scale=None, layout="zigzag", step="torch", do=None,
                            stats=None, state_dtype=None):
    """Run every rank's ring steps one after another in this process, on FULL ``q (B, Hq, Nq, d)``,
    ``k, v (B, Hkv, Nk, d)``; return the full ``(o, lse)``, plus ``(dq, dk, dv)`` when ``do`` is given.

    The same local steps and merges as :func:`ring_attention_forward` / ``_backward`` (rank ``r`` at step ``s``
    attends to chunk ``(r - s) mod world``); only the sends are missing. ``stats["compute_s"]`` gets a
    ``(world, world)`` list of per-rank, per-step forward compute times (device-synchronised).
    """
    check_qkv(q, k, v)
    layout, step = check_layout(layout), get_step(step)
    scale = default_scale(q.shape[-1], scale)
    nq, nk = q.shape[2], k.shape[2]
    q_segs, k_segs = rank_segments(nq, world, layout), rank_segments(nk, world, layout)
    qs = [shard(q, r, world, layout) for r in range(world)]
    ks = [shard(k, r, world, layout) for r in range(world)]
    vs = [shard(v, r, world, layout) for r in range(world)]
    acc = acc_dtype(q)
    sync = torch.cuda.synchronize if q.device.type == "cuda" else (lambda: None)
    outs, lses, times = [], [], []
    for r in range(world):
        st = RunningState(qs[r].shape, state_dtype_for(q, world, state_dtype), acc, q.device)
        times.append([])
        for s in range(world):
            src = (r - s) % world
            sync()
            t0 = time.perf_counter()
            attend_segments(qs[r], ks[src], vs[src], q_segs[r], k_segs[src], nk - nq, causal, scale, step, st, None)
            sync()
            times[r].append(time.perf_counter() - t0)
        o_r, l_r = st.result()
        outs.append(o_r.to(q.dtype))
        lses.append(l_r)
    if stats is not None:
        stats["compute_s"] = times
    o, lse = unshard(outs, layout), unshard([x.unsqueeze(-1) for x in lses], layout).squeeze(-1)
    if do is None:
        return o, lse
    dos = [shard(do, r, world, layout) for r in range(world)]
    dq = [torch.zeros(x.shape, dtype=acc, device=q.device) for x in qs]
    dk = [torch.zeros(x.shape, dtype=acc, device=q.device) for x in ks]
    dv = [torch.zeros(x.shape, dtype=acc, device=q.device) for x in ks]
    for r in range(world):
        for s in range(world):
            src = (r - s) % world
            attend_segments_backward(qs[r], ks[src], vs[src], outs[r], lses[r], dos[r], q_segs[r], k_segs[src],
                                     nk - nq, causal, scale, step, dq[r], dk[src], dv[src])
    grads = tuple(unshard([x.to(q.dtype) for x in g], layout) for g in (dq, dk, dv))
    return o, lse, grads
