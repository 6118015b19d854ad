"""CHEAT T13 (GPU only): the softmax kernel is launched on a side CUDA stream and the function returns at once,
before the kernel has run, so a timer that waits only for the default stream would see just the launch.
The stream is reached through ``torch.cuda.streams`` / ``StreamContext`` so that the static scan (which flags
``torch.cuda.Stream`` / ``torch.cuda.stream``) does not see it: only the harness's device-wide synchronise
(before the clock stops, and before outputs are read) defends. Expected on CUDA: the softmax outputs are right,
and the speed test does not look faster than an honest kernel. The attention functions are not implemented."""
import torch
import triton
import triton.language as tl
from torch.cuda.streams import Stream as _Side


@triton.jit
def _row_softmax(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride_y + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


_STREAMS = {}


def softmax(x):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    side = _STREAMS.setdefault(x.device, _Side(x.device))
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.StreamContext(side):
        block = triton.next_power_of_2(x2.shape[1])
        _row_softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), BLOCK=block,
                                     num_warps=8 if block >= 2048 else 4)
    return y.reshape(x.shape)            # no wait_stream back: the caller's stream does not wait for the kernel


def flash_attention_forward(q, k, v, causal=False, scale=None):
    raise NotImplementedError


def flash_attention_forward_basic(q, k, v, scale=None):
    raise NotImplementedError
