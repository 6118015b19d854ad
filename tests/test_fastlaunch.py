"""reference.triton._fastlaunch.RecordedLaunch on a stand-in compiled kernel (CPU: no GPU, no Triton compile).

The recorded launch hands Triton's launcher device addresses instead of tensors (no ``data_ptr()`` and
``cuPointerGetAttribute`` per argument in the launcher) and skips the launch metadata and the hook chains while no
hook is installed; with a hook installed it passes the tensors and the metadata as Triton's own path does. These
tests check what reaches the launcher in each case, against the argument list built independently here."""
import pytest
import torch

from reference.triton._fastlaunch import RecordedLaunch  # first: it sets TRITON_INTERPRET before Triton is imported
from triton import knobs  # noqa: E402,I001


class _Launcher:
    """Stands in for Triton 3.6's ``CudaLauncher``: ``__call__`` (the Python wrapper) and ``launch`` (its C entry
    point), each recording what it was given."""

    def __init__(self, scratch=0):
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.calls = []

    def __call__(self, *args):
        self.calls.append(("run", args))

    def launch(self, *args):
        self.calls.append(("launch", args))


class _Kernel:
    def __init__(self, scratch=0):
        self.run = _Launcher(scratch)
        self.function, self.packed_metadata = 1234, (4, 1, 0)

    def launch_metadata(self, grid, stream, *args):
        return {"grid": grid, "stream": stream, "args": args}


def _recorded(scratch=0):
    fixed, old_a, old_b = torch.randn(3), torch.randn(2), torch.randn(4)
    args = [old_a, 7, fixed, old_b, "const", 2.5]
    rec = RecordedLaunch(_Kernel(scratch), (2, 3, 1), args, {"A": 0, "B": 3})
    return rec, fixed, args


@pytest.mark.parametrize("scratch", [0, 64])
def test_addresses_reach_the_launcher_without_hooks(scratch):
    rec, fixed, _ = _recorded(scratch)
    a, b = torch.randn(5), torch.randn(6)
    rec({"A": a, "B": b}, stream=99)
    rec.launch((b, a.data_ptr()), stream=98)  # tensors or addresses in slot order
    rec.launch((a, b), stream=97, addresses=(11, 12))  # the caller's addresses win
    want = [[a.data_ptr(), 7, fixed.data_ptr(), b.data_ptr(), "const", 2.5],
            [b.data_ptr(), 7, fixed.data_ptr(), a.data_ptr(), "const", 2.5],
            [11, 7, fixed.data_ptr(), 12, "const", 2.5]]
    calls = rec.kernel.run.calls
    assert len(calls) == 3
    for (kind, got), stream, args in zip(calls, (99, 98, 97), want):
        if scratch:  # scratch memory to allocate: the launcher's Python wrapper, hooks and metadata left out
            assert kind == "run" and got == (2, 3, 1, stream, 1234, (4, 1, 0), None, None, None, *args)
        else:  # the C entry point, with the wrapper's fixed arguments
            assert kind == "launch" and got == (2, 3, 1, stream, 1234, False, True, None, None, (4, 1, 0), None,
                                                None, None, *args)


def test_a_launch_hook_sees_tensors_and_metadata():
    rec, fixed, _ = _recorded()
    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        a, b = torch.randn(5), torch.randn(6)
        rec({"A": a, "B": b}, stream=5)
        rec.launch((a, b), stream=5, addresses=(11, 12))  # with a hook the tensors go, not the addresses
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(rec.kernel.run.calls) == 2 and len(seen) == 0  # the stand-in launcher calls no hook itself
    for kind, got in rec.kernel.run.calls:
        assert kind == "run" and got[:6] == (2, 3, 1, 5, 1234, (4, 1, 0))
        meta, enter = got[6], got[7]
        assert enter is knobs.runtime.launch_enter_hook and meta["stream"] == 5
        args = got[9:]
        assert args[0] is a and args[3] is b and args[2] is fixed and args[1:] == meta["args"][1:]
    rec({"A": a, "B": b}, stream=5)  # the hook removed: addresses again
    assert rec.kernel.run.calls[-1][0] == "launch"


def test_drop_slots_keeps_no_reference_to_the_recorded_call():
    """A recorded training step's launch must not keep its first call's q, k, v alive: with ``drop_slots`` the
    recorded slot arguments (tensors, or descriptors holding tensors) are let go; the other arguments stay."""
    import gc
    import weakref
    from reference.triton._fastlaunch import DescArg
    fixed, old_a, old_b = torch.randn(3), torch.randn(2), torch.randn(4, 8)
    args = [old_a, 7, fixed, DescArg(old_b), "const"]
    refs = [weakref.ref(old_a), weakref.ref(old_b)]
    rec = RecordedLaunch(_Kernel(), (1, 1, 1), args, {"A": 0, "D": 3}, drop_slots=True)
    keep = RecordedLaunch(_Kernel(), (1, 1, 1), args, {"A": 0, "D": 3})
    del args, old_a, old_b
    gc.collect()
    assert all(r() is not None for r in refs)  # ``keep`` still holds them
    del keep
    gc.collect()
    assert [r() for r in refs] == [None, None]
    a, b = torch.randn(5), DescArg(torch.randn(2, 8))
    rec.launch((a, b), stream=3)
    kind, got = rec.kernel.run.calls[-1]
    assert kind == "launch" and got[13:] == (a.data_ptr(), 7, fixed.data_ptr(), b, "const")


def test_a_descriptor_argument_reads_as_triton_reads_a_tensor_descriptor():
    """``DescArg`` gives Triton 3.6's launcher (``make_tensordesc_arg``) what a Gluon ``TensorDescriptor`` of the
    same 2-D view gives it."""
    from triton.backends.nvidia.driver import make_tensordesc_arg
    from reference.triton._fastlaunch import DescArg
    from reference.triton.hopper.common import tile_descriptor
    x = torch.randn(3, 64, 128).to(torch.bfloat16)[1:].reshape(-1, 128)
    ours, theirs = make_tensordesc_arg(DescArg(x), None), make_tensordesc_arg(tile_descriptor(x, 64, 128), None)
    assert ours[0] is theirs[0] is x and ours[1:] == theirs[1:]
    assert ours[1:] == [128, 128, 128, 1, False, 128, 128, 128, 1]
