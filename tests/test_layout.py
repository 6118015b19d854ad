"""Layout rules of the code base (docs/design.md §2), checked on the source with ``ast``, not by running it.

1. No module assigns another module's UPPERCASE global (``flash_fwd.PIN_CONFIG = ...``, ``setattr(mod, "X", ...)``,
   ``monkeypatch.setattr(mod, "X", ...)``): configuration is passed as arguments (``reference.triton.configs``).
2. The modules of ``reference`` import each other without a circle (module-level and function-level imports both
   count: a lazy import inside a function still ties the two modules' designs together).
3. No module of ``reference`` imports a private name (``_x``) from another module.
4. The longest import chain inside ``reference/`` has at most ``MAX_CHAIN`` modules (lazy imports count; a
   package's ``__init__`` importing its own submodules does not: re-exporting is the package's job). Checks live in
   ``reference.triton._checks`` (``reference.numpy._validate``), so no kernel module imports another to borrow one;
   ``_device`` (device facts, the interpreter decision) is the root every Triton module stands on.
5. Of the portable Triton modules only ``reference.triton.backends`` imports the Hopper backend
   (``reference.triton.hopper``): the serving layer reaches the Gluon kernels through that one module.

Each rule is a function of a source tree, so the tests also run it on small trees built here that break the rule,
and check that it reports them (a rule that can never fail would prove nothing).
"""
from __future__ import annotations

import ast
import functools
import os
import pathlib
import re
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".ipynb_checkpoints", "build", "dist"}


def python_files(root: str, sub: str = ""):
    """``(relative path, source)`` of every ``.py`` file under ``root/sub``."""
    top = os.path.join(root, sub)
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, root), f.read()


def module_name(rel: str) -> str:
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_upper_global(name: str) -> bool:
    return len(name) >= 3 and name.lstrip("_").isupper()


#: methods that change a dict / list / set in place: ``mod.CONFIG.update(...)`` changes ``mod``'s configuration
MUTATORS = {"update", "clear", "pop", "popitem", "setdefault", "append", "extend", "insert", "remove", "add",
            "discard"}


def _foreign_global(node, imported) -> bool:
    """``node`` is ``mod.X`` (``X`` UPPERCASE) with ``mod`` bound by an import."""
    return (isinstance(node, ast.Attribute) and _is_upper_global(node.attr) and _root_name(node.value) in imported)


def foreign_global_assignments(files) -> list[str]:
    """``path:line target`` for each assignment to an UPPERCASE attribute of an imported module (or of any name
    bound by an ``import``): ``mod.X = v``, ``mod.X += v``, ``setattr(mod, "X", v)`` and
    ``monkeypatch.setattr(mod, "X", v)``; and each change in place of such a global: ``mod.X[k] = v``,
    ``del mod.X[k]``, ``mod.X.update(...)`` (any of ``MUTATORS``). Attributes of ``self``/``cls``/instances are not
    module globals. Each entry ends with the global's name."""
    found = []
    for rel, src in files:
        tree = ast.parse(src, rel)
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.update(a.asname or a.name for a in node.names)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [t for tgt in targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
                for t in targets:
                    if _foreign_global(t, imported):
                        found.append(f"{rel}:{node.lineno} {ast.unparse(t)}")
                    elif isinstance(t, ast.Subscript) and _foreign_global(t.value, imported):
                        found.append(f"{rel}:{node.lineno} item of {ast.unparse(t.value)}")
            elif isinstance(node, ast.Delete):
                for t in node.targets:
                    if isinstance(t, ast.Subscript) and _foreign_global(t.value, imported):
                        found.append(f"{rel}:{node.lineno} item of {ast.unparse(t.value)}")
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Attribute) and f.attr in MUTATORS and _foreign_global(f.value, imported)):
                    found.append(f"{rel}:{node.lineno} .{f.attr}() of {ast.unparse(f.value)}")
                is_setattr = (isinstance(f, ast.Name) and f.id == "setattr") or (
                    isinstance(f, ast.Attribute) and f.attr == "setattr")
                if (is_setattr and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                        and isinstance(node.args[1].value, str) and _is_upper_global(node.args[1].value)
                        and _root_name(node.args[0]) in imported):
                    found.append(f"{rel}:{node.lineno} setattr({ast.unparse(node.args[0])}, {node.args[1].value!r})")
    return found


