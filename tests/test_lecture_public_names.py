"""Lectures use the course's public names only: no ``_private`` name of ``reference`` is imported or reached
through an attribute in ``lectures/src/*.py`` (a lecture shows the API a reader may use; private helpers move)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "lectures" / "src"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


SOURCE_DISPLAY = ("getsource", "annotated")


def private_uses(source: str) -> list[str]:
    """``[description]`` of every private ``reference`` name a source imports or reads as an attribute."""
    tree = ast.parse(source)
    ref_names, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "reference":
            parts = node.module.split(".")
            found += [f"line {node.lineno}: from {node.module}" for p in parts if _private(p)]
            for a in node.names:
                ref_names.add(a.asname or a.name)
                if _private(a.name):
                    found.append(f"line {node.lineno}: from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "reference":
                    ref_names.add((a.asname or a.name).split(".")[0])
                    found += [f"line {node.lineno}: import {a.name}" for p in a.name.split(".") if _private(p)]
    # reading a private function's source to display it (lecture 06 section 10 annotates the Gluon kernel's
    # real code) is not using it: attributes inside ``inspect.getsource(...)`` / ``annotated(...)`` are exempt
    shown = {id(n) for call in ast.walk(tree) if isinstance(call, ast.Call)
             and getattr(call.func, "attr", getattr(call.func, "id", "")) in SOURCE_DISPLAY
             for arg in call.args for n in ast.walk(arg)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and id(node) not in shown:
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in ref_names:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("src", sorted(SRC.glob("*.py")), ids=lambda p: p.name)
def test_lecture_uses_public_names_only(src):
    assert private_uses(src.read_text(encoding="utf-8")) == []


def test_private_uses_finds_imports_and_attributes():
    bad = ("from reference.triton import flash_fwd\nfrom reference.numpy._validate import x\n"
           "import reference.triton._checks as c\nfrom reference.triton.flash_fwd import _dot\n"
           "y = flash_fwd._fwd_block.fn\n")
    found = private_uses(bad)
    assert len(found) == 4, found
    assert private_uses("import numpy as np\nx = np._NoValue\nfrom reference.triton import softmax\n") == []
