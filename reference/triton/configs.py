"""One home for the tuned block configurations ("pins") of the Triton FlashAttention kernels.

A pin is one configuration the kernel is launched with instead of autotuning (``triton.autotune`` over a list
of one, which Triton launches without timing). Callers pass pins explicitly
(``flash_attention_forward(..., config=FWD_PINS["serving"])``); nothing sets a module variable of a kernel.
Each entry says which measurement chose it, so the numbers quoted from a benchmark can be traced to the
configuration that produced them. The device-dependent choices (what fits a given GPU's shared memory, which
paths need Hopper) stay in ``_device.py``, which the kernels ask with the limits of the GPU the tensors are on.

``forward_pin()`` / ``backward_pin()`` are the defaults of ``flash_attention_forward`` / ``flash_attention_backward``
(and of every entry point built on them: autograd, varlen, paged prefill) when no ``config`` is passed: the
small interpreter pin under ``TRITON_INTERPRET=1`` (fast on CPU), ``None`` (autotune) on a GPU. A caller that
cannot reach the ``config`` argument (a serving engine calling the kernels several layers down, a test suite)
scopes a default explicitly, without touching a module variable::

    with configs.pinned(fwd=FWD_PINS["serving"], bwd=BWD_PINS["serving"]):
        engine.run(...)

The decode family (``flash_decode``, ``paged_decode``) takes a frozen ``DecodeConfig`` the same way:
``config=DECODE_PINS["paged"]`` per call, ``pinned(decode=...)`` for a block, ``DECODE_PINS`` (chosen by
``decode_pin``) otherwise. ``cascade_decode`` takes its own ``CascadeConfig`` (``reference.triton.cascade``).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from ._device import INTERPRET


def _pin(block_m: int, block_n: int, num_warps: int, num_stages: int) -> dict:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps, "num_stages": num_stages}


#: forward pins (``flash_fwd._attn_fwd``), by the job they were chosen for
FWD_PINS = {
    # the interpreter default: small tiles, one stage (interpreter time grows with the tile, not with the grid)
    "interpreter": _pin(32, 16, 4, 1),
    # the autotuner's pick for bf16 on an H200 (benchmarks/results/h200.json); the Hopper and Gluon benchmarks'
    # Triton FA2 baseline (bench_hopper, bench_gluon, bench_gluon_train, tune_bwd_hopper)
    "hopper_bench": _pin(64, 64, 4, 3),
    # bench_serving's packed-vs-padded prefill on an H100 (notes/serving.md): one pin for both sides, so the
    # comparison is about the work and not the tuning
    "serving": _pin(128, 64, 8, 3),
    # the GPU tests (tests/common.py): small enough that every ragged / causal / multi-tile branch runs at the
    # tests' shapes, and no autotuning per shape
    "tests": _pin(64, 32, 4, 2),
    # bench_serving --smoke (CPU interpreter): the interpreter pin with 16-key blocks
    "smoke": _pin(32, 16, 4, 1),
}

#: ring attention (``reference.distributed``): the running output between ring steps is kept in the input's
#: 16-bit dtype (merged in fp32, rounded once per merge) on up to this many ranks, fp32 beyond. With two ranks
#: that is exactly the rounding of an fp32 state (one merge, then the output's rounding); each further rank adds
#: one rounding. Output error vs float64 on an H100 (Gluon step, causal zig-zag, N = 8192, d = 128; the one-GPU
#: kernel itself: 2.06e-3): W = 2 2.17e-3 either way, W = 4 2.33e-3 (bf16) vs 2.22e-3 (fp32), W = 8 2.57e-3 vs
#: 2.26e-3 (notes/ring_attention.md "One kernel call per step, a fused merge"): within 1.15x of the kernel's own error to W = 4
RING_PINS = {"half_state_max_world": 4}

#: ``serving.paged_prefill``'s kernel when ``gather=None`` and no Triton ``config`` is passed ("page": the Triton
#: page-tile kernel; "tma": on Hopper the Gluon kernel with one TMA box per page,
#: reference/triton/hopper/paged_prefill_gluon.py, the Triton kernel elsewhere) and the Gluon kernel's (BLOCK_M,
#: BLOCK_N, STAGES, num_warps): the contiguous Gluon forward's default. "tma" from the H100 run of
#: benchmarks/results/h100-paged-prefill.json (8 x 512 after 4k, bf16): 537 / 507 us at 16 / 64-token pages vs the
#: Triton page tiles' 759 / 668 us and the contiguous Triton varlen's 643 us (notes/serving_perf.md "Paged prefill
#: on Gluon")
PAGED_PREFILL = {"gather": "tma", "gluon_config": (128, 128, 2, 4)}

#: split-KV launches (``decode``'s stage 1, the three-launch cascade's prefix pass) aim for this many programs per SM:
#: memory-bound, so several resident programs hide load latency (notes/triton_decode.md)
PROGRAMS_PER_SM = 2

#: backward pins (``flash_bwd``: ``{"dkdv": ..., "dq": ...}``)
BWD_PINS = {
    "interpreter": {"dkdv": _pin(16, 32, 4, 1), "dq": _pin(32, 16, 4, 1)},
    # bench_serving on an H100 (the same reasoning as FWD_PINS["serving"])
    "serving": {"dkdv": _pin(32, 128, 8, 3), "dq": _pin(128, 64, 8, 2)},
    "tests": {"dkdv": _pin(32, 64, 4, 2), "dq": _pin(64, 32, 4, 2)},
}

#: the Hopper benchmarks' backward pins per (head dim, causal): the autotuner's H200 picks, d = 128 non-causal
#: from the H100 sweep of benchmarks/tuning/tune_bwd_hopper.py (notes/hopper.md section 1: 0.77-0.80x cuDNN at 2k-8k)
HOPPER_BENCH_BWD = {
    (64, False): {"dkdv": _pin(32, 64, 4, 3), "dq": _pin(64, 64, 4, 3)},
    (64, True): {"dkdv": _pin(64, 64, 4, 3), "dq": _pin(64, 64, 4, 3)},
    (128, False): {"dkdv": _pin(64, 64, 4, 2), "dq": _pin(128, 64, 8, 3)},
    (128, True): {"dkdv": _pin(32, 64, 4, 3), "dq": _pin(128, 32, 4, 3)},
}


#: the warp-specialised Gluon backward's program order (``flash_gluon_bwd_ws.check_order_heads``): a causal launch
#: whose longest program is at least ``min_share`` of one SM's share of the work (``longest_share``: 0.25-0.51
#: for GQA 4:1 at 8k-16k, 0.12-0.13 for MHA and at 32k) interleaves ``heads`` (batch, kv head) pairs, key blocks
#: longest-first; every other launch keeps the head-major order. Chosen from the H100 order sweep
#: (benchmarks/results/h100-gluon-bwd-order-sweep.json, notes/hopper.md "GQA backward
#: schedule"): 2 heads best at GQA 16/4 8k (0.99 vs 0.86x cuDNN); 4 and all heads lose at 16k-32k and 2k (L2)
GLUON_BWD_ORDER = {"heads": 2, "min_share": 0.2}


@dataclass(frozen=True)
class KeyBlockConfig:
    """What every kernel that walks the keys in blocks is launched with: ``block_n`` keys per inner-loop step (the
    N of the QK^T tile, a power of two >= 16 for ``tl.dot``), ``num_warps`` (a power of two) and ``num_stages``
    (software pipeline depth). The base of ``DecodeConfig``, ``cascade.CascadeConfig`` and ``mixed.MixedConfig``,
    which add their own tile and split fields."""
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        name = type(self).__name__
        for field in ("block_n", "num_warps", "num_stages"):
            v = getattr(self, field)
            if type(v) is not int or v < 1:
                raise ValueError(f"{name}.{field} must be a positive int, got {v!r}")
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"{name}.block_n must be a power of two >= 16 (tl.dot), got {self.block_n}")
        if self.num_warps & (self.num_warps - 1):
            raise ValueError(f"{name}.num_warps must be a power of two, got {self.num_warps}")


@dataclass(frozen=True)
class DecodeConfig(KeyBlockConfig):
    """Stage 1 of split-KV decode (``reference.triton.decode``): the key-block launch (``KeyBlockConfig``; 4
    stages by default) and ``fuse_merge``: the last program of each (batch, kv head) merges the splits (an atomic
    ticket) instead of a second kernel (``_merge_kernel``). A GPU with less shared memory than the configuration
    needs runs the first fallback that fits (``_device.stage_ladder``: fewer stages, then shorter key blocks)."""
    num_stages: int = 4
    fuse_merge: bool = True
    #: Hopper only (sm_90+, contiguous cache): K/V tiles as TMA boxes of a host tensor descriptor instead of
    #: pointer loads (None: never; the portable path runs everywhere else). notes/serving_perf.md "Decode at 32k and
    #: the one-launch cascade".
    use_tma: bool = False
    #: Hopper only: programmatic dependent launch (the next kernel on the stream may start while this one drains;
    #: this one waits for its predecessor with ``griddepcontrol.wait`` before reading anything); measured slower there (same section).
    pdl: bool = False
    #: fused merge: at most this many (query head, split) rows of d fp32 partial outputs per step of the merge
    #: loop (a power of two >= 2). The merge's tile sets the kernel's registers: 128 rows (4 heads x 32 splits)
    #: take stage 1 from 86 to 165 registers (ncu); fewer rows, more steps.
    merge_rows: int = 128
    #: fused merge in two levels: the last program of each group of ``merge_group`` consecutive splits merges
    #: the group's partial states into one, and the last group to finish merges the groups' states (0: one
    #: level, the last program of the (batch, kv head) merges every split). Keeps the merge on the critical
    #: path short at high split counts (one level costs 6.4 us at 128 splits, ncu).
    merge_group: int = 0
    #: dynamic split (an experiment, off): each of the ``num_splits`` programs of a (batch, kv head) draws
    #: chunks of ``dynamic_chunk`` key blocks from a counter until none are left, folding them all into ONE
    #: online-softmax state (the keys' order does not matter), instead of one fixed contiguous range; fast
    #: programs take more chunks. 0: fixed ranges. Needs the fused merge (its last program resets the counter).
    dynamic_chunk: int = 0

    def __post_init__(self):
        super().__post_init__()
        for field in ("fuse_merge", "use_tma", "pdl"):
            if type(getattr(self, field)) is not bool:
                raise ValueError(f"DecodeConfig.{field} must be a bool, got {getattr(self, field)!r}")
        r = self.merge_rows
        if type(r) is not int or r < 2 or r & (r - 1):
            raise ValueError(f"DecodeConfig.merge_rows must be a power of two >= 2, got {r!r}")
        g = self.merge_group
        if type(g) is not int or g < 0 or g == 1:
            raise ValueError(f"DecodeConfig.merge_group must be 0 (one level) or an int >= 2, got {g!r}")
        c = self.dynamic_chunk
        if type(c) is not int or c < 0:
            raise ValueError(f"DecodeConfig.dynamic_chunk must be an int >= 0 (key blocks a chunk; 0: fixed "
                             f"ranges), got {c!r}")
        if c and not self.fuse_merge:
            raise ValueError("DecodeConfig.dynamic_chunk needs fuse_merge=True (the merging program resets the "
                             "chunk counter)")

    def launch(self) -> dict:
        """``{"block_n", "num_warps", "num_stages"}``: the tile and launch options (``_device.stage_ladder``'s form)."""
        return dict(block_n=self.block_n, num_warps=self.num_warps, num_stages=self.num_stages)


def check_decode_config(config, name: str = "config"):
    """``config`` if it is None or a ``DecodeConfig``; ``TypeError`` naming ``name`` otherwise."""
    if config is not None and not isinstance(config, DecodeConfig):
        raise TypeError(f"{name} must be a reference.triton.configs.DecodeConfig or None, got {type(config).__name__}")
    return config


#: decode pins (``flash_decode`` / ``paged_decode``), by input kind; all merge inside stage 1 (``fuse_merge``:
#: notes/triton_decode.md "Fused merge and a config sweep", 3-4 us less per batch-1 step than the second kernel)
DECODE_PINS = {
    # fp16/bf16, contiguous cache: bench_decode --tune on an H200 (notes/triton_decode.md, same section): 64-key tiles,
    # 4 warps, 4 stages were best on the contiguous cases (1.03x geomean over the first configuration)
    "contiguous": DecodeConfig(64, 4, 4),
    # paged with several splits, tuned separately (same sweep): 16-token pages make 64-key tiles gather 4 pages,
    # 128-key tiles win there
    "paged": DecodeConfig(128, 4, 2),
    # paged with one split (large batch; one split never runs the merge): 8 warps beat 4 at B=32, 8k, 16-token
    # pages (its paged rows: 270 vs 283 us graph time)
    "paged_one_split": DecodeConfig(128, 8, 2),
    # fp32 inputs: half the tile, so the stages of K and V tiles (d=128) stay well inside shared memory
    "fp32": DecodeConfig(64, 4, 3),
}


#: the Gluon FP8 forward (``hopper.flash_fp8_gluon``): (BLOCK_M, BLOCK_N, STAGES, num_warps); 128 query rows = two
#: consumer warpgroups of 64 (the query quantisation block), 128 keys (the key block); STAGES: the H100 sweep of
#: benchmarks/course/bench_fp8_gluon.py (notes/hopper.md, "FP8 Gluon forward"): without turns 3 and 4 agree (noise)
FP8_GLUON_CONFIG = (128, 128, 3, 4)
#: its schedule options (``flash_fp8_gluon.attend_fp8``): ping-pong turns between the two consumers, one release
#: per K/V ring slot instead of two, the row max / sum split into independent chains; chosen by the same sweep
#: (h100-fp8-gluon.json "variants", N = 8k, x the bf16 Gluon forward, non-causal / causal): no turns 1.33 / 1.21;
#: turns with 3 stages 1.20 / 1.08 (2 or 4 stages 1.33-1.34 / 1.16-1.17); merged, split: 1.28-1.33 / 1.14-1.19
#: "peeled" (off): the key loop split at the first masked block into an unmasked and a masked loop with no branch in
#: either body, so ptxas keeps the P_{j-1} V_{j-1} wait after the softmax's exps (FA3 Algorithm 2's overlap; with the
#: mask's branch it hoists the wait above them): notes/hopper.md "the P V wait". H100 (h100-gluon-key-loop.json, one
#: process, 5 rotated rounds), peeled / pin at N = 8k / 16k: medians 1.06 / 1.08 non-causal, 0.99 / 1.02 causal; the
#: fastest rounds 1.02 / 1.02 and 0.96 / 0.95: not ahead beyond the noise (rounds spread 5-15%), so not pinned.
#: "fence" (off): the K release after the softmax in an always-taken branch (sm_90a SASS: the P V wait below all 64
#: exps in every loop, d = 128 causal too). H100 (h100-fp8-key-loop.json, 5 rounds), fence / pin at N = 4k / 8k / 16k:
#: medians 1.06 / 1.12 / 1.05 non-causal, 1.06 / 1.07 / 1.14 causal, but the fastest rounds 0.99-1.02, and in the one
#: round per shape where the default did not run right after the bf16 forward, fence / pin = 0.98-0.99: the medians'
#: lead is the default's position in the rotation, not the option, so not pinned (notes/hopper.md, "FP8 end to end")
#: "thread_arrive" (off): every consumer thread arrives on the ring slots' free barriers (own allocations): 1 BAR.SYNC
#: per key block instead of 3 in the SASS; "prefetch" (off): S_{j+1} issued before the softmax of S_j (two score
#: tiles: spills). H100 (h100-fp8-schedule-probe.json, 6 rounds both ways, N = 4k-16k, causal and not), x pin:
#: thread_arrive medians 1.01-1.05, fastest rounds 0.99-1.02; with fence 1.03-1.09 / 1.01-1.05, every shape ahead
#: but inside the default's round spread (0.08-0.22); prefetch 0.27-0.45. None pinned (notes/hopper.md, "FP8 softmax latency")
FP8_GLUON_SCHEDULE = {"turns": False, "merged": False, "split": 1, "peeled": False, "fence": False,
                      "thread_arrive": False, "prefetch": False}
#: the fused FP8 quantisation of Q, K, V (``hopper.fp8_quant``): query blocks per program, key blocks (of K and V)
#: per program, warps; a priori (one Hadamard matrix load shared by a few blocks, a 128 x 128 tile over 8 warps),
#: the H100 sweep of benchmarks/course/bench_fp8_gluon.py's "quant" section checks it (notes/hopper.md, "Fused FP8 quantisation")
FP8_QUANT_CONFIG = {"q_per_program": 2, "kv_per_program": 1, "num_warps": 8}
#: the bf16 Gluon forward's key loop per head dimension (``hopper.flash_gluon.attend_overlapped``'s ``PEELED`` /
#: ``FENCE``): where ptxas puts the P_{j-1} V_{j-1} wait. Both off: the mask's branch leaves it above all 64 exps of
#: the softmax (no FA3 Algorithm 2 overlap); "fence" (the K release after the softmax in an always-taken branch)
#: keeps it after all of them (sm_90a SASS, d = 64 and 128); "peeled" (an unmasked and a masked loop) alone does
#: not move it. H100, one process, 5 rotated rounds (h100-gluon-key-loop.json), fence / both off, medians: d = 128
#: non-causal 1.03 / 1.04 / 1.05 at N = 2k / 8k / 16k, causal 0.97 / 1.00 / 1.03; GQA 32/8 causal training step
#: 1.02 (8k) / 1.06 (32k); d = 64 at 8k 0.95 / 0.99 (off there); peeled + fence no better than fence. The rounds
#: spread by 3-20%, so the d = 128 gain is near the noise (notes/hopper.md "The peeled key loop")
GLUON_FWD_KEY_LOOP = {128: {"peeled": False, "fence": True}, 64: {"peeled": False, "fence": False}}


#: ``pinned(fwd=AUTOTUNE)`` / ``pinned(bwd=AUTOTUNE)``: autotune inside the block even where a pin is the default
AUTOTUNE = "autotune"
_SCOPED: contextvars.ContextVar = contextvars.ContextVar("reference_triton_pins", default={})


_KEYS = {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}


def check_pin(pin, name: str, backward: bool = False):
    """``pin`` if it is a forward pin (a dict with ``_KEYS``) or, ``backward``, ``{"dkdv": pin, "dq": pin}`` (either
    may be left out); ``ValueError`` naming ``name`` otherwise."""
    ok = isinstance(pin, dict) and (
        all(k in ("dkdv", "dq") and isinstance(v, dict) and set(v) == _KEYS for k, v in pin.items())
        if backward else set(pin) == _KEYS)
    if not ok:
        want = "{'dkdv': pin, 'dq': pin}" if backward else f"a dict with keys {sorted(_KEYS)}"
        raise ValueError(f"{name} must be {want}, got {pin!r}")
    return pin


@contextlib.contextmanager
def pinned(fwd: dict | None = None, bwd: dict | None = None, decode=None):
    """Within the ``with`` block (this thread / task only), ``forward_pin()`` returns ``fwd``,
    ``backward_pin()`` returns ``bwd`` (each only if given; ``AUTOTUNE``: autotune) and ``decode_pin(kind)``
    returns ``decode``: one ``DecodeConfig`` for every input kind, or a dict ``{kind: DecodeConfig}`` (kinds of
    ``DECODE_PINS``; the kinds it leaves out keep their pins)."""
    scoped = dict(_SCOPED.get())
    if decode is not None:
        scoped["decode"] = _check_decode_scope(decode)
    if fwd is not None:
        scoped["fwd"] = None if fwd is AUTOTUNE else check_pin(fwd, "fwd")
    if bwd is not None:
        scoped["bwd"] = None if bwd is AUTOTUNE else check_pin(bwd, "bwd", backward=True)
    token = _SCOPED.set(scoped)
    try:
        yield
    finally:
        _SCOPED.reset(token)


def _check_decode_scope(decode):
    """A ``DecodeConfig``, or a dict of them by kind as a sorted tuple of pairs (hashable: a launch-cache key)."""
    if isinstance(decode, DecodeConfig):
        return decode
    if isinstance(decode, dict) and all(k in DECODE_PINS and isinstance(v, DecodeConfig) for k, v in decode.items()):
        return tuple(sorted(decode.items()))
    raise TypeError(f"decode must be a DecodeConfig or a dict {{kind: DecodeConfig}} with kinds in "
                    f"{sorted(DECODE_PINS)}, got {decode!r}")


def forward_pin() -> dict | None:
    """The forward's default: a scoped ``pinned(fwd=...)``, else the interpreter pin under
    ``TRITON_INTERPRET=1``, else ``None`` (autotune)."""
    scoped = _SCOPED.get()
    if "fwd" in scoped:
        return None if scoped["fwd"] is None else dict(scoped["fwd"])
    return dict(FWD_PINS["interpreter"]) if INTERPRET else None


def backward_pin() -> dict | None:
    """The backward's default: a scoped ``pinned(bwd=...)``, else the interpreter pins under
    ``TRITON_INTERPRET=1``, else ``None`` (autotune)."""
    scoped = _SCOPED.get()
    if "bwd" in scoped:
        return None if scoped["bwd"] is None else {k: dict(v) for k, v in scoped["bwd"].items()}
    return {k: dict(v) for k, v in BWD_PINS["interpreter"].items()} if INTERPRET else None


def decode_pin(kind: str) -> DecodeConfig:
    """The decode default for ``kind`` (a key of ``DECODE_PINS``): a scoped ``pinned(decode=...)``, else the default."""
    scoped = _SCOPED.get().get("decode")
    if isinstance(scoped, DecodeConfig):
        return scoped
    return dict(scoped or ()).get(kind, DECODE_PINS[kind])


def scoped_decode():
    """The scoped ``pinned(decode=...)`` choice (hashable) or None: part of the decode launch-cache key."""
    return _SCOPED.get().get("decode")


def as_tuple(pin: dict) -> tuple:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of a pin."""
    return (pin["BLOCK_M"], pin["BLOCK_N"], pin["num_warps"], pin["num_stages"])


#: ``cascade_decode``'s Hopper path (``CascadeConfig.overlap=None``): how the Gluon prefix kernel and the Triton
#: suffix programs share the GPU ("off": one after the other; "pdl": the suffix launch programmatically dependent,
#: beside the prefix CTAs; "streams": a fork/join of two streams and a merge launch), up to
#: ``CascadeConfig.overlap_max_rows`` packed rows. "pdl": H100 graph times in one process (bf16, 32k prefix + 1k
#: suffixes, ``benchmarks/results/h100-cascade.json``, notes/serving_perf.md "Cascade overlap: both passes at once"), B = 8 /
#: 16 / 32: "pdl" 67.1 / 81.3 / 121.5 us (0.83 / 0.83 / 0.74 of copy), "streams" 72.3 / 86.7 / 122.0, "off" 96.3 /
#: 103.4 / 124.0
CASCADE_OVERLAP = "pdl"

__all__ = ["FWD_PINS", "BWD_PINS", "HOPPER_BENCH_BWD", "GLUON_BWD_ORDER", "forward_pin", "backward_pin",
           "pinned", "as_tuple", "check_pin",
           "AUTOTUNE", "DecodeConfig", "DECODE_PINS", "decode_pin", "scoped_decode", "FP8_GLUON_CONFIG",
           "FP8_GLUON_SCHEDULE", "FP8_QUANT_CONFIG",
           "GLUON_FWD_KEY_LOOP", "CASCADE_OVERLAP"]
