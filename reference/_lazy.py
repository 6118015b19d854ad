"""Lazy package exports: a package's public names live in its submodules and are imported on first use, so that
importing one stage never needs the others (``reference.numpy``, ``reference.triton``)."""
from __future__ import annotations

import sys
from importlib import import_module


def lazy_exports(package: str, exports: dict):
    """``(__getattr__, __dir__)`` for ``package``: name ``n`` resolves to ``<package>.<exports[n]>.n``."""
    def __getattr__(name):
        if name in exports:
            return getattr(import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        module = sys.modules[package]
        return sorted(set(vars(module)) | set(getattr(module, "__all__", ())))

    return __getattr__, __dir__
