"""The common-bugs guide: ``python -m autograder.bugs_guide [--check] [--only a1 ...]`` writes
``docs/common_bugs/<aid>.md`` from the grader's bundled wrong submissions (``autograder/submissions/<aid>/wrong/``).

For each wrong entry (a ``*.mutant.json`` or a ``*.py``), in the order of the zoo:

* **cause**: what the entry says it does wrong, in its own words (a mutant's ``"why"``, a ``.py``'s module
  docstring; a leading ``WRONG:``/``slow on purpose:`` is dropped);
* **symptom**: what ``check(...)`` prints for it in a notebook: the entry is loaded as ``make check`` loads a
  notebook (``adapter.load``: check cells skipped) and ``check`` runs the visible cases of each function its
  expectation names, with a fixed seed; the header and the FAIL / NOT RUN rows are kept, or a line saying that
  every visible case passes (then only a hidden or GPU test sees the bug);
* **caught by**: the grader's tests its expectation (``expected.json``: ``fail``, ``zero_tasks``, ``min_ratio``)
  names, with their points and where they run;
* **how to find it**: the entry's own hint where it gives one (a mutant's ``"find"``, a paragraph starting
  ``Find:`` in a ``.py`` docstring), else one derived from the symptom and the catching tests.

Running ``check`` on a Triton assignment's entry takes the interpreter seconds per case (a7: an sm_90a compile),
so symptoms are cached in ``docs/common_bugs/symptoms.json`` under a hash of everything that makes them (the
entry, a mutant's base, and every grader module that ``check()`` or the assignment's spec imports: the
diagnosis words, the interpreter's bounds check, the case generators). ``--check`` (the test) recomputes the
symptoms of every entry whose functions are all NumPy (but one that hangs on purpose, whose symptom is a time
limit) and of every entry whose hash changed, reuses the rest, and exits 1 when a guide on disk differs from the
one it would write (a relative error that the CPU's BLAS kernels move within a factor of 2 is not a difference:
``same_but_rounding``). A new zoo entry therefore shows up in the guide only through this script, and a stale
guide fails the test.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import hashlib
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from . import specs
from .selftest import SUB, materialise_mutant

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "common_bugs"
CACHE = OUT / "symptoms.json"
SEED = 0
#: where what check() prints comes from: these modules and every grader module they import (``checker_modules``,
#: part of every entry's hash), and those of one assignment
CHECKER = ("check.py", "visible.py", "adapter.py", "isolated.py", "check_worker.py")
CHECKER_OF = {"a5_paged": ("allocator_check.py",), "a7_gluon": ("local_checks.py", "gluon_compile.py")}


# --- the zoo -------------------------------------------------------------------------------------------------
def entries(aid: str, sub: Path = SUB) -> list[dict]:
    """The wrong entries of ``aid``: ``{"name", "path", "cause", "find", "expect", "slow"}``, in file order."""
    folder = sub / aid / "wrong"
    if not folder.is_dir():
        return []
    exp_file = folder / "expected.json"
    expect = json.loads(exp_file.read_text()) if exp_file.exists() else {}
    out = []
    for p in sorted(folder.iterdir()):
        if p.name.endswith(".mutant.json"):
            spec = json.loads(p.read_text())
            name, why, find = p.name[: -len(".mutant.json")], spec.get("why", ""), spec.get("find")
        elif p.suffix == ".py" and not p.name.startswith("_"):
            doc = ast.get_docstring(ast.parse(p.read_text())) or ""
            parts = re.split(r"\n\s*\n", doc)
            find = next((x.split(":", 1)[1].strip() for x in parts if x.startswith("Find:")), None)
            name, why = p.stem, "\n\n".join(x for x in parts if not x.startswith("Find:"))
        else:
            continue
        if not why.strip():
            raise ValueError(f"{p}: a zoo entry must say what it does wrong (a mutant's \"why\", a module docstring)")
        slow = bool(re.match(r"\s*slow on purpose", why, re.I)) or name.startswith("s_")
        cause = re.sub(r"^\s*(WRONG|SLOW)\s*:\s*|^\s*slow on purpose\s*:\s*", "", why, flags=re.I)
        out.append({"name": name, "path": p, "cause": " ".join(cause.split()), "find": find,
                    "expect": expect.get(f"{name}.py", {}), "slow": slow})
    return out


def catching_tests(spec, expect: dict) -> list:
    """The grader's tests that the expectation says catch the entry: ``(test, why)``, in the spec's order."""
    out = []
    for t in spec.tests:
        why = None
        if any(f in t.name for f in expect.get("fail", [])):
            why = "fails"
        elif t.task in expect.get("zero_tasks", []):
            why = "scored 0 with every test of its function"
        elif any(k in t.name for k in expect.get("min_ratio", {})):
            why = "loses its speed points"
        if why:
            out.append((t, why))
    return out


def tasks_of(spec, expect: dict) -> list:
    """The graded functions whose visible cases show the entry's symptom: those of its catching tests."""
    hit = [t.task for t, _ in catching_tests(spec, expect)]
    return list(dict.fromkeys(hit)) or list(spec.tasks)


