"""KV-cache fragmentation simulator (vLLM paper section 3 and Figure 2; seeds: "only 20-40 % of KV cache is
utilized to store actual token states", "# wasted tokens / seq < block size").

A stream of requests (prompt length, output length) is served by a step-level scheduler over a fixed pool of KV
slots (one slot = one token's keys and values for every layer). Policies:

* ``"static"``  reserve ``max_seq_len`` contiguous slots per request (Orca "Max"): the output length is unknown,
  so the worst case is reserved up front.
* ``"pow2"``    reserve the next power of two >= the request's final length (Orca "Pow2").
* ``"oracle"``  reserve exactly prompt + output (Orca "Oracle": the final length is known in advance). Still
  over-reserved while the output is being generated, and the variable sizes fragment the pool.
* ``"paged"``   PagedAttention: blocks of ``block_size`` slots allocated on demand as tokens are appended, from a
  free list (any free block will do, so there is no external fragmentation). When a sequence needs a block and
  none is free, the most recently admitted sequence is preempted (recomputation: it goes back to the head of
  the queue with its generated tokens folded into its prompt).

Contiguous policies allocate with first-fit over the pool (holes are merged on free), admit FCFS and never
preempt (a request's reservation covers its whole life).

Each step: admit from the head of the queue while the allocation succeeds; every running sequence appends one
token (the step that admits a request is its prefill and yields its first output token); measure; retire the
sequences that have produced all their output. Memory is classified per step as

* token states        slots holding a real token's K/V,
* reservation         slots reserved for tokens the request will still produce (contiguous only),
* internal frag.      slots reserved that the request will never use (contiguous: reservation beyond the final
                      length; paged: the unfilled tail of each sequence's last block),
* external frag.      free slots while the queue's head is refused although the free total would hold it,
* free                other free slots (too few for the head of the queue, or the pool remainder).

Utilisation figures average the steps in which the queue was not empty, i.e. while memory was the limit (a
serving system at high load); with no such step, every step.

Default sizes: OPT-13B keeps 2 (K, V) x 40 layers x 5120 hidden x 2 bytes (fp16) = 819,200 B = 800 KiB per
token (the vLLM paper's example); a 40 GB pool holds ``40e9 // 819200 = 48,828`` token slots. Requests follow a
ShareGPT-like lognormal workload: mean prompt 161 and mean output 338 tokens (the vLLM paper's ShareGPT
statistics), sigma 1 for both, total length capped at ``max_seq_len = 2048``.
"""
from __future__ import annotations

import bisect
import math
import numbers
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .._args import check_flag, check_positive_int, check_positive_real

__all__ = ["Request", "FragReport", "FirstFitAllocator", "make_requests", "simulate", "pool_tokens_for",
           "KV_BYTES_PER_TOKEN_13B", "DEFAULT_POOL_TOKENS", "POLICIES"]

KV_BYTES_PER_TOKEN_13B = 2 * 40 * 5120 * 2  # K and V, 40 layers, hidden 5120, fp16 = 819,200 B (800 KiB)
POLICIES = ("static", "pow2", "oracle", "paged")
CATEGORIES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")


