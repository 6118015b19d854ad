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

The Hopper Gluon kernels take one frozen dataclass per family, never a tuple: ``GluonForwardConfig`` (the bf16
forward and the paged prefill; pin ``GLUON_FORWARD``), ``Fp8GluonConfig`` (``FP8_GLUON_CONFIG``),
``GluonBackwardConfig`` (``GLUON_BACKWARD`` per head dimension) and ``Fp8QuantConfig`` (``FP8_QUANT_CONFIG``). Their
tiles must fit ``HOPPER_SMEM``, the one shared-memory limit of a Hopper CTA (``_device.KNOWN["H100"]``); each
kernel's ``check_*_config`` names what its layouts take. Passing one of them never picks another kernel.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ._device import INTERPRET, KNOWN

#: shared memory one Hopper CTA may opt in to (227 KiB), which every Gluon kernel's tiles must fit
HOPPER_SMEM = KNOWN["H100"].smem


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

#: ring attention's running output stays in the 16-bit input dtype up to this many ranks, fp32 beyond: within 1.15x
#: of the kernel's own error to W = 4 (H100 errors vs float64: notes/ring_attention.md; notes/pins.md "RING_PINS")
RING_PINS = {"half_state_max_world": 4}


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


#: the warp-specialised Gluon backward's program order: interleave 2 (batch, kv head) pairs where a causal launch's
#: longest program is >= 0.2 of an SM's share (benchmarks/results/h100-gluon-bwd-order-sweep.json; notes/pins.md
#: "GLUON_BWD_ORDER")
GLUON_BWD_ORDER = {"heads": 2, "min_share": 0.2}


@dataclass(frozen=True)
class KeyBlockConfig:
    """What every kernel that walks the keys in blocks is launched with: ``block_n`` keys per inner-loop step (the
    N of the QK^T tile, a power of two >= 16 for ``tl.dot``), ``num_warps`` (a power of two) and ``num_stages``
    (software pipeline depth). The base of ``DecodeConfig``, ``MixedConfig``, ``CascadeConfig`` and the Hopper
    Gluon kernels' ``GluonForwardConfig``, ``Fp8GluonConfig``, ``GluonBackwardConfig``, which add their own fields."""
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
    needs runs the first fallback that fits (``_device.stage_ladder``: fewer stages, then shorter key blocks).
    The options measured and not pinned (programmatic dependent launch, a two-level merge, dynamic splits) are
    ``experiments.decode_variants.DecodeVariant``'s."""
    num_stages: int = 4
    fuse_merge: bool = True
    #: Hopper only (sm_90+, contiguous cache): K/V tiles as TMA boxes of a host tensor descriptor instead of
    #: pointer loads (None: never; the portable path runs everywhere else). notes/serving_perf.md "Decode at 32k and
    #: the one-launch cascade".
    use_tma: bool = False
    #: fused merge: at most this many (query head, split) rows of d fp32 partial outputs per step of the merge
    #: loop (a power of two >= 2). The merge's tile sets the kernel's registers: 128 rows (4 heads x 32 splits)
    #: take stage 1 from 86 to 165 registers (ncu); fewer rows, more steps.
    merge_rows: int = 128

    def __post_init__(self):
        super().__post_init__()
        for field in ("fuse_merge", "use_tma"):
            if type(getattr(self, field)) is not bool:
                raise ValueError(f"{type(self).__name__}.{field} must be a bool, got {getattr(self, field)!r}")
        r = self.merge_rows
        if type(r) is not int or r < 2 or r & (r - 1):
            raise ValueError(f"{type(self).__name__}.merge_rows must be a power of two >= 2, got {r!r}")

    def launch(self) -> dict:
        """``{"block_n", "num_warps", "num_stages"}``: the tile and launch options (``_device.stage_ladder``'s form)."""
        return dict(block_n=self.block_n, num_warps=self.num_warps, num_stages=self.num_stages)


@dataclass(frozen=True)
class MixedConfig(KeyBlockConfig):
    """Tile shapes and launch settings of ``mixed._mixed_kernel`` (pass ``mixed_attention(config=...)`` to override).

    The key-block launch (``configs.KeyBlockConfig``: block_n, num_warps, num_stages) and small_rows /
    large_rows: rows (tokens x G) of the decode and prefill tiles;
    split_keys: most keys per work item (a multiple of block_n and of the page size when pages are larger);
    use_tma: None picks TMA key loads on Hopper when a page holds whole key blocks, False never. The kernel looks
    the block table up one key block ahead and loads whole pages; the simpler lookups it was measured against are
    ``experiments.serving_baselines.MixedVariant``'s.
    """
    small_rows: int = 16
    large_rows: int = 64
    split_keys: int = 4096
    use_tma: bool | None = None


