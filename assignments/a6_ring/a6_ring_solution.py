# %% [markdown]
# # Assignment 6 (optional) -- ring attention: the merge step and the backward step
#
# Lecture 10 splits one long sequence across W devices. Each rank keeps the queries of its positions and a
# running attention state `(o, lse)`; at every ring step a chunk of keys and values from another rank visits,
# the rank attends its queries to it and **merges** the result into its state. After W steps every query has
# seen every key, and the state is exactly the attention over the whole sequence.
#
# You will write that step in NumPy (Part 1), then the step of the **backward** pass (Part 2):
#
# `ring_step(o, lse, q, k, v, q_pos, k_pos, causal=True, scale=None) -> (o, lse)`
#
# * `o (..., Hq, nq, d)`, `lse (..., Hq, nq)`: the rank's running state (float32, or float64). A row whose keys
#   so far were all invisible has `o = 0`, `lse = -inf` (the state before the first step is all such rows).
# * `q (..., Hq, nq, d)`: the rank's queries; `k, v (..., Hkv, nk, d)`: the visiting chunk (GQA: query head
#   `h` reads kv head `h // (Hq // Hkv)`), float16/32/64.
# * `q_pos (nq,)`, `k_pos (nk,)`: integer **global positions** of the queries and keys. With a zig-zag layout
#   a rank holds two separate pieces of the sequence, so positions are not one contiguous range.
# * `causal=True`: key at position `t` is visible to the query at position `p` iff `t <= p`.
#
# Return the merged state in the dtypes of `o` and `lse` (accumulate in at least float32). Watch the rows that
# see **none** of the visiting chunk: their state must come back unchanged (and stay `o = 0`, `lse = -inf` if
# it was empty) -- never NaN.
#
# Part 2, `ring_backward_step`, is described before its cell.
#
# **How to work.** Fill in the `raise NotImplementedError(...)` and run the `check` cell. Do not use `torch`,
# `scipy` or the course's `reference` package: the grader flags them. This assignment builds on `merge_states`
# from assignment 1 and on lecture 10.

# %%
import math

import numpy as np


def floats(**named):
    """Given: the named arguments as float16/32/64 ndarrays, in order; a TypeError names any other one."""
    out = []
    for name, x in named.items():
        x = np.asarray(x)
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {x.dtype}")
        out.append(x)
    return out


