"""The interpreter-or-GPU decision, named for callers outside the package (``reference.triton._device`` makes it).

Triton decides at ``@triton.jit`` time whether a kernel is compiled or interpreted, from the environment variable
``TRITON_INTERPRET``; ``_device`` sets it (no CUDA device: the interpreter, said once on stderr) and is the root of
the package's imports, so no kernel module is defined before the decision. This module names the same objects for
callers outside the package.
"""
from ._device import COMPILE_ONLY, DEVICE, HAS_CUDA, INTERPRET, num_sms  # noqa: F401