#: the Gluon cascade prefix pass's key blocks and ring depths (``hopper.cascade_prefix_gluon``)
GLUON_PREFIX_BLOCK_N = (64, 128)
GLUON_PREFIX_STAGES = (2, 3, 4)


def check_gluon_prefix_fields(block_n, stages) -> tuple:
    """``(block_n, stages)`` of the Gluon cascade prefix pass: in ``GLUON_PREFIX_BLOCK_N`` / ``GLUON_PREFIX_STAGES``
    (``cascade_prefix_gluon.check_prefix_config`` adds the shared-memory check for a head dimension)."""
    for name, v, ok in (("block_n", block_n, GLUON_PREFIX_BLOCK_N), ("stages", stages, GLUON_PREFIX_STAGES)):
        if not isinstance(v, int) or isinstance(v, bool) or v not in ok:
            raise ValueError(f"Gluon cascade prefix: {name} must be one of {ok}, got {v!r}")
    return block_n, stages


@dataclass(frozen=True)
class CascadeConfig(KeyBlockConfig):
    """The key-block launch (``configs.KeyBlockConfig``: block_n, num_warps, num_stages) and rows: most query
    rows of a prefix tile (a power of two >= 16); programs_per_sm: prefix programs to aim for per SM;
    min_split_keys / max_split_keys: fewest / most prefix keys per split. One prefix program per SM and at most
    2048 keys a split (H100 sweeps; notes/pins.md "CascadeConfig")."""
    rows: int = 64
    programs_per_sm: int = 1
    min_split_keys: int = 512
    max_split_keys: int = 2048
    #: launch order: every prefix item first (a 1-D grid) or the (item, kv head) grid; None: prefix-first when the
    #: prefix programs fit one per SM (notes/pins.md "CascadeConfig")
    prefix_first: bool | None = None
    #: Hopper only: the Triton prefix pass loads TMA boxes of the contiguous prefix instead of pointer loads
    use_tma: bool = False
    #: the prefix pass as the Hopper Gluon kernel (``hopper.cascade_prefix_gluon``): True / False, or None where it
    #: applies and the batch has ``gluon_min_rows`` packed rows per kv head (h100-cascade.json, h100-mixed-batch.json;
    #: notes/pins.md "CascadeConfig")
    prefix_gluon: bool | None = None
    gluon_min_rows: int = 32
    #: the same threshold for eager calls (host-bound below it: h100-mixed-batch.json; notes/pins.md "CascadeConfig")
    eager_gluon_min_rows: int = 256
    #: the Gluon prefix pass's key block and ring depth (``configs.check_gluon_prefix_fields``)
    gluon_block_n: int = 128
    gluon_stages: int = 2
    #: the Gluon path's passes: "off" one after the other, "pdl" the suffix launch programmatically dependent,
    #: "streams" a fork/join; None: ``CASCADE_OVERLAP`` up to ``overlap_max_rows`` packed rows, "off" above
    #: (notes/serving_perf.md "Cascade overlap: both passes at once")
    overlap: str | None = None
    #: the overlap's packed-row limit: "pdl" wins to B = 32 at G = 4 (h100-cascade.json; notes/pins.md "CascadeConfig")
    overlap_max_rows: int = 128
    #: prefix CTAs per SM aimed at while overlapping: 0.5 of 0.35 / 0.5 / 0.75 (h100-cascade.json; notes/pins.md)
    overlap_prefix_share: float = 0.5
    #: suffix programs per SM left free by the prefix CTAs (a persistent grid over the (request, kv head) items)
    overlap_suffix_per_sm: int = 2

    def __post_init__(self):
        super().__post_init__()
        if self.overlap not in (None, "off", "pdl", "streams"):
            raise ValueError(f"CascadeConfig.overlap must be None, 'off', 'pdl' or 'streams', got {self.overlap!r}")
        share = self.overlap_prefix_share
        if type(share) not in (int, float) or not 0 < share <= 4:
            raise ValueError(f"CascadeConfig.overlap_prefix_share must be a number in (0, 4], got {share!r}")
        if type(self.overlap_max_rows) is not int or self.overlap_max_rows < 0:
            raise ValueError(f"CascadeConfig.overlap_max_rows must be an int >= 0, got {self.overlap_max_rows!r}")
        if type(self.overlap_suffix_per_sm) is not int or self.overlap_suffix_per_sm < 1:
            raise ValueError("CascadeConfig.overlap_suffix_per_sm must be a positive int, got "
                             f"{self.overlap_suffix_per_sm!r}")
        for field in ("prefix_first", "prefix_gluon"):
            v = getattr(self, field)
            if v is not None and type(v) is not bool:
                raise ValueError(f"CascadeConfig.{field} must be a bool or None, got {v!r}")
        if type(self.use_tma) is not bool:
            raise ValueError(f"CascadeConfig.use_tma must be a bool, got {self.use_tma!r}")
        if type(self.gluon_min_rows) is not int or self.gluon_min_rows < 1:
            raise ValueError(f"CascadeConfig.gluon_min_rows must be a positive int, got {self.gluon_min_rows!r}")
        if type(self.eager_gluon_min_rows) is not int or self.eager_gluon_min_rows < 1:
            raise ValueError("CascadeConfig.eager_gluon_min_rows must be a positive int, got "
                             f"{self.eager_gluon_min_rows!r}")
        try:
            check_gluon_prefix_fields(self.gluon_block_n, self.gluon_stages)
        except ValueError as e:
            raise ValueError(f"CascadeConfig.gluon_block_n / gluon_stages: {e}") from None