def _root_name(node):
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _resolve(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    """Absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def import_graph(files, package: str = "reference") -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (``from pkg import sub`` counts as importing ``pkg.sub``
    when that is a module; importing ``pkg.sub.x`` also runs ``pkg`` and ``pkg.sub``, but a package importing
    its own submodules is its job, so only the named module is an edge)."""
    files = list(files)
    modules = {module_name(rel): rel for rel, _ in files}
    graph = {m: set() for m in modules if m.split(".")[0] == package}
    for rel, src in files:
        mod = module_name(rel)
        if mod not in graph:
            continue
        is_pkg = rel.endswith("__init__.py")
        for node in ast.walk(ast.parse(src, rel)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node.level, node.module)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name in graph and name != mod:
                    graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports(files, package: str = "reference") -> list[str]:
    """``path:line from X import _y`` for each private name a module of ``package`` imports from another module
    (a package's ``__init__`` importing from its own submodules included). A package-private *module*
    (``from . import _checks``) is not a private name: its public functions are the package's internal API."""
    files = list(files)
    modules = {module_name(rel) for rel, _ in files}
    found = []
    for rel, src in files:
        mod = module_name(rel)
        if mod.split(".")[0] != package:
            continue
        is_pkg = rel.endswith("__init__.py")
        for node in ast.walk(ast.parse(src, rel)):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(mod, is_pkg, node.level, node.module)
                for a in node.names:
                    private = a.name.startswith("_") and not a.name.startswith("__")
                    if private and source != mod and f"{source}.{a.name}" not in modules:  # a module is no name
                        found.append(f"{rel}:{node.lineno} from {source} import {a.name}")
    return found


# ----------------------------------------------------------------------------------------------------------------
# the rules on this repository
# ----------------------------------------------------------------------------------------------------------------
#: known exceptions per file, each with its reason; anything else fails (the decode family's
#: CONFIG / PAGED_CONFIG / FUSE_MERGE / FAST_LAUNCH and bench_decode's SMOKE are keyword arguments now,
#: ``reference.triton.configs.DecodeConfig``). ``INTERPRET``: these tests simulate a GPU on CPU (a test double of
#: the runtime mode, which is read once at import, not a configuration; monkeypatch restores it).
#: ``CELL_LABELS``: ``autograder.where``'s registry of notebook cell names (a table the grader fills at run time,
#: not a configuration); these tests register a fake cell and remove it. ``_NET`` / ``_ISO``: the grader's per-process
#: cache of what a sandbox child reported about the machine (facts, not a configuration); the test empties it to see
#: which child fills it.
ALLOWED = {
    "tests/test_autograder_units.py": {"_NET", "_ISO"},
    "tests/test_any_gpu.py": {"INTERPRET"},
    "tests/test_triton_hopper.py": {"INTERPRET"},
    "tests/test_autograder_feedback.py": {"CELL_LABELS"},
    "tests/test_op_audit.py": {"CELL_LABELS"},
}


def _allowed(entry: str) -> bool:
    rel, name = entry.split(":")[0], re.search(r"(\w+)'?\)?$", entry).group(1)
    return name in ALLOWED.get(rel.replace(os.sep, "/"), ())


def test_no_module_sets_another_modules_config_global():
    found = [f for f in foreign_global_assignments(python_files(ROOT)) if not _allowed(f)]
    assert not found, "configuration set from outside a module (pass it as an argument instead):\n" + "\n".join(found)


def test_reference_has_no_import_circle():
    graph = import_graph(python_files(ROOT, "reference"))
    assert "reference.triton.hopper.flash_gluon" in graph  # the scan sees the wing
    assert not cycles(graph), cycles(graph)


def test_reference_imports_no_private_name_across_modules():
    found = private_imports(python_files(ROOT, "reference"))
    assert not found, "\n".join(found)


def test_experiments_are_not_imported_by_reference():
    """``experiments/`` may import the wing, never the other way round."""
    bad = []
    for rel, src in python_files(ROOT, "reference"):
        for node in ast.walk(ast.parse(src, rel)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] == "experiments"]
    assert not bad, bad


def test_no_lecture_or_readme_benchmark_depends_on_experiments():
    """The ablations in ``experiments/`` may be deleted without breaking a lecture, a test of a public
    name or a benchmark the README quotes: lectures neither import nor run them (they may name the file)."""
    bad = []
    root = pathlib.Path(ROOT)
    for path in sorted((root / "lectures" / "src").glob("*.py")) + [root / "lectures" / "_plots.py"]:
        src = path.read_text()
        for node in ast.walk(ast.parse(src, str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "experiments"]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value.startswith("experiments.") or node.value == "experiments"):
                bad.append(f"{path.name}:{node.lineno} runs {node.value!r}")
    assert not bad, bad


# ----------------------------------------------------------------------------------------------------------------
# the rules can fail: small trees that break them
# ----------------------------------------------------------------------------------------------------------------
def _tree(tmp_path, files: dict[str, str]):
    for rel, src in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    return list(python_files(str(tmp_path)))


