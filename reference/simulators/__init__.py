"""Simulations and models that explain the kernels without a GPU (NumPy only).

- ``iosim``: an IO model of HBM + SRAM that counts the FLOPs and HBM bytes of standard attention and
  FlashAttention (lecture 2; ``python -m reference.simulators.iosim``).
- ``fragmentation``: a KV-cache fragmentation simulator, static allocation vs paging (lecture 8).
- ``scheduling``: LPT scheduling of causal attention tiles, as a persistent kernel's workers see it (lectures 3,
  5, 6; ``reference.triton.hopper.flash_persistent`` orders its work items with it).
- ``fp8_error``: FP8 attention error with and without a random Hadamard rotation (lecture 6;
  ``reference.triton.hopper.flash_fp8`` takes its rotation from it).
- ``cycle_model``: tensor-core vs exponential-unit cycles, ping-pong and persistent-kernel arithmetic, GQA
  packing and decode intensity (lectures 6, 7).
- ``mbarrier``: Hopper mbarriers (count, phase, parity waits) and the warp-specialised Gluon forward's barrier
  protocol, run round-robin so a wrong phase shows up as a deadlock or a race (lecture 6 section 10, a7).
"""
