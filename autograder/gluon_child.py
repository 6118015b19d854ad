"""Child side of the compile-only checks (a7_gluon; docs/design.md §6): runs inside the sandboxed child, on the
submission's namespace, and sends back raw material only; the grading parent judges it (``gluon_compile.py``).

A *compile child* is a sandboxed child like every other (namespaces, hidden checkout, traps, audit hook) started
with the Triton interpreter off and no GPU (``Sandbox(compile_only=True)``), because the interpreter cannot
compile Gluon. Two requests (``child.Child.serve``):

* ``probe``: a ``@gluon.jit`` helper evaluated as plain Python (its ``.fn``) on integer arguments -> the ints it
  returned (the parent compares them with the formula and plays the turns through its own mbarrier model);
* ``compile``: ``triton.compile`` of a ``@gluon.jit`` kernel for sm_90a (``GPUTarget("cuda", 90, 32)``) with
  the signature and constexprs the parent sent -> the PTX text and the cubin bytes (the parent disassembles the
  cubin itself and counts registers, spills and instructions: a count is never computed by code the submission
  shares a process with). ``ptxas`` is the only program the child may start (``traps.install_audit``'s
  ``exec_allow``: the wheel's ``ptxas``).

Everything here runs while the traps are active (``Child._active``), as a graded call does.
"""
from __future__ import annotations

import numpy as np

HOPPER = ("cuda", 90, 32)


def plain(obj):
    """The Python function behind a ``@gluon.jit`` / ``@triton.jit`` helper (``.fn``), or ``obj`` itself."""
    return getattr(obj, "fn", obj)


def probe(ns: dict, name: str, args: list) -> list:
    """``[int(name.fn(*a)) for a in args]``; raises what the helper raised (the parent reports it)."""
    obj = ns.get(name)
    if obj is None:
        raise NameError(f"{name} is not defined in the submission")
    fn = plain(obj)
    if not callable(fn):
        raise TypeError(f"{name} is not a function")
    return [int(fn(*[int(x) for x in a])) for a in args]


def _stub_in(exc):
    """The message of a ``NotImplementedError`` in ``exc``'s chain (Triton wraps it in a CompilationError), or
    None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            return str(exc)
        if "NotImplementedError" in str(exc):
            line = next((ln for ln in str(exc).splitlines() if "NotImplementedError" in ln), "")
            return line.strip()[:200]
        exc = exc.__cause__ or exc.__context__
    return None


def compile_kernel(ns: dict, name: str, signature: dict, constexprs: dict, num_warps: int,
                   maxnreg: int | None = None) -> tuple[dict, dict]:
    """Compile ``ns[name]`` for sm_90a; ``({"shared": bytes, "name": kernel name}, {"ptx": uint8, "cubin":
    uint8})``. ``signature`` maps every non-constexpr argument to its type string (the parent computes the
    tensor-descriptor strings), ``constexprs`` the rest."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = ns.get(name)
    if kernel is None:
        raise NameError(f"{name} is not defined in the submission")
    names = list(getattr(kernel, "arg_names", None) or [])
    if not names:
        raise TypeError(f"{name} is not a @gluon.jit kernel")
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    missing = [n for n in names if n not in sig]
    if missing:
        raise TypeError(f"{name}: arguments {missing} are not the skeleton's (signature {sorted(sig)})")
    src = GluonASTSource(kernel, {n: sig[n] for n in names},
                         {(names.index(k),): v for k, v in constexprs.items() if k in names})
    options = {"num_warps": int(num_warps)}
    if maxnreg is not None:
        options["maxnreg"] = int(maxnreg)
    try:
        compiled = triton.compile(src, target=GPUTarget(*HOPPER), options=options)
    except Exception as exc:
        stub = _stub_in(exc)
        if stub is not None:          # a helper still raises NotImplementedError: say so, not a compiler trace
            raise NotImplementedError(f"{name} calls a function that is not implemented yet ({stub})") from None
        raise
    ptx, cubin = compiled.asm["ptx"], compiled.asm["cubin"]
    ptx = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    meta = {"shared": int(compiled.metadata.shared), "name": str(compiled.metadata.name)}
    return meta, {"ptx": np.frombuffer(ptx, dtype=np.uint8), "cubin": np.frombuffer(bytes(cubin), dtype=np.uint8)}