def pool_tokens_for(gpu_bytes: float = 40e9, bytes_per_token: int = KV_BYTES_PER_TOKEN_13B) -> int:
    """Token slots in a KV pool of ``gpu_bytes`` (40 GB and OPT-13B's 800 KiB/token: 48,828)."""
    return int(check_positive_real(gpu_bytes, "gpu_bytes") // check_positive_int(bytes_per_token, "bytes_per_token"))


DEFAULT_POOL_TOKENS = pool_tokens_for()


@dataclass(frozen=True)
class Request:
    """One request: ``prompt_len`` tokens in, ``output_len`` tokens generated."""

    prompt_len: int
    output_len: int

    def __post_init__(self):
        check_positive_int(self.prompt_len, "prompt_len")
        check_positive_int(self.output_len, "output_len")

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def make_requests(n: int, seed: int = 0, *, prompt_mean: float = 161.0, output_mean: float = 338.0,
                  prompt_sigma: float = 1.0, output_sigma: float = 1.0, max_seq_len: int = 2048) -> tuple:
    """``n`` requests with lognormal prompt and output lengths of the given means (ShareGPT-like defaults),
    rounded, at least 1 token each, prompt + output <= ``max_seq_len``. Deterministic in ``seed``."""
    n = check_positive_int(n, "n")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise TypeError(f"seed must be a non-negative integer, got {seed!r}")
    pm, om = check_positive_real(prompt_mean, "prompt_mean"), check_positive_real(output_mean, "output_mean")
    ps, os_ = check_positive_real(prompt_sigma, "prompt_sigma"), check_positive_real(output_sigma, "output_sigma")
    max_len = check_positive_int(max_seq_len, "max_seq_len")
    if max_len < 2:
        raise ValueError(f"max_seq_len must be at least 2 (one prompt and one output token), got {max_len}")
    rng = np.random.default_rng(seed)
    # lognormal with mean m: mu = ln(m) - sigma^2 / 2
    prompt = np.rint(rng.lognormal(math.log(pm) - ps * ps / 2, ps, size=n)).astype(np.int64)
    output = np.rint(rng.lognormal(math.log(om) - os_ * os_ / 2, os_, size=n)).astype(np.int64)
    prompt = np.clip(prompt, 1, max_len - 1)
    output = np.clip(output, 1, max_len - prompt)
    return tuple(Request(int(p), int(o)) for p, o in zip(prompt, output))


class FirstFitAllocator:
    """Contiguous allocation over ``[0, capacity)``: first hole large enough wins; freed ranges merge with their
    neighbours."""

    def __init__(self, capacity: int):
        self.capacity = check_positive_int(capacity, "capacity")
        self._starts = [0]  # holes, sorted by start
        self._sizes = [self.capacity]

    @property
    def free(self) -> int:
        return sum(self._sizes)

    @property
    def largest_hole(self) -> int:
        return max(self._sizes, default=0)

    def allocate(self, size: int):
        """Start of a block of ``size`` slots, or None if no hole is large enough."""
        for i, s in enumerate(self._sizes):
            if s >= size:
                start = self._starts[i]
                if s == size:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += size
                    self._sizes[i] -= size
                return start
        return None

    def release(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self._starts, start)
        if (i < len(self._starts) and self._starts[i] < start + size) or \
                (i > 0 and self._starts[i - 1] + self._sizes[i - 1] > start):
            raise ValueError(f"release({start}, {size}) overlaps a free range")
        self._starts.insert(i, start)
        self._sizes.insert(i, size)
        if i + 1 < len(self._starts) and start + size == self._starts[i + 1]:  # merge right
            self._sizes[i] += self._sizes.pop(i + 1)
            self._starts.pop(i + 1)
        if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == start:  # merge left
            self._sizes[i - 1] += self._sizes.pop(i)
            self._starts.pop(i)


@dataclass
class FragReport:
    """What a simulation measured (fractions are of the whole pool unless said otherwise)."""

    policy: str
    block_size: int | None
    pool_tokens: int
    bytes_per_token: int
    n_requests: int
    steps: int
    measured_steps: int
    utilisation: float  # fraction of the pool holding real tokens (token states)
    utilisation_of_allocated: float  # fraction of allocated slots holding real tokens
    breakdown: dict  # CATEGORIES -> fraction of the pool, sums to 1
    mean_concurrency: float
    max_concurrency: int
    mean_waste_per_seq: float  # allocated - stored slots per running sequence
    max_waste_per_seq: int
    preemptions: int
    tokens_generated: int
    trace: dict | None = field(default=None, repr=False)

    @property
    def pool_bytes(self) -> int:
        return self.pool_tokens * self.bytes_per_token

    @property
    def throughput(self) -> float:
        """Output tokens per step."""
        return self.tokens_generated / max(self.steps, 1)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "trace"}
        d["pool_bytes"] = self.pool_bytes
        d["throughput_tokens_per_step"] = self.throughput
        return d


def _reserve(policy: str, total: int, max_seq_len: int) -> int:
    if policy == "static":
        return max_seq_len
    if policy == "pow2":
        return min(1 << (total - 1).bit_length(), max_seq_len)
    return total  # oracle


