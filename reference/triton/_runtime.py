"""Choose between a real GPU and Triton's CPU interpreter, before any kernel is defined.

Triton decides at ``@triton.jit`` time whether a kernel is compiled or interpreted, from the environment
variable ``TRITON_INTERPRET``. This module is imported first by ``reference.triton`` so that on a machine with
no CUDA device the variable is set before any kernel module is imported. It says so once, on stderr.
"""
from __future__ import annotations

import os
import sys

import torch

_ENV = "TRITON_INTERPRET"

HAS_CUDA: bool = bool(torch.cuda.is_available())

#: ``TRITON_INTERPRET=0`` set explicitly on a machine without CUDA: compile-only mode. Nothing can be launched,
#: but kernels compile ahead of time for a GPU target (``reference.triton.hopper._aot``: the Gluon kernels for sm_90a).
COMPILE_ONLY: bool = not HAS_CUDA and os.environ.get(_ENV) == "0"

if os.environ.get(_ENV, "0") == "1":
    INTERPRET = True
elif COMPILE_ONLY:
    INTERPRET = False
elif not HAS_CUDA:
    os.environ[_ENV] = "1"
    INTERPRET = True
    print("reference.triton: no CUDA device found; kernels run in the Triton interpreter "
          "(TRITON_INTERPRET=1, CPU tensors, slow: use small shapes)", file=sys.stderr)
else:
    INTERPRET = False


def _fix_interpreter_range() -> None:
    """Let the interpreter take a run-time value as a ``range()`` bound under NumPy >= 2.4.

    Triton 3.6's interpreter converts a loop bound with ``int(self.handle.data)``, and ``int()`` of a
    one-element 1-d array is an error since NumPy 2.4 ("only 0-dimensional arrays can be converted to Python
    scalars"). Re-registering that one conversion with ``.reshape(-1)[0]`` lets the kernels keep the plain
    ``for ... in range(lo, hi, BLOCK)`` loops that the GPU compiler software-pipelines, so the interpreter
    runs exactly the code the GPU runs. Applied only when interpreting and only if NumPy has the problem.
    """
    import numpy as np
    try:
        int(np.ones(1))
        return  # older NumPy: nothing to fix
    except TypeError:
        pass
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - no Triton installed
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(interpreter, "_course_range_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    interpreter._course_range_fix = True


if INTERPRET:
    _fix_interpreter_range()

# Tensors handed to kernels must live here.
DEVICE = torch.device("cpu") if INTERPRET or COMPILE_ONLY else torch.device("cuda")


def num_sms() -> int:
    """Streaming multiprocessors of the current device (a nominal 132, an H100's, under the interpreter)."""
    if INTERPRET:
        return 132
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