#: ``mixed_attention``'s default (H100: 4 warps, 64-row prefill tiles, 64-key blocks) and ``cascade_decode``'s (the
#: fields' defaults above); under the interpreter both take small tiles
MIXED_DEFAULT = MixedConfig() if not INTERPRET else MixedConfig(small_rows=16, large_rows=32, block_n=16, num_stages=1,
                                                                split_keys=64)
CASCADE_DEFAULT = CascadeConfig() if not INTERPRET else CascadeConfig(rows=16, block_n=16, num_stages=1,
                                                                      min_split_keys=16)


def check_decode_config(config, name: str = "config"):
    """``config`` if it is None or a ``DecodeConfig``; ``TypeError`` naming ``name`` otherwise (a subclass too: its
    extra options would be ignored here, ``experiments.decode_variants`` runs them)."""
    if config is not None and type(config) is not DecodeConfig:
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


#: the FP8 forward's schedule options (``flash_fp8_gluon.attend_fp8``): all off; each one measured was slower or inside
#: the rounds' noise (benchmarks/results/h100-fp8-gluon.json, h100-fp8-key-loop.json, h100-fp8-schedule-probe.json;
#: notes/pins.md "FP8_GLUON_SCHEDULE")
FP8_GLUON_SCHEDULE = {"turns": False, "merged": False, "split": 1, "peeled": False, "fence": False,
                      "thread_arrive": False}
#: the bf16 Gluon forward's key loop per head dimension (``attend_overlapped``'s ``PEELED`` / ``FENCE``): "fence" at
#: d = 128 keeps the P V wait after the softmax's exps, a gain near the noise; off at d = 64
#: (benchmarks/results/h100-gluon-key-loop.json; notes/pins.md "GLUON_FWD_KEY_LOOP")
GLUON_FWD_KEY_LOOP = {128: {"peeled": False, "fence": True}, 64: {"peeled": False, "fence": False}}


@dataclass(frozen=True)
class GluonForwardConfig(KeyBlockConfig):
    """A Hopper Gluon forward's CTA tile (``hopper.flash_gluon``, ``hopper.paged_prefill_gluon``): ``block_m`` query
    rows (two consumer warpgroups of ``block_m / 2``), ``block_n`` keys per K/V ring slot, ``num_stages`` ring slots,
    ``num_warps`` per consumer warpgroup. ``shared_bytes`` is what the tiles take; each kernel's check
    (``flash_gluon.check_gluon_config``) says which values its layouts take and whether they fit."""
    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 2
    block_m: int = 128
    #: bytes of one element of Q, K, V in shared memory
    ELEM_BYTES: ClassVar[int] = 2

    def __post_init__(self):
        super().__post_init__()
        bm = self.block_m
        if type(bm) is not int or bm < 16 or bm & (bm - 1):
            raise ValueError(f"{type(self).__name__}.block_m must be a power of two >= 16, got {bm!r}")

    @classmethod
    def from_tuple(cls, tile) -> "GluonForwardConfig":
        """From ``(block_m, block_n, num_stages, num_warps)``, the order ``as_tuple`` gives (benchmark tables)."""
        if not isinstance(tile, (tuple, list)) or len(tile) != 4:
            raise ValueError(f"tile must be (block_m, block_n, num_stages, num_warps), got {tile!r}")
        bm, bn, stages, warps = tile
        return cls(block_m=bm, block_n=bn, num_stages=stages, num_warps=warps)

    def as_tuple(self) -> tuple:
        """``(block_m, block_n, num_stages, num_warps)``: how the results files record a tile."""
        return (self.block_m, self.block_n, self.num_stages, self.num_warps)

    def shared_bytes(self, head_dim: int) -> int:
        """The tiles' shared memory: two Q buffers of ``block_m x d`` (the next tile's Q loads while this one is
        computed) and ``num_stages`` K and V slots of ``block_n x d`` (the barriers add a few hundred bytes)."""
        return (2 * self.block_m + 2 * self.num_stages * self.block_n) * head_dim * self.ELEM_BYTES

    def fits(self, head_dim: int) -> bool:
        """The tiles and 1 KiB for the barriers fit a Hopper CTA's shared memory (``_device.KNOWN["H100"]``)."""
        return self.shared_bytes(head_dim) + 1024 <= HOPPER_SMEM