def _check_simulate(requests, policy, pool_tokens, block_size, max_seq_len, bytes_per_token, watermark,
                    record_trace):
    """Validated ``(requests, pool, block_size or None, max_len, bytes_per_token, watermark, record_trace)``."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    record_trace = check_flag(record_trace, "record_trace")
    pool = check_positive_int(pool_tokens, "pool_tokens")
    max_len = check_positive_int(max_seq_len, "max_seq_len")
    bpt = check_positive_int(bytes_per_token, "bytes_per_token")
    if policy == "paged":
        if block_size is None:
            raise ValueError("block_size is required for policy 'paged'")
        bs = check_positive_int(block_size, "block_size")
    else:
        if block_size is not None:
            raise ValueError(f"block_size must be None for policy {policy!r}, got {block_size!r}")
        bs = None
    try:
        reqs = list(requests)
    except TypeError:
        raise TypeError(f"requests must be an iterable of Request, got {type(requests).__name__}") from None
    if not reqs:
        raise ValueError("requests must not be empty")
    for i, r in enumerate(reqs):
        if not isinstance(r, Request):
            raise TypeError(f"requests[{i}] must be a Request, got {type(r).__name__}")
        if r.total_len > max_len:
            raise ValueError(f"requests[{i}] has {r.total_len} tokens > max_seq_len={max_len}")
    if isinstance(watermark, bool) or not isinstance(watermark, numbers.Real) or not 0 <= watermark < 1:
        raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark!r}")
    usable = (pool // bs) * bs if bs else pool
    if usable < (-(-max_len // bs) * bs if bs else max_len):
        raise ValueError(f"pool_tokens={pool} (usable {usable}) must hold one max_seq_len={max_len} sequence")
    return reqs, pool, bs, max_len, bpt, watermark, record_trace


@dataclass
class _Seq:
    """One sequence: ``length`` tokens stored of ``final``, ``alloc`` slots held from slot ``start`` (contiguous
    policies; -1 when paged)."""

    rid: int
    length: int
    final: int
    alloc: int = 0
    start: int = -1


class _Memory:
    """The KV pool under one policy: a first-fit contiguous allocator, or ``free_blocks`` blocks of ``bs``."""

    def __init__(self, policy, pool, bs, max_len, watermark):
        self.policy, self.pool, self.bs, self.max_len = policy, pool, bs, max_len
        self.contig = FirstFitAllocator(pool) if bs is None else None
        self.free_blocks = pool // bs if bs else 0
        self.reserve_blocks = int(watermark * self.free_blocks)

    def admit(self, seq: _Seq, others_running: bool) -> bool:
        """Allocate ``seq``'s memory if it fits (paged: its prompt's blocks, keeping the watermark free)."""
        if self.bs is None:
            size = _reserve(self.policy, seq.final, self.max_len)
            start = self.contig.allocate(size)
            if start is None:
                return False
            seq.alloc, seq.start = size, start
            return True
        need = -(-(seq.length + 1) // self.bs)  # the prompt and the token this step produces
        if need + (self.reserve_blocks if others_running else 0) > self.free_blocks:
            return False
        blocks = -(-seq.length // self.bs)
        self.free_blocks -= blocks
        seq.alloc, seq.start = blocks * self.bs, -1
        return True

    def release(self, seq: _Seq) -> None:
        if self.bs is None:
            self.contig.release(seq.start, seq.alloc)
        else:
            self.free_blocks += seq.alloc // self.bs

    def grow(self, running: list, queue: deque) -> int:
        """Paged: give every sequence whose blocks are full one more block, preempting the most recently admitted
        sequences (recomputation: back to the queue head) while blocks run short. Returns the preemptions."""
        if self.bs is None:
            return 0
        preempted = 0
        need = sum(1 for s in running if s.length == s.alloc)
        while need > self.free_blocks:
            s = running.pop()
            need -= s.length == s.alloc
            self.release(s)
            queue.appendleft(_Seq(s.rid, s.length, s.final))
            preempted += 1
        for s in running:
            if s.length == s.alloc:
                s.alloc += self.bs
                self.free_blocks -= 1
        return preempted

    def external(self, queue: deque, allocated: int) -> int:
        """Contiguous: slots free in total but in holes too small for the queue's head (external fragmentation)."""
        if queue and self.bs is None and self.pool - allocated >= _reserve(self.policy, queue[0].final, self.max_len):
            return self.pool - allocated
        return 0


def _measure(queue: deque, running: list, memory: _Memory) -> tuple:
    """One step's row: waiting, running, stored, allocated, reserved for the future, external, max waste."""
    stored, allocated = sum(s.length for s in running), sum(s.alloc for s in running)
    reserved_future = sum(s.final - s.length for s in running) if memory.bs is None else 0
    waste = max((s.alloc - s.length for s in running), default=0)
    return (len(queue), len(running), stored, allocated, reserved_future, memory.external(queue, allocated), waste)


