"""A miniature serving engine in NumPy: admission, chunked prefill, paged decode, prefix sharing.

It strings the serving path together the way vLLM-style engines do, on a one-layer toy model small enough to
run in a notebook:

* requests of random lengths wait in a queue and are **admitted** while the KV pool has room -- under
  ``policy="paged"`` a request needs blocks for the tokens it holds now (``PagedKVCache``); under
  ``policy="static"`` it reserves its maximum length up front, as the static allocation of lecture 08 does;
* every step spends a **token budget** on prefill chunks (``chunk`` tokens, split across requests) and decodes
  one token for every request whose prompt is done. The step's new tokens' K/V are appended to the cache and
  the decode rows and prefill chunks attend through the block tables in ONE mixed batch
  (``reference.numpy.mixed.mixed_attention``, bottom-right causal; ``reference.triton.mixed_attention`` is the
  one-launch GPU kernel);
* with a **shared prefix** (a system prompt), the prefix is prefilled once and every request ``fork``\\ s it
  (shared blocks, copy-on-write), and decode runs as cascade attention
  (``reference.numpy.serving.cascade_decode``): the prefix once for the batch, each suffix on its own.

The toy model: token embedding plus a sinusoidal position code, one GQA attention layer, tied output
embedding (greedy argmax). ``reference_generate`` decodes the same model by plain attention over the full
sequence each step; the engine must produce exactly its tokens, whatever the chunking, paging or sharing.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .numpy.attention import attention
from .numpy.paged import PagedKVCache
from .numpy.mixed import mixed_attention
from .numpy.serving import cascade_decode

__all__ = ["ToyModel", "EngineRequest", "MiniEngine", "reference_generate"]


class ToyModel:
    """One attention layer with GQA: ``x = E[token] + pos(t)``, ``q, k, v = x W``, ``logits = (o W_o) E^T``."""

    def __init__(self, vocab=97, n_heads=4, n_kv_heads=2, head_dim=16, seed=0):
        rng = np.random.default_rng(seed)
        self.vocab, self.hq, self.hkv, self.d = vocab, n_heads, n_kv_heads, head_dim
        width = n_heads * head_dim
        self.emb = rng.standard_normal((vocab, width)) / math.sqrt(width)
        self.wq = rng.standard_normal((width, n_heads * head_dim)) / math.sqrt(width) * 3
        self.wk = rng.standard_normal((width, n_kv_heads * head_dim)) / math.sqrt(width) * 3
        self.wv = rng.standard_normal((width, n_kv_heads * head_dim)) / math.sqrt(width)
        self.wo = rng.standard_normal((width, width)) / math.sqrt(width)

    def _x(self, tokens, positions):
        width = self.emb.shape[1]
        freq = np.exp(-np.arange(width // 2) * (math.log(1e4) / (width // 2)))
        ang = np.asarray(positions, dtype=np.float64)[:, None] * freq[None, :]
        return self.emb[np.asarray(tokens)] + 0.5 * np.concatenate([np.sin(ang), np.cos(ang)], 1)

    def qkv(self, tokens, positions):
        """``q (T, Hq, d)``, ``k, v (T, Hkv, d)`` for tokens at the given positions (float64)."""
        x = self._x(tokens, positions)
        t = x.shape[0]
        return ((x @ self.wq).reshape(t, self.hq, self.d), (x @ self.wk).reshape(t, self.hkv, self.d),
                (x @ self.wv).reshape(t, self.hkv, self.d))

    def next_token(self, o):
        """Greedy next token from attention outputs ``o (T, Hq, d)``: ``argmax((o W_o) E^T)``."""
        return np.argmax(o.reshape(o.shape[0], -1) @ self.wo @ self.emb.T, axis=1)


def reference_generate(model: ToyModel, prompt, max_new: int):
    """Greedy decoding by standard attention over the whole sequence at every step (no cache, no tricks)."""
    seq = list(prompt)
    for _ in range(max_new):
        q, k, v = model.qkv(seq, np.arange(len(seq)))
        o = attention(q[-1:].swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1)).swapaxes(0, 1)
        seq.append(int(model.next_token(o)[0]))
    return seq[len(prompt):]


@dataclass
class EngineRequest:
    rid: int
    prompt: list
    max_new: int
    prefilled: int = 0                      # prompt tokens whose K/V are in the cache
    output: list = field(default_factory=list)
    admitted_step: int = -1
    finished_step: int = -1

    @property
    def max_len(self) -> int:
        return len(self.prompt) + self.max_new


class MiniEngine:
    """Continuous batching over a paged KV cache (see the module docstring).

    ``pool_tokens`` KV slots (``pool_tokens // block_size`` blocks); ``chunk``: prefill tokens per step;
    ``max_running``: concurrent requests; ``policy``: "paged" or "static"; ``shared_prefix``: token list that
    every prompt starts with (prefilled once, forked; a multiple of ``block_size`` long for the cascade path).
    """

    def __init__(self, model: ToyModel, pool_tokens=4096, block_size=16, chunk=64, max_running=32,
                 policy="paged", shared_prefix=None):
        if policy not in ("paged", "static"):
            raise ValueError(f"policy must be 'paged' or 'static', got {policy!r}")
        self.model, self.block_size, self.chunk, self.max_running, self.policy = \
            model, block_size, chunk, max_running, policy
        self.cache = PagedKVCache(pool_tokens // block_size, block_size, model.hkv, model.d, dtype=np.float64)
        self.waiting: list = []
        self.running: list = []
        self.done: list = []
        self.steps = 0
        self.reserved = 0                   # static policy: slots reserved by running requests
        self.preempted = 0
        self.history: list = []             # per step: KV slots held, tokens held, tokens produced
        self.prefix = list(shared_prefix or [])
        if self.prefix:
            self.cache.add_sequence("prefix")
            _, k, v = model.qkv(self.prefix, np.arange(len(self.prefix)))
            self.cache.append("prefix", k, v)
            self._prefix_kv = (k, v)

    # ---- admission ---------------------------------------------------------------------------------------
    def add(self, rid, prompt, max_new):
        prompt = list(prompt)
        if self.prefix and prompt[:len(self.prefix)] != self.prefix:
            raise ValueError(f"request {rid}: prompt must start with the shared prefix")
        self.waiting.append(EngineRequest(rid, prompt, int(max_new)))

    def _fits(self, r: EngineRequest) -> bool:
        bs = self.block_size
        if self.policy == "static":  # reserve the maximum length at admission (lecture 08)
            return self.reserved + self._reservation(r) <= self.cache.num_blocks * bs
        own = len(r.prompt) - len(self.prefix)
        return self.cache.num_free_blocks >= math.ceil(own / bs) + 1 + len(self.running)  # + decode headroom

    def _reservation(self, r: EngineRequest) -> int:
        return math.ceil(r.max_len / self.block_size) * self.block_size if self.policy == "static" else 0

    def _preempt_for(self, need: int, keep) -> None:
        """Free blocks by preempting the most recently admitted requests not in ``keep`` (they are recomputed
        later, vLLM's "recompute" preemption) until ``need`` blocks are free."""
        while self.cache.num_free_blocks < need:
            victims = [r for r in self.running if r not in keep]
            if not victims:
                raise RuntimeError("KV pool too small for the running requests")
            v = victims[-1]
            self.running.remove(v)
            self.cache.free(v.rid)
            self.reserved -= self._reservation(v)
            v.prefilled, v.output = 0, []
            self.waiting.insert(0, v)
            self.preempted += 1

    def _admit(self):
        while self.waiting and len(self.running) < self.max_running and self._fits(self.waiting[0]):
            r = self.waiting.pop(0)
            if self.prefix:
                self.cache.fork("prefix", r.rid)
                r.prefilled = len(self.prefix)
            else:
                self.cache.add_sequence(r.rid)
            self.reserved += self._reservation(r)
            r.admitted_step = self.steps
            self.running.append(r)

    # ---- one engine step ---------------------------------------------------------------------------------
    def _ready(self):
        return [r for r in self.running if r.prefilled == len(r.prompt) and 0 < len(r.output) < r.max_new]

    def _pick_prefill(self, budget: int, free: int):
        """Prompt chunks for this step: up to ``budget`` tokens, and only as many as ``free`` blocks hold."""
        picked = []
        for r in self.running:
            left = len(r.prompt) - r.prefilled
            if left and budget:
                n = min(left, budget)
                picked.append((r, n))
                budget -= n
        while picked and sum(self.cache.blocks_needed(r.rid, n) for r, n in picked) > free:
            picked.pop()                             # prefill waits for memory; decode has priority
        return picked

    def _forward(self):
        """One mixed batch: a decode row for every request that has a first token and is not done, plus prefill
        chunks under the token budget, appended to the cache and attended in ONE ``mixed_attention`` call
        (vLLM V1's unified batch). With a shared prefix the decode rows take cascade attention instead and the
        chunks alone go through ``mixed_attention``. Returns (decoded, prefilled) token counts."""
        active = self._ready()
        need = sum(self.cache.blocks_needed(r.rid, 1) for r in active)
        if need > self.cache.num_free_blocks:
            self._preempt_for(need, keep=active[:1])
            active = self._ready()
        need = sum(self.cache.blocks_needed(r.rid, 1) for r in active)
        picked = self._pick_prefill(self.chunk, self.cache.num_free_blocks - need)
        bs, p = self.block_size, len(self.prefix)
        cascade = bool(p and p % bs == 0 and active)
        batch = ([] if cascade else [(r, 1) for r in active]) + picked
        qs, dec_q = [], []
        for r in active:                             # the last generated token enters the cache now
            pos = len(r.prompt) + len(r.output) - 1
            q, k, v = self.model.qkv([r.output[-1]], [pos])
            self.cache.append(r.rid, k, v)
            (dec_q if cascade else qs).append(q)
        for r, n in picked:                          # a chunk's own K/V first: it attends to itself causally
            pos = np.arange(r.prefilled, r.prefilled + n)
            q, k, v = self.model.qkv([r.prompt[i] for i in pos], pos)
            self.cache.append(r.rid, k, v)
            qs.append(q)
            r.prefilled += n
        outs = []
        if cascade:   # the shared prefix once for the whole batch, suffixes separately
            tables, lens = self.cache.block_tables([r.rid for r in active])
            o, _ = cascade_decode(np.concatenate(dec_q), *self._prefix_kv, self.cache.k_cache, self.cache.v_cache,
                                  _suffix_tables(tables, p // bs), lens - p)
            outs += [(r, o[i:i + 1]) for i, r in enumerate(active)]
        if batch:
            tables, lens = self.cache.block_tables([r.rid for r, _ in batch])
            cu = np.concatenate([[0], np.cumsum([n for _, n in batch])])
            o, _ = mixed_attention(np.concatenate(qs), self.cache.k_cache, self.cache.v_cache, tables, cu, lens)
            outs += [(r, o[end - 1:end]) for (r, _), end in zip(batch, cu[1:])]
        for r, last in outs:                         # decode rows, and chunks that complete their prompt
            if len(r.output) < r.max_new and r.prefilled == len(r.prompt):
                r.output.append(int(self.model.next_token(last)[0]))
        return len(active), sum(n for _, n in picked)

    def step(self) -> dict:
        self._admit()
        n_decode, n_prefill = self._forward()
        for r in [r for r in self.running if len(r.output) >= r.max_new]:
            self.running.remove(r)
            self.cache.free(r.rid)
            self.reserved -= self._reservation(r)
            r.finished_step = self.steps
            self.done.append(r)
        held = (self.cache.num_blocks - self.cache.num_free_blocks) * self.block_size
        held = self.reserved + (len(self.prefix) if self.prefix else 0) if self.policy == "static" else held
        tokens = sum(self.cache.seq_len(r.rid) for r in self.running)  # logical tokens in the cache
        self.history.append(dict(step=self.steps, running=len(self.running), waiting=len(self.waiting),
                                 kv_slots_held=held, tokens_held=tokens, decoded=n_decode, prefilled=n_prefill))
        self.steps += 1
        return self.history[-1]

    def run(self, max_steps=100000) -> dict:
        """Step until every request is done; returns summary statistics."""
        t0 = time.perf_counter()
        while (self.waiting or self.running) and self.steps < max_steps:
            self.step()
        wall = time.perf_counter() - t0
        h = self.history
        generated = sum(len(r.output) for r in self.done)
        return dict(policy=self.policy, steps=self.steps, preempted=self.preempted, wall_s=wall, generated=generated,
                    tokens_per_step=generated / max(1, self.steps), tokens_per_s=generated / max(wall, 1e-9),
                    mean_running=float(np.mean([x["running"] for x in h])),
                    mean_kv_slots_held=float(np.mean([x["kv_slots_held"] for x in h])),
                    kv_utilisation=float(np.sum([x["tokens_held"] for x in h]) /
                                         max(1, np.sum([x["kv_slots_held"] for x in h]))))


def _suffix_tables(tables, skip):
    """Block tables without the first ``skip`` (shared prefix) blocks, still padded with -1."""
    out = tables[:, skip:]
    return out if out.shape[1] else np.full((tables.shape[0], 1), -1, dtype=tables.dtype)
