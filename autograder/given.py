"""Which functions of a submission are the assignment's *given* code (docs/design.md §6, the op audit).

A notebook's given cells (``assignments/given/*.py``, pasted in by ``autograder.percent``) may compute in
torch on purpose: a3b's ``attention_forward`` is the forward pass the backward assignment differentiates. The
op audit marks an op whose innermost submission frame lies in a top-level function that is *the same
function* as a given one (the task's ``audit_given`` says which given functions may compute for it): same name and the same code up to comments, formatting and docstrings (compared as
``ast.dump`` of the definition without its docstring). An edited copy is the student's own code, judged as such.

The given files ship with the grader: ``assignments/given`` in the course checkout, or beside the
``autograder`` package in a Gradescope zip (``autograder.gradescope.build_zip`` adds them).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

GIVEN_DIRS = (Path(__file__).resolve().parents[1] / "assignments" / "given",)


def _fingerprint(node) -> str:
    node = ast.parse(ast.unparse(node)).body[0]          # a copy, without position information that matters
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]
    return ast.dump(node, annotate_fields=False, include_attributes=False)


@functools.lru_cache(maxsize=1)
def given_fingerprints() -> frozenset:
    """Fingerprints of every top-level function of the given files (empty when none ship)."""
    out = set()
    for d in GIVEN_DIRS:
        for p in sorted(d.glob("*.py")) if d.is_dir() else ():
            try:
                tree = ast.parse(p.read_text())
            except SyntaxError:
                continue
            out.update(_fingerprint(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return frozenset(out)


def given_functions(cells) -> dict:
    """``{cell index: [(first line, last line, name), ...]}`` of the submission's top-level functions that are
    given code, decorators included."""
    known = given_fingerprints()
    out = {}
    if not known:
        return out
    for cell in cells:
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for n in tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _fingerprint(n) in known:
                first = min([n.lineno] + [d.lineno for d in n.decorator_list])
                out.setdefault(cell.index, []).append((first, n.end_lineno, n.name))
    return out
