"""NumPy reference implementations (docs/design.md §4, ``reference.numpy``).

Modules: ``softmax``, ``attention``, ``flash``, ``merge``, ``decoding``, ``paged``, ``varlen``, ``serving``, ``mixed``, ``ring``. The public names of each
module are also importable from this package (``from reference.numpy import flash_attention_forward``); they
are loaded lazily so that importing one stage never needs the others.
"""
from .._lazy import lazy_exports

_EXPORTS = {
    "naive_softmax": "softmax",
    "safe_softmax": "softmax",
    "online_softmax": "softmax",
    "softmax_stats": "softmax",
    "merge_softmax_stats": "softmax",
    "attention_backward": "attention",
    "causal_mask": "attention",
    "multi_head_attention": "attention",
    "flash_attention_forward": "flash",
    "flash_attention_backward": "flash",
    "merge_states": "merge",
    "merge_many": "merge",
    "KVCache": "decoding",
    "flash_decoding": "decoding",
    "BlockAllocator": "paged",
    "PagedKVCache": "paged",
    "paged_attention": "paged",
    "varlen_attention": "varlen",
    "varlen_attention_backward": "varlen",
    "paged_prefill": "serving",
    "cascade_decode": "serving",
    "mixed_attention": "mixed",
    "mixed_plan": "mixed",
    "ring_step": "ring",
    "ring_backward_step": "ring",
}
# Note: the function ``attention`` lives in the module ``reference.numpy.attention`` (same name), so it is
# reached as ``reference.numpy.attention.attention``.

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
