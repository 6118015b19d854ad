"""The one place the portable serving layer reaches the Hopper backend (``reference.triton.hopper``).

The serving entry points run portable Triton kernels everywhere and, on a compute-capability-9.0 GPU, hand two
passes to Gluon kernels of the Hopper backend: ``paged_prefill``'s attention (``hopper/paged_prefill_gluon.py``)
and ``cascade_decode``'s prefix pass (``hopper/cascade_prefix_gluon.py``). Those modules are imported here and
nowhere else in the portable layer (``tests/test_import_graph.py`` checks it), inside each function, so that
importing ``serving`` or ``cascade`` never imports Gluon and a Hopper kernel's edit reaches the portable layer
through these few names only. What each pass needs from the backend:

* paged prefill: ``gluon_paged_ok`` (whether the kernel takes these inputs; None, else the reason) and
  ``paged_prefill_gluon`` (the launch);
* cascade decode: ``prefix_ok`` (whether the prefix kernel applies), ``cascade_prefix`` (the prefix pass's host
  module: launch spec, split count, the kernel to record) and ``cached_descriptors`` (the prefix's TMA descriptors).
"""
from __future__ import annotations

#: the ``backend=`` argument of ``serving.paged_prefill`` and ``cascade.cascade_decode``: "auto" picks by device and
#: inputs, "triton" the portable kernels, "gluon" the Hopper kernels (a ``ValueError`` with the reason elsewhere)
BACKENDS = ("auto", "triton", "gluon")


def gluon_paged_ok(q, k_cache, config=None):
    """``hopper.paged_prefill_gluon.gluon_paged_ok``: None where the Gluon paged prefill takes these inputs."""
    from .hopper.paged_prefill_gluon import gluon_paged_ok as ok
    return ok(q, k_cache, config)


def paged_prefill_gluon(*args, **kwargs):
    """``hopper.paged_prefill_gluon.paged_prefill_gluon``: write ``o`` and ``lse`` of a paged prefill."""
    from .hopper.paged_prefill_gluon import paged_prefill_gluon as launch
    return launch(*args, **kwargs)


def prefix_ok(q, prefix_k, prefix_v, limits) -> bool:
    """``hopper.cascade_prefix_gluon.prefix_ok``: the Gluon prefix kernel applies to these inputs."""
    from .hopper.cascade_prefix_gluon import prefix_ok as ok
    return ok(q, prefix_k, prefix_v, limits)


def cascade_prefix():
    """The Gluon prefix pass's module (``gluon_num_splits``, ``HALF``, ``tiles``, ``launch_spec``,
    ``cascade_prefix_kernel``, ``SLOTS``): the launch ``cascade_decode`` builds and records."""
    from .hopper import cascade_prefix_gluon
    return cascade_prefix_gluon


def cached_descriptors(prefix_k, prefix_v, block_n: int) -> tuple:
    """``hopper.cascade_prefix_gluon.cached_descriptors``: the prefix's TMA descriptors, built once per tensor."""
    from .hopper.cascade_prefix_gluon import cached_descriptors as descriptors
    return descriptors(prefix_k, prefix_v, block_n)
