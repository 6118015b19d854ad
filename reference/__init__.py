"""Reference implementations for the attention course.

- ``reference.numpy``: stages 0-4 in NumPy (softmax, attention, FlashAttention-2, merging, decoding, paging).
- ``reference.triton``: the Triton GPU kernels (interpreter on CPU when no CUDA device is present).
- ``reference.distributed``: ring attention over several ranks.
- ``reference.simulators``: NumPy models and simulations (IO model, KV fragmentation, LPT scheduling, FP8 error,
  cycle arithmetic); ``reference.iosim`` is the IO model under the path SPEC.md names.
- ``reference.serving_engine``: the mini serving engine of lecture 9 (NumPy).
"""
