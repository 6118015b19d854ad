import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before any @triton.jit runs
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e)); exp2 is the GPU's native instruction
INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")  # (kernels may only read constexpr globals)


def fix_interpreter_range():
    """Given: let the Triton 3.6 interpreter take a runtime value as a ``range()`` bound under NumPy >= 2.4.

    The interpreter turns ``range(0, n, BLOCK)`` into ``int(tensor)``, which calls ``int()`` on a one-element
    array -- an error since NumPy 2.4. This re-patches that one conversion to use ``.item()``. Compiled GPU
    kernels are unaffected (it is a no-op without the interpreter).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter
    if getattr(interpreter, "_range_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    interpreter._range_fix = True


fix_interpreter_range()


@triton.jit
def dot(a, b):
    """Given: ``tl.dot(a, b)`` with float32 accumulation. Use it instead of ``tl.dot``.

    The Triton 3.6 interpreter computes bfloat16 ``tl.dot`` wrongly, so there both operands are widened to
    float32 first (exact for fp16/bf16 values, as the GPU's fp32-accumulating tensor cores are).
    """
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)