# --- symptoms ------------------------------------------------------------------------------------------------
def entry_hash(aid: str, entry: dict) -> str:
    h = hashlib.sha256()
    h.update(entry["path"].read_bytes())
    if entry["path"].name.endswith(".mutant.json"):
        h.update((REPO / json.loads(entry["path"].read_text())["base"]).read_bytes())
    h.update(json.dumps(entry["expect"], sort_keys=True).encode())
    for m in checker_modules(CHECKER + CHECKER_OF.get(aid, ()) + (f"specs/{aid}.py",)):
        h.update(m.encode())
        h.update((REPO / "autograder" / m).read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def checker_modules(roots: tuple) -> tuple:
    """``roots`` (files under ``autograder/``) and every ``autograder`` module they import, directly or not, at
    the top or inside a function (relative imports, read from the source): a change to any of them may change a
    symptom (the diagnosis words, the bounds check, the case generators), so it changes the hash."""
    base = REPO / "autograder"
    seen, todo = set(), list(roots)
    while todo:
        rel = todo.pop()
        if rel in seen or not (base / rel).is_file():
            continue
        seen.add(rel)
        pkg = Path(rel).parent
        for node in ast.walk(ast.parse((base / rel).read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            here = pkg
            for _ in range(node.level - 1):
                here = here.parent
            stem = here / node.module.replace(".", "/") if node.module else here
            names = [stem / "__init__.py", stem.parent / f"{stem.name}.py"] if node.module else []
            names += [stem / f"{a.name}.py" for a in node.names]
            todo += [str(n) for n in names if (base / n).is_file()]
    return tuple(sorted(seen))


def _source(entry: dict, tmp: Path) -> Path:
    if entry["path"].name.endswith(".mutant.json"):
        return materialise_mutant(entry["path"], tmp)
    return entry["path"]


@contextlib.contextmanager
def cells_put_back():
    """``adapter.load`` registers each cell's source (``linecache``: a kernel's source is read from there) and
    label (``where.CELL_LABELS``) under ``<cell N>`` for the rest of the process, as a notebook needs. The guide
    loads its entries in the caller's process (the test suite's): what was registered under those names before is
    put back afterwards, so a later test's own ``<cell 2>`` is not read as a zoo entry's (``tests/conftest.py``
    does the same around every test)."""
    import linecache

    from .where import CELL_LABELS
    lines = {k: v for k, v in linecache.cache.items() if k.startswith("<cell ")}
    labels = dict(CELL_LABELS)
    try:
        yield
    finally:
        for k in [k for k in linecache.cache if k.startswith("<cell ")]:
            del linecache.cache[k]
        linecache.cache.update(lines)
        CELL_LABELS.clear()
        CELL_LABELS.update(labels)


def symptom(aid: str, entry: dict) -> str:
    """What ``check`` prints for the entry's functions (header, FAIL and NOT RUN rows, reproduce lines)."""
    from .adapter import load
    from .check import check
    spec = specs.load(aid)
    with tempfile.TemporaryDirectory() as tmp, cells_put_back():
        loaded = load(_source(entry, Path(tmp)))
        blocks = []
        for tid in tasks_of(spec, entry["expect"]):
            fn, why = loaded.function(spec.tasks[tid].name)
            if fn is None:
                blocks.append(f"{spec.tasks[tid].name}: {why}")
                continue
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                ok = check(tid, fn, seed=SEED)
            blocks.append(_keep(buf.getvalue(), ok))
    return "\n".join(blocks)


def _keep(printed: str, ok: bool) -> str:
    """The lines of a check() printout that show the bug: header, column names, FAIL / NOT RUN rows and the
    failing cases' reproduce lines; a passing function is one line."""
    lines = printed.rstrip("\n").splitlines()
    if ok:
        return lines[0].replace("all passed", "all visible cases passed") if lines else ""
    keep = [l.rstrip() for i, l in enumerate(lines) if i < 2 or re.search(r"\s(FAIL|NOT RUN)\s", l) or
            l.startswith(("failed case", "  reproduce"))]
    return "\n".join(keep)


def _stable(text: str) -> str:
    """Relative errors of a million and more written as ``>1e+06``: such an error comes from uninitialised memory
    (a kernel that leaves part of its output unwritten), whose values differ from run to run."""
    return re.sub(r"\b\d\.\d+e\+(\d\d)\b", lambda m: ">1e+06" if int(m.group(1)) >= 6 else m.group(0), text)


def all_numpy(aid: str, entry: dict) -> bool:
    spec = specs.load(aid)
    return all(spec.tasks[t].framework == "numpy" for t in tasks_of(spec, entry["expect"]))


def symptoms(aid: str, cache: dict, recompute_numpy: bool, log=None, sub: Path = SUB) -> dict:
    """``{entry name: symptom}``; ``cache`` (``{f"{aid}/{name}": {"hash", "symptom"}}``) is read and updated."""
    out = {}
    for e in entries(aid, sub):
        key, h = f"{aid}/{e['name']}", entry_hash(aid, e)
        hit = cache.get(key)
        # a hanging entry (its expectation caps the case time: ``case_timeout``) prints a time limit, the same on
        # every machine, and recomputing it spins for the whole limit (10 s): it is recomputed when its hash changes
        recompute = recompute_numpy and all_numpy(aid, e) and "case_timeout" not in e["expect"]
        if hit and hit["hash"] == h and not recompute:
            out[e["name"]] = hit["symptom"]
            continue
        if log:
            log(f"  check() on {key} ...")
        out[e["name"]] = symptom(aid, e)
        cache[key] = {"hash": h, "symptom": out[e["name"]]}
    return out


# --- the guide -----------------------------------------------------------------------------------------------
def _where(t) -> str:
    if t.parent_check is not None:
        return "CPU (compile-only check)"
    if t.gpu_only:
        cap = f" (sm_{t.min_capability[0]}{t.min_capability[1]})" if t.min_capability else ""
        return f"GPU{cap} only"
    return "CPU and GPU"


def _function_of(spec, t) -> str:
    return spec.tasks[t.task].name


def how_to_find(spec, entry: dict, sym: str, caught: list) -> str:
    if entry["find"]:
        return entry["find"]
    fails = [l for l in sym.splitlines() if re.search(r"\s(FAIL)\s", l)]
    if entry["slow"]:
        return ("`check()` cannot see it: the answers are right. Time your function against the reference on a GPU "
                "at the speed test's shapes, and compare your launch grid and tile sizes with the lecture's.")
    if fails and "reproduce:" in sym:
        label = re.split(r"\s{2,}", fails[0].strip())[0]
        return (f"Run the `check(...)` cell: the case \"{label}\" fails. Re-run it alone with the `reproduce:` line "
                "and compare your output with a float64 NumPy computation of the same case, one step at a time.")
    if fails:
        return ("Run the `check(...)` cell: the FAIL row's message says what the check saw (it runs no case you can "
                "re-run); change what it names and run the cell again.")
    names = "; ".join(dict.fromkeys(t.name.split(": ", 1)[1] for t, _ in caught)) or "the hidden tests"
    return (f"`check()` passes: only the grader's hidden or GPU tests see it ({names}). Build such a case "
            "yourself (the test's name says which) and compare with a float64 NumPy version.")


def render(aid: str, syms: dict, sub: Path = SUB) -> str:
    spec = specs.load(aid)
    es = entries(aid, sub)
    lines = [f"# Common bugs: {aid}", "",
             f"Generated by `python -m autograder.bugs_guide` from the grader's bundled wrong submissions "
             f"(`autograder/submissions/{aid}/wrong/`): do not edit by hand. Each entry is a mistake students make; "
             "the symptom is what `check(...)` prints for it in the notebook (visible cases, fixed seed), the "
             "tests are the grader's. Instructor-facing: the causes name the mistakes, not the answers.", ""]
    if not es:
        return "\n".join(lines + ["The zoo has no wrong submission for this assignment yet.", ""])
    lines += ["| entry | function(s) | caught by |", "|---|---|---|"]
    for e in es:
        caught = catching_tests(spec, e["expect"])
        fns = ", ".join(dict.fromkeys(f"`{spec.tasks[t].name}`" for t in tasks_of(spec, e["expect"])))
        names = dict.fromkeys(f"{_function_of(spec, t)}: {t.name.split(': ', 1)[1]}" for t, _ in caught)
        lines.append(f"| [{e['name']}](#{e['name'].lower()}) | {fns} | {'; '.join(names) or '-'} |")
    for e in es:
        caught = catching_tests(spec, e["expect"])
        sym = _stable(syms[e["name"]])
        lines += ["", f"## {e['name']}", "", f"**Cause.** {e['cause']}", "", "**Symptom** (`check(...)` prints):", "",
                  "```text", sym, "```", "", "**Caught by.**"]
        for t, why in caught:
            if not (t.visible or t.parent_check):
                vis = "hidden cases only"
            elif f"check {t.task}: all visible cases passed" in sym:
                vis = "its visible cases pass, its hidden cases fail"
            else:
                vis = "visible cases in `check()`"
            lines.append(f"- `{t.name.split(': ', 1)[1]}` ({_function_of(spec, t)}, {t.points:g} points"
                         f"{', bonus' if t.optional else ''}; {_where(t)}; {vis}): {why}")
        if not caught:
            lines.append("- (no test named in the zoo's expectation)")
        for flag in e["expect"].get("flags", []):
            lines.append(f"- flag {flag} (docs/design.md §6)")
        lines += ["", f"**How to find it.** {how_to_find(spec, e, sym, caught)}"]
    return "\n".join(lines) + "\n"


#: a relative error as check() prints it (``evaluate.fmt_err``: "3.4e-07"; a tolerance is printed "2e-05")
_SCI = re.compile(r"(?<![\w.])[-+]?\d+\.\d+e[-+]?\d+(?![\w.])")


def same_but_rounding(old: str, new: str, factor: float = 2.0) -> bool:
    """Whether two guides say the same thing: identical text except relative errors (printed with one decimal in
    scientific notation) within ``factor`` of each other. A float32 case's error at the rounding level (1e-7)
    moves in its second digit with the CPU's BLAS kernels (OpenBLAS picks AVX-512 or AVX2 code at run time:
    3.4e-07 against 2.9e-07 for one a2 entry), so the guide committed from one machine is not stale on another;
    an error that moves by more than ``factor``, or any other word or number, is a change."""
    a, b = _SCI.split(old), _SCI.split(new)
    if a != b:
        return False
    for x, y in zip(_SCI.findall(old), _SCI.findall(new)):
        fx, fy = float(x), float(y)
        if fx != fy and not (fx * fy > 0 and max(fx / fy, fy / fx) <= factor):
            return False
    return True


def generate(aids=None, check_only=False, log=print, sub: Path = SUB, out: Path = OUT,
             recompute_numpy: bool | None = None) -> list:
    """Write (or, ``check_only``, compare) the guides of ``aids`` (default: every assignment); returns the paths
    that differ from what is on disk beyond ``same_but_rounding`` (written unless ``check_only``). ``sub``: the
    zoo's folder, ``out``: the guide's (its symptom cache is ``out/symptoms.json``). ``recompute_numpy`` (default: ``check_only``): recompute
    the symptoms of all-NumPy entries whose hash is cached too."""
    recompute_numpy = check_only if recompute_numpy is None else recompute_numpy
    cache_path = Path(out) / CACHE.name
    aids = [specs.resolve(a) for a in aids] if aids else list(specs.ASSIGNMENTS)
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    stale = []
    for aid in aids:
        log(f"{aid}:")
        text = render(aid, symptoms(aid, cache, recompute_numpy=recompute_numpy, log=log, sub=sub), sub)
        path = Path(out) / f"{aid}.md"
        if not path.exists() or not same_but_rounding(path.read_text(), text):
            stale.append(path)
            if not check_only:
                Path(out).mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if not check_only:
        keep = {k: v for k, v in cache.items() if k.split("/")[0] not in aids or
                any(k == f"{a}/{e['name']}" for a in aids for e in entries(a, sub))}
        cache_path.write_text(json.dumps(keep, indent=1, sort_keys=True) + "\n")
    return stale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.bugs_guide", description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=None, metavar="AID", help="assignments (ids or short ids)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a guide is stale")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    stale = generate(args.only, args.check, log=lambda m: print(m, file=sys.stderr))
    for s in stale:
        print(f"{'stale' if args.check else 'wrote'} {s.relative_to(REPO)}")
    if args.check and stale:
        print("run `python -m autograder.bugs_guide` and commit docs/common_bugs/", file=sys.stderr)
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    raise SystemExit(main())