@dataclass(frozen=True)
class Fp8GluonConfig(GluonForwardConfig):
    """The Gluon FP8 forward's CTA tile (``hopper.flash_fp8_gluon``): as ``GluonForwardConfig`` with e4m3 tiles (one
    byte an element, so a deeper ring fits); ``block_m / 2 = 64`` is the query quantisation block and ``block_n``
    the key quantisation block (``flash_fp8_gluon.check_fp8_gluon_config``)."""
    num_stages: int = 3
    ELEM_BYTES: ClassVar[int] = 1


@dataclass(frozen=True)
class GluonBackwardConfig(KeyBlockConfig):
    """The warp-specialised Gluon backward (``hopper.flash_gluon_bwd_ws``): one CTA per ``block_n = 128`` key rows
    (64 per consumer warpgroup of ``num_warps = 4``), ``block_m`` query rows a step, ``num_stages`` Q/dO ring slots;
    ``dq_tma``: dQ added by the copy engine's reduce from shared memory (else vector atomics from registers);
    ``defer``: each step's dQ product issued one step late; ``ld_tma``: the producer copies ``L_i, D_i`` into the
    ring (else the consumers load them); ``persistent``: one CTA per SM looping over a host-made list schedule of
    the key blocks (else one CTA per key block). ``flash_gluon_bwd_ws.check_ws_config`` says which values fit."""
    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 2
    block_m: int = 64
    dq_tma: bool = True
    defer: bool = True
    ld_tma: bool = True
    persistent: bool = False

    def __post_init__(self):
        super().__post_init__()
        bm = self.block_m
        if type(bm) is not int or bm < 16 or bm & (bm - 1):
            raise ValueError(f"GluonBackwardConfig.block_m must be a power of two >= 16, got {bm!r}")
        for field in ("dq_tma", "defer", "ld_tma", "persistent"):
            if type(getattr(self, field)) is not bool:
                raise ValueError(f"GluonBackwardConfig.{field} must be a bool, got {getattr(self, field)!r}")

    @classmethod
    def from_tuple(cls, t) -> "GluonBackwardConfig":
        """From ``(block_m, num_stages, dq_tma, defer, ld_tma[, persistent])``, the order ``as_tuple`` gives
        (benchmark tables; results files written before ``persistent`` existed hold five)."""
        if not isinstance(t, (tuple, list)) or len(t) not in (5, 6):
            raise ValueError(f"t must be (block_m, num_stages, dq_tma, defer, ld_tma[, persistent]), got {t!r}")
        bm, stages, dq_tma, defer, ld_tma, *rest = t
        return cls(block_m=bm, num_stages=stages, dq_tma=dq_tma, defer=defer, ld_tma=ld_tma,
                   persistent=rest[0] if rest else False)

    def as_tuple(self) -> tuple:
        """``(block_m, num_stages, dq_tma, defer, ld_tma)``, and ``persistent`` after them where it is on: how the
        results files record a configuration (those written before ``persistent`` existed stay readable)."""
        return (self.block_m, self.num_stages, self.dq_tma, self.defer, self.ld_tma) + ((True,) if self.persistent else ())