def simulate(requests, policy: str, pool_tokens: int = DEFAULT_POOL_TOKENS, block_size=None, *,
             max_seq_len: int = 2048, bytes_per_token: int = KV_BYTES_PER_TOKEN_13B, watermark: float = 0.01,
             record_trace: bool = False) -> FragReport:
    """Serve ``requests`` (all queued at step 0, FCFS) under ``policy`` with a pool of ``pool_tokens`` KV slots.

    ``block_size`` is required for ``"paged"`` and must be None otherwise. ``watermark`` (paged only, vLLM's
    default 1 %): a request is admitted only if that fraction of the blocks stays free afterwards, which
    limits preemptions (waived when nothing runs). ``record_trace`` keeps per-step arrays (waiting, running,
    stored, allocated, max_waste, measured) in ``report.trace``."""
    reqs, pool, bs, max_len, bpt, watermark, record_trace = _check_simulate(
        requests, policy, pool_tokens, block_size, max_seq_len, bytes_per_token, watermark, record_trace)
    memory = _Memory(policy, pool, bs, max_len, watermark)
    queue = deque(_Seq(i, r.prompt_len, r.total_len) for i, r in enumerate(reqs))
    running: list[_Seq] = []  # in admission order
    steps = preemptions = generated = 0
    rows = []
    max_steps = 4 * sum(r.total_len for r in reqs) + 10
    while queue or running:
        steps += 1
        if steps > max_steps:  # cannot happen; guards against livelock
            raise RuntimeError("fragmentation simulator made no progress")
        while queue and memory.admit(queue[0], bool(running)):  # 1. admit FCFS from the head of the queue
            running.append(queue.popleft())
        preemptions += memory.grow(running, queue)  # 2. every running sequence appends one token
        for s in running:
            s.length += 1
        generated += len(running)
        rows.append(_measure(queue, running, memory))  # 3. measure
        for s in running:  # 4. retire finished sequences
            if s.length == s.final:
                memory.release(s)
        running = [s for s in running if s.length != s.final]
    return _report(rows, policy, bs, pool, bpt, len(reqs), steps, preemptions, generated, record_trace)


def _report(rows, policy, bs, pool, bpt, n_requests, steps, preemptions, generated, record_trace) -> FragReport:
    """Average the memory-bound steps' rows (every step if the pool never ran short) into a ``FragReport``."""
    t = np.asarray(rows, dtype=np.float64)
    waiting, running, stored, allocated, reserved, external, waste = t.T
    sel = waiting > 0  # memory-bound steps
    if not sel.any():  # the pool held the whole workload at once: average every step instead
        sel = np.ones_like(sel)
    measured = int(sel.sum())
    denom = measured * pool
    breakdown = {
        "token_states": stored[sel].sum() / denom,
        "reservation": reserved[sel].sum() / denom,
        "internal_fragmentation": (allocated - stored - reserved)[sel].sum() / denom,
        "external_fragmentation": external[sel].sum() / denom,
        "free": (pool - allocated - external)[sel].sum() / denom,
    }
    breakdown = {k: float(v) for k, v in breakdown.items()}
    n_seq = running[sel].sum()
    trace = None
    if record_trace:
        trace = {"waiting": waiting.astype(np.int64), "running": running.astype(np.int64),
                 "stored": stored.astype(np.int64), "allocated": allocated.astype(np.int64),
                 "max_waste": waste.astype(np.int64), "measured": sel}
    return FragReport(
        policy=policy, block_size=bs, pool_tokens=pool, bytes_per_token=bpt, n_requests=n_requests, steps=steps,
        measured_steps=measured, utilisation=breakdown["token_states"],
        utilisation_of_allocated=float(stored[sel].sum() / allocated[sel].sum()), breakdown=breakdown,
        mean_concurrency=float(running[sel].mean()), max_concurrency=int(running[sel].max()),
        mean_waste_per_seq=float((allocated - stored)[sel].sum() / n_seq) if n_seq else 0.0,
        max_waste_per_seq=int(waste[sel].max()), preemptions=preemptions, tokens_generated=generated,
        trace=trace)