@pytest.mark.parametrize("src", [
    "from reference.triton import flash_fwd\nflash_fwd.PIN_CONFIG = {}\n",
    "import reference.triton.decode as dec\ndec.FUSE_MERGE, x = False, 1\n",
    "from reference.triton import decode\ndef f(monkeypatch):\n    monkeypatch.setattr(decode, 'FAST_LAUNCH', 0)\n",
    "import reference.triton.flash_bwd\nsetattr(reference.triton.flash_bwd, 'DQ_MODE', 'atomic')\n",
    "from reference.triton.hopper import flash_fp8\nflash_fp8.CONFIG.update(BLOCK_M=64)\n",
    "import reference.triton.decode as dec\ndec.PAGED_CONFIG['block_n'] = 64\n",
    "from reference.triton import decode\ndel decode.CONFIG['num_warps']\n",
    "from reference.triton import decode\ndecode.CONFIG.clear()\n",
    "from benchmarks.course import bench_decode as bd\nSMOKE = bd.SMOKE = True\n",
    "from reference.triton import cascade\ncascade.LAUNCH_CACHE.clear()\n",
])
def test_foreign_global_assignment_is_found(tmp_path, src):
    assert len(foreign_global_assignments(_tree(tmp_path, {"bench.py": src}))) == 1


def test_an_exception_holds_only_in_its_file():
    """``ALLOWED`` is per file: the same global set anywhere else (a benchmark, another test) fails."""
    assert _allowed("tests/test_any_gpu.py:3 setattr(flash_fwd, 'INTERPRET')")
    assert not _allowed("benchmarks/course/bench_decode.py:3 setattr(flash_fwd, 'INTERPRET')")
    assert not _allowed("tests/test_any_gpu.py:3 decode.FUSE_MERGE")
    assert not _allowed("benchmarks/course/bench_serving.py:9 bd.SMOKE")


def test_own_and_instance_attributes_are_not_flagged(tmp_path):
    src = ("class A:\n    def f(self):\n        self.LIMIT = 3\nCONFIG = {}\nobj = A()\nobj.LIMIT = 4\n"
           "CONFIG.update(a=1)\nCONFIG['b'] = 2\nimport json\nd = json.loads('{}')\nd.update(x=1)\n")
    assert foreign_global_assignments(_tree(tmp_path, {"m.py": src})) == []


def test_an_import_circle_is_found(tmp_path):
    files = _tree(tmp_path, {
        "reference/__init__.py": "",
        "reference/triton/__init__.py": "",
        "reference/triton/a.py": "from .b import g\n",
        "reference/triton/b.py": "def g():\n    from . import c\n",  # a lazy import closes the circle too
        "reference/triton/c.py": "from reference.triton.a import *\n",
        "reference/triton/d.py": "from . import a\n",
    })
    assert cycles(import_graph(files)) == [["reference.triton.a", "reference.triton.b", "reference.triton.c"]]


def test_a_private_import_is_found(tmp_path):
    files = _tree(tmp_path, {
        "reference/__init__.py": "",
        "reference/triton/__init__.py": "",
        "reference/triton/a.py": "def _helper():\n    pass\nfrom .a import _helper as h\n",
        "reference/triton/_checks.py": "_LIMIT = 1\n",
        "reference/triton/b.py": "from .a import _helper, public\nfrom . import _checks\nfrom ._checks import _LIMIT\n",
    })
    assert private_imports(files) == ["reference/triton/b.py:1 from reference.triton.a import _helper",
                                      "reference/triton/b.py:3 from reference.triton._checks import _LIMIT"]


# --------------------------------------------------------------------------------------------------------------
# rules 4 and 5: import depth and the one Hopper import point
# --------------------------------------------------------------------------------------------------------------
MAX_CHAIN = 6
#: modules whose longest chain may exceed ``MAX_CHAIN``, with the reason
LONGER = {
    # the rank programs of the tests and lecture 10 sit on the whole distributed stack: Ulysses -> ring ->
    # local step -> merge -> the Triton merge kernel (or the RING_PINS of configs) -> _device
    "reference.distributed.demo": 7,
}
HOPPER = "reference.triton.hopper"
DISPATCH = {"reference.triton.backends"}