@dataclass(frozen=True)
class Fp8QuantConfig:
    """The fused FP8 quantisation of Q, K, V (``hopper.fp8_quant``): ``q_per_program`` query blocks and
    ``kv_per_program`` key blocks (of K and V) a program (one Hadamard matrix load shared by a few blocks),
    ``num_warps``. Not a ``KeyBlockConfig``: it walks no key loop (its block sizes are the quantisation's, arguments
    of ``quantize_qkv_fp8``) and runs in one stage."""
    q_per_program: int = 2
    kv_per_program: int = 1
    num_warps: int = 8

    def __post_init__(self):
        for field in ("q_per_program", "kv_per_program", "num_warps"):
            v = getattr(self, field)
            if type(v) is not int or v < 1:
                raise ValueError(f"Fp8QuantConfig.{field} must be a positive int, got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"Fp8QuantConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")


#: the bf16 Gluon forward's and the Gluon paged prefill's tile: 128 x 128, 2 stages (3 do not fit at d = 128); H100/H200
#: (benchmarks/results/h100-gluon.json; notes/pins.md "GLUON_FORWARD")
GLUON_FORWARD = GluonForwardConfig()
#: the warp-specialised Gluon backward per head dimension: 128 query rows a step at d = 64, 64 at d = 128
#: (benchmarks/results/h100-gluon-bwd-d64-sweep.json; notes/pins.md "GLUON_BACKWARD")
GLUON_BACKWARD = {64: GluonBackwardConfig(block_m=128), 128: GluonBackwardConfig(block_m=64)}
#: causal launches: the same tiles on the persistent schedule, which was ahead of one CTA per key block in every
#: causal row of the training-step bar on an H200 (benchmarks/results/h200-bwd-persistent-probe.json; notes/pins.md
#: "GLUON_BACKWARD")
GLUON_BACKWARD_CAUSAL = {d: dataclasses.replace(c, persistent=True) for d, c in GLUON_BACKWARD.items()}
#: the Gluon FP8 forward: two 64-row consumers, 128-key blocks, 3 stages
#: (benchmarks/results/h100-fp8-gluon.json; notes/pins.md "FP8_GLUON_CONFIG")
FP8_GLUON_CONFIG = Fp8GluonConfig()
#: the fused FP8 quantisation: 2 query blocks, 1 key block a program, 8 warps; a priori, checked by the H100 "quant"
#: sweep (benchmarks/results/h100-fp8-quant.json; notes/pins.md "FP8_QUANT_CONFIG")
FP8_QUANT_CONFIG = Fp8QuantConfig()
#: ``serving.paged_prefill``'s default gather ("tma": the Gluon kernel on Hopper, the Triton page tiles elsewhere) and
#: the Gluon kernel's tile (``GLUON_FORWARD``): fastest at 16- and 64-token pages
#: (benchmarks/results/h100-paged-prefill.json; notes/pins.md "PAGED_PREFILL")
PAGED_PREFILL = {"gather": "tma", "gluon_config": GLUON_FORWARD}


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
    if type(decode) is DecodeConfig:
        return decode
    if isinstance(decode, dict) and all(k in DECODE_PINS and type(v) is DecodeConfig for k, v in decode.items()):
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


#: ``cascade_decode``'s Hopper path (``CascadeConfig.overlap=None``): the suffix launch programmatically dependent
#: ("pdl") beside the Gluon prefix CTAs, fastest of off / pdl / streams at B = 8-32 (benchmarks/results/h100-cascade.json;
#: notes/pins.md "CASCADE_OVERLAP")
CASCADE_OVERLAP = "pdl"

__all__ = ["FWD_PINS", "BWD_PINS", "HOPPER_BENCH_BWD", "GLUON_BWD_ORDER", "forward_pin", "backward_pin",
           "pinned", "as_tuple", "check_pin",
           "AUTOTUNE", "DecodeConfig", "DECODE_PINS", "decode_pin", "scoped_decode", "FP8_GLUON_CONFIG",
           "FP8_GLUON_SCHEDULE", "FP8_QUANT_CONFIG",
           "GLUON_FWD_KEY_LOOP", "CASCADE_OVERLAP", "KeyBlockConfig", "MixedConfig", "CascadeConfig", "PROGRAMS_PER_SM",
           "check_gluon_prefix_fields", "MIXED_DEFAULT", "CASCADE_DEFAULT", "GluonForwardConfig", "Fp8GluonConfig",
           "GluonBackwardConfig", "Fp8QuantConfig", "GLUON_FORWARD", "GLUON_BACKWARD", "GLUON_BACKWARD_CAUSAL",
           "PAGED_PREFILL", "HOPPER_SMEM"]