def expand_kv(x, hq):
    """Given: (..., Hkv, N, d) -> (..., Hq, N, d), query head h reading kv head h // (Hq // Hkv)."""
    return x if x.shape[-3] == hq else np.repeat(x, hq // x.shape[-3], axis=-3)


def positions(n, world, rank, layout="zigzag"):
    """Given: the global positions rank ``rank`` of ``world`` holds in a length-``n`` sequence.

    ``contiguous``: chunk ``rank`` of ``world`` chunks; ``zigzag``: chunks ``rank`` and ``2 world - 1 - rank`` of
    ``2 world`` chunks (balanced causal work, lecture 10). Chunks are ``np.array_split`` pieces (ragged n).
    """
    if layout == "contiguous":
        return np.array_split(np.arange(n), world)[rank]
    chunks = np.array_split(np.arange(n), 2 * world)
    return np.concatenate([chunks[rank], chunks[2 * world - 1 - rank]])


# %% [markdown]
# ## Part 1 (50 points): the ring step
#
# 1. Scores of the visiting chunk: $S = \mathrm{scale}\cdot q k^T$ (scale defaults to $1/\sqrt d$), with
#    $S_{ij} = -\infty$ where `causal` and `k_pos[j] > q_pos[i]`.
# 2. The chunk's state, with the max trick: $m_i = \max_j S_{ij}$,
#    $\mathrm{lse}^{(b)}_i = m_i + \log\sum_j e^{S_{ij} - m_i}$, $o^{(b)}_i = \sum_j e^{S_{ij} - \mathrm{lse}^{(b)}_i} v_j$.
#    A row that sees no key has $\mathrm{lse}^{(b)} = -\infty$ and $o^{(b)} = 0$.
# 3. Merge (assignment 1): $\mathrm{lse}' = \log(e^{\mathrm{lse}} + e^{\mathrm{lse}^{(b)}})$,
#    $o' = e^{\mathrm{lse} - \mathrm{lse}'}\, o + e^{\mathrm{lse}^{(b)} - \mathrm{lse}'}\, o^{(b)}$ -- again with the
#    max trick, and with both sides empty giving $o' = 0$, $\mathrm{lse}' = -\infty$.

# %%
def ring_step(o, lse, q, k, v, q_pos, k_pos, causal=True, scale=None):
    """One ring step: fold the attention of ``q`` to the visiting chunk ``k, v`` into the state ``(o, lse)``.

    Chunk state: S = scale q k^T (masked where k_pos > q_pos), lse_b = logsumexp(S), o_b = softmax(S) v;
    merge: lse' = log(e^lse + e^lse_b), o' = e^(lse - lse') o + e^(lse_b - lse') o_b.
    """
    o, lse, q, k, v = floats(o=o, lse=lse, q=q, k=k, v=v)
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    if o.shape != q.shape or lse.shape != q.shape[:-1] or k.shape != v.shape or q_pos.shape != q.shape[-2:-1] \
            or k_pos.shape != k.shape[-2:-1] or q.shape[-3] % k.shape[-3]:
        raise ValueError(f"expected o, q (..., Hq, nq, d), lse (..., Hq, nq), k, v (..., Hkv, nk, d), q_pos (nq,), "
                         f"k_pos (nk,); got o {o.shape}, lse {lse.shape}, q {q.shape}, k {k.shape}, v {v.shape}, "
                         f"q_pos {q_pos.shape}, k_pos {k_pos.shape}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ### BEGIN SOLUTION
    acc = np.result_type(np.float32, o, lse, q, k, v)     # accumulate in at least float32
    hq = q.shape[-3]
    s = (q.astype(acc) @ np.swapaxes(expand_kv(k, hq).astype(acc), -1, -2)) * scale
    if causal:
        s = np.where(k_pos[None, :] <= q_pos[:, None], s, -np.inf)
    m = s.max(axis=-1)
    m = np.where(np.isneginf(m), 0.0, m)           # a row that sees nothing: exp(-inf - 0) = 0, not NaN
    e = np.exp(s - m[..., None])
    total = e.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse_b = np.where(total > 0, m + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    o_b = (e @ expand_kv(v, hq).astype(acc)) / np.where(total > 0, total, 1.0)[..., None]
    la = lse.astype(acc)
    mm = np.maximum(la, lse_b)
    mm = np.where(np.isneginf(mm), 0.0, mm)        # both empty: both weights 0
    wa, wb = np.exp(la - mm), np.exp(lse_b - mm)
    tot = wa + wb
    with np.errstate(divide="ignore"):
        lse_new = np.where(tot > 0, mm + np.log(np.where(tot > 0, tot, 1.0)), -np.inf)
    tot = np.where(tot > 0, tot, 1.0)
    o_new = (wa / tot)[..., None] * o.astype(acc) + (wb / tot)[..., None] * o_b
    return o_new.astype(o.dtype), lse_new.astype(lse.dtype)
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a6.ring_step", ring_step)

# %% [markdown]
# ## Part 2 (50 points): the backward step -- dQ stays, dK/dV travel
#
# The backward of attention (lecture 4, FlashAttention-2 Algorithm 2) needs, per query row, the forward's
# `lse` and `delta = rowsum(dO * O)`. After the forward ring every rank has the **global** `o` and `lse` of its
# queries, so for any visiting chunk it can compute that chunk's exact probabilities `P = exp(S - lse)` -- no
# other chunk needed. The ring of the backward (lecture 10, section 3) then works like this:
#
# * **dQ stays local**: each rank adds the visiting chunk's contribution to the gradient of its own queries.
# * **dK, dV travel**: they belong to the chunk, so the chunk carries float32 accumulators `dk, dv`; each rank
#   adds its queries' share and passes them on with the chunk. After W hops they are back at the owner, holding
#   the sum over every rank's queries.
#
# `ring_backward_step(dq, dk, dv, q, k, v, do, lse, delta, q_pos, k_pos, causal=True, scale=None)
# -> (dq, dk, dv)`
#
# * `dq (..., Hq, nq, d)`: the rank's running dQ; `dk, dv (..., Hkv, nk, d)`: the visiting chunk's travelling
#   accumulators (float32 or float64). Return all three **with this step's shares added**, in their dtypes.
# * `q, do (..., Hq, nq, d)`: the rank's queries and output gradient; `k, v (..., Hkv, nk, d)`: the visiting
#   chunk (float16/32/64; GQA as in Part 1); `lse, delta (..., Hq, nq)`: the global log-sum-exp and
#   `rowsum(dO * O)` of the rank's queries; `q_pos`, `k_pos`, `causal`, `scale` as in Part 1.
#
# With `S = scale q k^T`:
#
# 1. $P_{ij} = e^{S_{ij} - \mathrm{lse}_i}$, and $P_{ij} = 0$ where `causal` and `k_pos[j] > q_pos[i]`
#    (Algorithm 2, line 11, with the global `lse`: do **not** renormalise over the chunk);
# 2. $dV_b = P^T dO$ (line 12); $dP = dO\, V^T$ (line 13); $dS = P \circ (dP - \mathrm{delta})$ (line 14);
# 3. $dQ_b = \mathrm{scale}\cdot dS\, K$ (line 15), $dK_b = \mathrm{scale}\cdot dS^T Q$ (line 16);
# 4. GQA: a kv head's $dK_b$, $dV_b$ are the **sums** over the `Hq // Hkv` query heads that read it.
#
# Return `dq + dQ_b`, `dk + dK_b`, `dv + dV_b`. Rows that see none of the chunk add nothing (their `P` row is 0:
# no NaN).

# %%
def ring_backward_step(dq, dk, dv, q, k, v, do, lse, delta, q_pos, k_pos, causal=True, scale=None):
    """One backward ring step: add the visiting chunk's share to the rank's dq (kept local) and the rank's
    share to the chunk's travelling dk, dv accumulators.

    FA2 Algorithm 2, lines 11-16, with the global lse and delta: P = exp(S - lse) (masked where k_pos > q_pos),
    dV += P^T dO, dS = P (dO V^T - delta), dQ += scale dS K, dK += scale dS^T Q (GQA: summed per kv head).
    """
    dq, dk, dv, q, k, v, do, lse, delta = floats(dq=dq, dk=dk, dv=dv, q=q, k=k, v=v, do=do, lse=lse, delta=delta)
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    if dq.shape != q.shape or do.shape != q.shape or dk.shape != k.shape or dv.shape != k.shape \
            or v.shape != k.shape or lse.shape != q.shape[:-1] or delta.shape != q.shape[:-1] \
            or q_pos.shape != q.shape[-2:-1] or k_pos.shape != k.shape[-2:-1] or q.shape[-3] % k.shape[-3]:
        raise ValueError(f"expected dq, q, do (..., Hq, nq, d), dk, dv, k, v (..., Hkv, nk, d), lse, delta "
                         f"(..., Hq, nq), q_pos (nq,), k_pos (nk,); got dq {dq.shape}, dk {dk.shape}, dv {dv.shape}, "
                         f"q {q.shape}, k {k.shape}, v {v.shape}, do {do.shape}, lse {lse.shape}, "
                         f"delta {delta.shape}, q_pos {q_pos.shape}, k_pos {k_pos.shape}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ### BEGIN SOLUTION
    acc = np.result_type(np.float32, dq, dk, dv, q, k, v, do)
    hq, hkv = q.shape[-3], k.shape[-3]
    kx, vx = expand_kv(k, hq).astype(acc), expand_kv(v, hq).astype(acc)
    qa, doa = q.astype(acc), do.astype(acc)
    s = (qa @ np.swapaxes(kx, -1, -2)) * scale
    p = np.exp(s - lse.astype(acc)[..., None])
    if causal:
        p = np.where(k_pos[None, :] <= q_pos[:, None], p, 0.0)
    ds = p * (doa @ np.swapaxes(vx, -1, -2) - delta.astype(acc)[..., None])
    dq_b = (ds @ kx) * scale
    dk_b = (np.swapaxes(ds, -1, -2) @ qa) * scale
    dv_b = np.swapaxes(p, -1, -2) @ doa
    group_shape = dk_b.shape[:-3] + (hkv, hq // hkv) + dk_b.shape[-2:]
    dk_b, dv_b = dk_b.reshape(group_shape).sum(axis=-3), dv_b.reshape(group_shape).sum(axis=-3)
    return ((dq.astype(acc) + dq_b).astype(dq.dtype), (dk.astype(acc) + dk_b).astype(dk.dtype),
            (dv.astype(acc) + dv_b).astype(dv.dtype))
    ### END SOLUTION


# %% tags=["check"]
check("a6.ring_backward_step", ring_backward_step)

# %% [markdown]
# ## The whole ring, simulated (ungraded)
#
# W ranks, each starting from an empty state; at step s rank r merges the chunk of rank (r - s) mod W. The
# result must equal plain causal attention over the whole sequence -- for either layout.

# %% tags=["skip"]
try:
    rng = np.random.default_rng(0)
    N, W, d = 45, 3, 16
    q, k, v = (rng.standard_normal((2, N, d)) for _ in range(3))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    s = np.where(np.tril(np.ones((N, N), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    full = (p / p.sum(-1, keepdims=True)) @ v
    for layout in ("contiguous", "zigzag"):
        out = np.zeros_like(q)
        for r in range(W):
            qp = positions(N, W, r, layout)
            o_r, lse_r = np.zeros((2, len(qp), d)), np.full((2, len(qp)), -np.inf)
            for step in range(W):
                kp = positions(N, W, (r - step) % W, layout)
                o_r, lse_r = ring_step(o_r, lse_r, q[:, qp], k[:, kp], v[:, kp], qp, kp)
            out[:, qp] = o_r
        print(f"{layout:>10}: max |ring - full| = {np.abs(out - full).max():.2e}")
except NotImplementedError as e:
    print("not implemented yet:", e)

# %% [markdown]
# ## Part 3 (optional, ungraded): your step on a real ring
#
# The simulation above runs every rank in one process. Here `run_real_ring` starts `world` processes joined by
# `torch.distributed` (gloo on CPU; `backend="nccl"` with one GPU per rank where there are several GPUs), gives
# each its shard of the sequence, and moves the K/V chunks around the ring with point-to-point sends, as
# `reference.distributed.ring_attention` does: at step s each process sends the chunk it holds to the next rank,
# receives the next chunk from the previous one, and calls **your** `ring_step` on the chunk it holds. The
# processes are forked from this notebook (Linux), so they see your function as it is now. Predict first: does
# the answer depend on the order in which chunks arrive? (The printed error is against plain causal attention.)

# %% tags=["skip"]
def run_real_ring(step_fn, world=3, n=45, layout="zigzag", backend="gloo", hq=4, hkv=2, d=16, seed=0,
                  timeout=120):
    """Given (ungraded): run ``step_fn`` (your ``ring_step``) on ``world`` real processes; return the max
    |ring - full causal attention| over the gathered output. Raises if a process fails or hangs."""
    import multiprocessing as mp
    import os
    import tempfile

    step_fn(np.zeros((hq, 1, d)), np.full((hq, 1), -np.inf), np.zeros((hq, 1, d)), np.zeros((hkv, 1, d)),
            np.zeros((hkv, 1, d)), np.arange(1), np.arange(1))   # a stub fails here, not inside a process

    def inputs():
        rng = np.random.default_rng(seed)
        return (rng.standard_normal((hq, n, d)), rng.standard_normal((hkv, n, d)), rng.standard_normal((hkv, n, d)))

    def rank_main(rank, folder):
        import torch
        import torch.distributed as dist
        dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
        try:
            q, k, v = inputs()
            qp = positions(n, world, rank, layout)
            o, lse = np.zeros((hq, len(qp), d)), np.full((hq, len(qp)), -np.inf)
            kp, k_cur, v_cur = qp, k[:, qp], v[:, qp]
            for step in range(world):
                if step < world - 1:   # start passing the held chunk on while this one is attended
                    src = (rank - step - 1) % world
                    nxt = positions(n, world, src, layout)
                    send = [torch.from_numpy(np.ascontiguousarray(x)).to(dev) for x in (k_cur, v_cur)]
                    recv = [torch.empty((hkv, len(nxt), d), dtype=torch.float64, device=dev) for _ in range(2)]
                    ops = [dist.P2POp(dist.isend, t, (rank + 1) % world) for t in send if t.numel()]
                    ops += [dist.P2POp(dist.irecv, t, (rank - 1) % world) for t in recv if t.numel()]
                    works = dist.batch_isend_irecv(ops) if ops else []
                o, lse = step_fn(o, lse, q[:, qp], k_cur, v_cur, qp, kp)
                if step < world - 1:
                    for w in works:
                        w.wait()
                    k_cur, v_cur = (t.cpu().numpy() for t in recv)
                    kp = nxt
            np.save(os.path.join(folder, f"o{rank}.npy"), np.asarray(o))
            dist.barrier()
        finally:
            dist.destroy_process_group()

    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as folder:
        procs = [ctx.Process(target=rank_main, args=(r, folder)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
        if alive or any(p.exitcode for p in procs):
            raise RuntimeError(f"a rank failed or hung (exit codes {[p.exitcode for p in procs]}): run the "
                               f"simulated ring above first")
        q, k, v = inputs()
        out = np.zeros((hq, n, d))
        for r in range(world):
            out[:, positions(n, world, r, layout)] = np.load(os.path.join(folder, f"o{r}.npy"))
    s = q @ np.swapaxes(expand_kv(k, hq), -1, -2) / math.sqrt(d)
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    full = (p / p.sum(-1, keepdims=True)) @ expand_kv(v, hq)
    return float(np.abs(out - full).max())


try:
    for layout in ("contiguous", "zigzag"):
        print(f"{layout:>10}, 3 gloo processes: max |ring - full| = {run_real_ring(ring_step, layout=layout):.2e}")
except NotImplementedError as e:
    print("not implemented yet:", e)