def own_package_edges_dropped(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """``graph`` without the edges from a package to its own submodules."""
    return {m: {w for w in ws if not (m in packages and w.startswith(m + "."))} for m, ws in graph.items()}


def longest_chains(graph: dict[str, set[str]]) -> dict[str, tuple]:
    """Module -> its longest import chain (a tuple of modules, itself first). The graph has no circle
    (``rule 2`` checks that), so the recursion ends."""
    @functools.lru_cache(maxsize=None)
    def chain(m: str) -> tuple:
        return (m,) + max((chain(w) for w in sorted(graph[m])), key=len, default=())

    return {m: chain(m) for m in graph}


def too_long(files, limit: int = MAX_CHAIN, allowed: dict | None = None) -> list[str]:
    """``a -> b -> ...`` for every module of ``reference`` whose longest chain exceeds ``limit`` (or its entry
    in ``allowed``)."""
    files = list(files)
    packages = {rel[:-len("/__init__.py")].replace("/", ".") for rel, _ in files if rel.endswith("__init__.py")}
    graph = own_package_edges_dropped(import_graph(files), packages)
    allowed = allowed or {}
    return [" -> ".join(c) for m, c in sorted(longest_chains(graph).items()) if len(c) > allowed.get(m, limit)]


def hopper_importers(files) -> list[str]:
    """Portable ``reference.triton`` modules (outside ``hopper/``) that import ``reference.triton.hopper``."""
    graph = import_graph(files)
    return sorted(m for m, ws in graph.items()
                  if m.startswith("reference.triton") and not m.startswith(HOPPER)
                  and any(w == HOPPER or w.startswith(HOPPER + ".") for w in ws))


def test_longest_import_chain_in_reference():
    assert too_long(python_files(ROOT, "reference"), allowed=LONGER) == []


def test_the_allowed_longer_chains_are_still_needed():
    """An entry of ``LONGER`` whose chain got shorter must go (the exception would hide a regression)."""
    files = list(python_files(ROOT, "reference"))
    packages = {rel[:-len("/__init__.py")].replace("/", ".") for rel, _ in files if rel.endswith("__init__.py")}
    chains = longest_chains(own_package_edges_dropped(import_graph(files), packages))
    assert {m: len(chains[m]) for m in LONGER} == LONGER


def test_only_the_dispatch_module_imports_the_hopper_backend():
    assert set(hopper_importers(python_files(ROOT, "reference"))) <= DISPATCH


#: the teaching kernels of ``reference.triton`` (docs/design.md §2) and the serving layer beside them
TEACHING = {f"reference.triton.{m}" for m in ("fused_softmax", "flash_fwd", "flash_bwd", "decode", "paged", "varlen",
                                              "primer")}
SERVING = {f"reference.triton.{m}" for m in ("decode_serving", "serving", "cascade", "mixed", "paged_keys",
                                             "paged_tiles", "backends", "_fastlaunch", "serving_aot")}


def serving_imports_of_teaching(files) -> list[str]:
    """``teaching -> serving`` import edges (lazy imports counted): a teaching kernel must read without them."""
    graph = import_graph(files)
    return sorted(f"{m} -> {w}" for m in TEACHING & set(graph) for w in graph[m] if w in SERVING)


def test_teaching_kernels_import_no_serving_module():
    files = list(python_files(ROOT, "reference"))
    assert TEACHING | SERVING <= set(import_graph(files))  # every module named above exists
    assert serving_imports_of_teaching(files) == []


# --------------------------------------------------------------------------------------------------------------
# the rules find what they look for
# --------------------------------------------------------------------------------------------------------------
def _files(sources: dict[str, str]):
    return [(rel, src) for rel, src in sources.items()]


def test_a_teaching_module_importing_the_serving_layer_is_found():
    files = _files({"reference/triton/decode.py": "def f():\n    from . import _fastlaunch\n",
                    "reference/triton/_fastlaunch.py": "", "reference/triton/__init__.py": ""})
    assert serving_imports_of_teaching(files) == ["reference.triton.decode -> reference.triton._fastlaunch"]


def test_a_long_chain_is_found_lazy_imports_included():
    files = _files({f"reference/m{i}.py": f"from . import m{i + 1}\n" for i in range(6)}
                   | {"reference/m6.py": "def f():\n    from . import m7\n", "reference/m7.py": "",
                      "reference/__init__.py": ""})
    assert too_long(files) == [" -> ".join(f"reference.m{i}" for i in range(8)),
                               " -> ".join(f"reference.m{i}" for i in range(1, 8))]
    assert too_long(files, limit=8) == []


def test_a_package_reexporting_its_submodules_is_not_a_chain():
    files = _files({"reference/__init__.py": "", "reference/p/__init__.py": "from .a import x\n",
                    "reference/p/a.py": "from . import b\n", "reference/p/b.py": "from .. import c\n",
                    "reference/c.py": ""})
    assert too_long(files, limit=3) == []
    assert too_long(files, limit=2) == ["reference.p.a -> reference.p.b -> reference.c"]


def test_a_portable_module_importing_hopper_is_found():
    files = _files({"reference/triton/serving.py": "def f():\n    from .hopper.k import g\n",
                    "reference/triton/backends.py": "def f():\n    from .hopper import k\n",
                    "reference/triton/hopper/k.py": "from .. import serving\n",
                    "reference/triton/hopper/__init__.py": "", "reference/triton/__init__.py": ""})
    assert hopper_importers(files) == ["reference.triton.backends", "reference.triton.serving"]
