"""Static scan of a submission's code (T10 and friends): imports, attributes, names and strings that a
submission has no business using, found with ``ast`` before anything runs.

Each finding is attributed to the graded tasks that can reach it: a finding inside a top-level function or
class counts against every graded name whose definition refers to it (directly or through other top-level
helpers); a finding in module-level code counts against all tasks. Runtime traps (``autograder.traps``) catch
what a static scan cannot see (e.g. names built at run time).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from .traps import ALLOWED_SUBMODULES, FORBIDDEN_ROOTS, forbidden_prefix
from .threats import T1, T2, T3, T4, T10, T13, T14, T15, T17, T18

# attribute names (on anything) that reach a library implementation of what the student must write
FORBIDDEN_ATTR_PARTS = ("softmax", "scaled_dot_product", "flash_attn", "sdpa", "multi_head_attention_forward",
                        "MultiheadAttention")
# dunders and frame/closure attributes used to escape or to smuggle behaviour (T3, T4, T14)
DUNDER = {
    "__subclasses__": T3, "__globals__": T3, "__builtins__": T3, "__code__": T3, "__closure__": T3,
    "__wrapped_by_autograder__": T3, "f_back": T3, "f_globals": T3, "f_locals": T3, "tb_frame": T3,
    "gi_frame": T3, "cr_frame": T3, "__loader__": T3, "__spec__": T3, "__reduce__": T4,
    "__reduce_ex__": T4, "__getstate__": T4, "__setstate__": T4, "__array__": T14,
    "__array_ufunc__": T14, "__array_function__": T14, "__array_finalize__": T14, "__array_wrap__": T14,
    "__array_interface__": T14, "__torch_function__": T14, "__torch_dispatch__": T14, "__class__": T14,
    "__del__": T3, "__bases__": T3, "__mro__": T3, "TensorBase": T3,
    # a raw pointer to tensor memory: the way to NumPy views and duck-typed kernel arguments (T10)
    "data_ptr": T10,
}
# module attributes that must not be used, by module (file/process/network/introspection)
MODULE_ATTRS = {
    "os": {"system": T17, "popen": T17, "fork": T17, "forkpty": T17, "kill": T17, "killpg": T17,
           "setsid": T17, "setpgid": T17, "getppid": T17, "_exit": T17, "abort": T17,
           "write": T1, "fdopen": T1, "dup": T1, "dup2": T1, "open": T1, "pipe": T17,
           "remove": T18, "unlink": T18, "rmdir": T18, "removedirs": T18, "rename": T18,
           "replace": T18, "symlink": T18, "link": T18, "truncate": T18, "mkfifo": T18,
           "listdir": T2, "scandir": T2, "walk": T2, "chdir": T2, "unshare": T17},
    "sys": {"modules": T3, "settrace": T3, "setprofile": T3, "_getframe": T3, "meta_path": T3,
            "path_hooks": T3, "exit": T17, "stdout": T1, "stderr": T1, "__stdout__": T1},
    "numpy": {"load": T2, "save": T1, "savez": T1, "savez_compressed": T1, "fromfile": T2,
              "memmap": T2, "loadtxt": T2, "savetxt": T1, "genfromtxt": T2, "ctypeslib": T17},
    "torch": {"load": T2, "save": T1, "Stream": T13, "stream": T13, "jit": T10, "compile": T10},
    "torch.cuda": {"Stream": T13, "stream": T13, "set_stream": T13, "Event": T15},
}
OS_PREFIXES = ("exec", "spawn", "posix_spawn")
BUILTIN_CALLS = {"__import__": T10, "exec": T10, "eval": T10, "compile": T10, "globals": T3,
                 "locals": T3, "vars": T3, "breakpoint": T17, "open": T1, "input": T17}
GETATTR_LIKE = {"getattr", "setattr", "delattr", "hasattr"}
# assigning to an attribute of these modules is monkeypatching (T3; timers: T15)
PROTECTED_MODULES = ("numpy", "torch", "time", "os", "sys", "builtins", "math", "autograder", "random",
                     "triton.testing", "hashlib", "json", "tracemalloc", "threading")
TIMER_ATTRS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns", "process_time",
               "Event", "elapsed_time", "synchronize", "do_bench"}
SUSPICIOUS_STRINGS = ("scaled_dot_product", "flash_attn", "/autograder", "results.json", "/proc/", "__import__",
                      "importlib", "__builtins__", "subprocess", "os.system", "AUTOGRADER", "softmax(")
EXACT_STRINGS = {"reference": T10, "softmax": T10, "log_softmax": T10, "autograder": T3, "ctypes": T17,
                 "socket": T18, "posix": T17, "nt": T17}


@dataclass
class Finding:
    threat: str
    message: str
    cell: int
    line: int
    scope: str | None          # top-level def/class name, None = module level


class _Scan(ast.NodeVisitor):
    def __init__(self, cell, extra_forbidden, aliases):
        self.cell = cell
        self.extra = set(extra_forbidden)
        self.aliases = aliases           # local name -> module full name (shared across cells)
        self.findings = []
        self.scope = None
        self.docstrings = set()

    def add(self, node, threat, msg):
        self.findings.append(Finding(threat, msg, self.cell, getattr(node, "lineno", 0), self.scope))

    def _module_check(self, node, name):
        if name in ALLOWED_SUBMODULES:
            return
        root = name.split(".")[0]
        if root in FORBIDDEN_ROOTS:
            self.add(node, FORBIDDEN_ROOTS[root], f"imports {name}")
        elif forbidden_prefix(name):
            self.add(node, forbidden_prefix(name), f"imports {name} (torch internals: the op audit's blind side)")
        elif root in self.extra:
            self.add(node, T10, f"imports {name}, which this assignment does not allow")

    # -- scopes -------------------------------------------------------------------------------------------
    def _top(self, node):
        if node.name in DUNDER and not isinstance(node, ast.ClassDef):
            self.add(node, DUNDER[node.name], f"defines {node.name} (a hook that runs code when the object is "
                                              "read, copied or pickled)")
        outer = self.scope
        if outer is None:
            self.scope = node.name
        body = getattr(node, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            self.docstrings.add(id(body[0].value))
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                txt = ast.unparse(b)
                if txt.endswith("ndarray") or txt.endswith(".Tensor") or txt == "Tensor":
                    self.add(node, T14, f"class {node.name} subclasses {txt} (outputs must be plain arrays)")
        self.generic_visit(node)
        self.scope = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _top

    def visit_Module(self, node):
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            self.docstrings.add(id(node.body[0].value))
        self.generic_visit(node)

    # -- imports ------------------------------------------------------------------------------------------
    def visit_Import(self, node):
        for a in node.names:
            self._module_check(node, a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        if node.level:
            self.add(node, T10, "relative import (a submission is a single module)")
        for a in node.names:
            full = f"{mod}.{a.name}" if mod else a.name
            if full in ALLOWED_SUBMODULES:
                continue
            self._module_check(node, mod if mod != "autograder" else full)
            if a.name == "*":
                continue
            self.aliases[a.asname or a.name] = full
            self._attr_check(node, a.name, mod)
        self.generic_visit(node)

    # -- attributes and names -----------------------------------------------------------------------------
    def _full(self, node):
        """Dotted name of an attribute chain with its root resolved through import aliases, or None."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            root = self.aliases.get(node.id)
            if root is None:
                return None
            return ".".join([root] + parts[::-1])
        return None

    def _attr_check(self, node, attr, owner_module):
        low = attr.lower()
        for part in FORBIDDEN_ATTR_PARTS:
            if part.lower() in low:
                self.add(node, T10, f"uses {owner_module + '.' if owner_module else '.'}{attr} (a library "
                                      "implementation of what you must write)")
                return
        if attr in DUNDER:
            self.add(node, DUNDER[attr], f"uses {attr}")
        if owner_module and forbidden_prefix(f"{owner_module}.{attr}") and not forbidden_prefix(owner_module):
            self.add(node, forbidden_prefix(f"{owner_module}.{attr}"), f"uses {owner_module}.{attr} (torch "
                                                                       "internals: the op audit's blind side)")
        if owner_module:
            table = MODULE_ATTRS.get(owner_module, {})
            if attr in table:
                self.add(node, table[attr], f"uses {owner_module}.{attr}")
            elif owner_module == "os" and attr.startswith(OS_PREFIXES):
                self.add(node, T17, f"uses os.{attr}")

    def visit_Attribute(self, node):
        full = self._full(node.value)
        self._attr_check(node, node.attr, full or "")
        self.generic_visit(node)

    def visit_Name(self, node):
        full = self.aliases.get(node.id)
        if full and "." in full:
            mod, _, attr = full.rpartition(".")
            if attr in MODULE_ATTRS.get(mod, {}):
                self.add(node, MODULE_ATTRS[mod][attr], f"uses {full}")
        if node.id == "__builtins__":
            self.add(node, T3, "uses __builtins__")
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Name):
            if f.id == "super" and len(node.args) == 2 and ast.unparse(node.args[0]).endswith("Tensor"):
                self.add(node, T3, "super(torch.Tensor, ...) reaches tensor methods past the grader's op audit")
            if f.id in BUILTIN_CALLS and f.id not in self.aliases:
                self.add(node, BUILTIN_CALLS[f.id], f"calls {f.id}()")
            if f.id in GETATTR_LIKE and len(node.args) >= 2:
                name = node.args[1]
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    self.add(node, T10, f"{f.id}() with a computed attribute name")
                else:
                    target = self._full(node.args[0]) if isinstance(node.args[0], (ast.Name, ast.Attribute)) else None
                    self._attr_check(node, name.value, target or "")
                    if f.id in ("setattr", "delattr") and target and _protected(target):
                        self.add(node, T15 if name.value in TIMER_ATTRS else T3,
                                 f"{f.id}() on {target} (monkeypatching)")
        self.generic_visit(node)

    # -- monkeypatching -----------------------------------------------------------------------------------
    def _assign_target(self, t):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._assign_target(e)
        elif isinstance(t, ast.Attribute):
            full = self._full(t.value)
            if full and _protected(full):
                self.add(t, T15 if t.attr in TIMER_ATTRS else T3,
                         f"assigns {full}.{t.attr} (monkeypatching a library)")

    def visit_Assign(self, node):
        for t in node.targets:
            self._assign_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._assign_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for t in node.targets:
            self._assign_target(t)
        self.generic_visit(node)

    def visit_Global(self, node):
        self.generic_visit(node)

    # -- strings ------------------------------------------------------------------------------------------
    def visit_Constant(self, node):
        if isinstance(node.value, str) and id(node) not in self.docstrings:
            s = node.value
            if s in EXACT_STRINGS or s.startswith("reference."):
                self.add(node, EXACT_STRINGS.get(s, T10), f"string {s!r} (a name used to reach a module dynamically)")
            else:
                for part in SUSPICIOUS_STRINGS:
                    if part in s:
                        self.add(node, T10 if part not in ("/autograder", "results.json") else T1,
                                 f"string containing {part!r}")
                        break
        self.generic_visit(node)


def _protected(full: str) -> bool:
    return any(full == m or full.startswith(m + ".") for m in PROTECTED_MODULES)


def _refs(node) -> set:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            pass
    return out


def scan(cells, graded_names, extra_forbidden=()):
    """Return ``(findings, attribution)``: attribution maps finding index -> set of graded names (all if
    module level). Cells that do not parse are skipped here (they fail when run)."""
    aliases, findings, defs = {}, [], {}
    for cell in cells:
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        v = _Scan(cell.index, extra_forbidden, aliases)
        v.visit(tree)
        findings += v.findings
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs[node.name] = _refs(node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        defs.setdefault(t.id, set()).update(_refs(node.value))
    reach = {}
    for g in graded_names:
        seen, todo = set(), [g]
        while todo:
            n = todo.pop()
            if n in seen or n not in defs:
                continue
            seen.add(n)
            todo += list(defs[n] - seen)
        reach[g] = seen
    attribution = []
    for f in findings:
        if f.scope is None:
            attribution.append(set(graded_names))
        else:
            attribution.append({g for g in graded_names if f.scope in reach[g]})
    return findings, attribution
