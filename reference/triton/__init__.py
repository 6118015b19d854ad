"""Triton reference kernels (docs/design.md §4, ``reference.triton``). Torch tensors in, torch tensors out.

Importing this package on a machine with no CUDA device switches Triton to its interpreter
(``TRITON_INTERPRET=1``) before any kernel is defined, and says so once; the same kernels then run on CPU
tensors. ``reference.triton.INTERPRET`` and ``reference.triton.DEVICE`` tell which mode is active.
"""
from .._lazy import lazy_exports

from ._device import DEVICE, HAS_CUDA, INTERPRET, num_sms  # noqa: F401  (must run before any kernel import)

_EXPORTS = {
    "softmax": "fused_softmax",
    "flash_attention_forward": "flash_fwd",
    "flash_attention_backward": "flash_bwd",
    "flash_attention_forward_fp8": "hopper.flash_fp8",
    "flash_attention_forward_fp8_gluon": "hopper.flash_fp8_gluon",
    "flash_attention_forward_persistent": "hopper.flash_persistent",
    "flash_attention_forward_gluon": "hopper.flash_gluon",
    "flash_attention_backward_gluon_ws": "hopper.flash_gluon_bwd_ws",
    "flash_attention_gluon": "hopper.flash_gluon_autograd",
    "flash_attention": "flash_autograd",
    "flash_decode": "decode_serving",
    "paged_decode": "decode_serving",
    "flash_attention_varlen": "varlen",
    "flash_attention_varlen_forward": "varlen",
    "paged_prefill": "serving",
    "cascade_decode": "cascade",
    "mixed_attention": "mixed",
}

__all__ = sorted(_EXPORTS) + ["DEVICE", "INTERPRET", "HAS_CUDA", "num_sms"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
