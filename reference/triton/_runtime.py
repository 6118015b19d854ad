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

if os.environ.get(_ENV, "0") == "1":
    INTERPRET = True
elif not HAS_CUDA:
    os.environ[_ENV] = "1"
    INTERPRET = True
    print("reference.triton: no CUDA device found; kernels run in the Triton interpreter "
          "(TRITON_INTERPRET=1, CPU tensors, slow: use small shapes)", file=sys.stderr)
else:
    INTERPRET = False

# Tensors handed to kernels must live here.
DEVICE = torch.device("cpu") if INTERPRET else torch.device("cuda")


def num_sms() -> int:
    """Streaming multiprocessors of the current device (a nominal 132, an H100's, under the interpreter)."""
    if INTERPRET:
        return 132
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
