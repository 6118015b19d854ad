"""Reference implementations for the attention course.

- ``reference.numpy``: stages 0-4 in NumPy (softmax, attention, FlashAttention-2, merging, decoding, paging).
- ``reference.iosim``: an IO model of HBM + SRAM that counts FLOPs and bytes moved.
- ``reference.triton``: the Triton GPU kernels (interpreter on CPU when no CUDA device is present).
"""
