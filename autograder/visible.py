"""The visible cases that ``check()`` runs, from the specs (this repository) or from files (a student release).

In the repository a visible case is built from its parameters with fresh random values and judged against the
grader's float64 oracle. A student release ships neither the specs' oracles nor any reference code, so
``export`` writes every visible case once, inputs and expected outputs included, to
``autograder/visible/<assignment>.json`` + ``.npz``; ``check()`` reads those when the folder exists.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .runner import call_to_wire
from .specs._base import Call, Out

DATA = Path(__file__).resolve().parent / "visible"


@dataclass
class Case:
    test: str             # the test's full name, e.g. "a1.attention: causal (Nq == Nk)"
    label: str            # the row label check() prints
    call: Call            # outs, expected outputs, mode, script, arg_names (what evaluate() reads)
    header: dict          # the call as runner.execute() takes it
    arrays: dict
    memory_limit: int | None
    gpu: bool
    # a compile-only check (``Test.parent_check``: a7) run on the function's namespace (``local_checks``), no call
    parent: object = None
    # as the grader (``Grader.not_run_here``): a ``gpu_only`` case does not run on a CPU, and on a GPU it needs
    # compute capability ``needs`` ((9, 0): Hopper); check() says "not run: needs sm_90" where it cannot run
    needs: tuple | None = None
    gpu_only: bool = False
    params: dict | None = None     # the case's parameters (a crash's diagnosis names them; None in a release)


def released() -> bool:
    return DATA.is_dir()


def framework(task_id: str) -> str:
    if released():
        return _index()["tasks"][task_id]["framework"]
    from . import specs
    return specs.find_task(task_id)[1].framework


def tasks(assignment: str) -> dict:
    """``{task_id: function name}`` of the graded functions of ``assignment`` (an id or a short id) that have
    visible cases, in the spec's order (an ungraded warm-up is checked in the notebook only, not here)."""
    if released():
        from .specs import resolve
        aid = resolve(assignment)
        return {tid: info.get("name", tid.split(".", 1)[1]) for tid, info in _index()["tasks"].items()
                if info["assignment"] == aid and not info.get("warmup")}
    from . import specs
    spec = specs.load(assignment)
    return {tid: t.name for tid, t in spec.tasks.items()
            if any(x.visible for x in spec.tests_of(tid) if x.kind != "speed")}


def cases(task_id: str, rng):
    """The visible cases of ``task_id`` in order (speed tests have none)."""
    if released():
        yield from _read(task_id)
        return
    from . import specs
    spec, task = specs.find_task(task_id)
    for test in spec.tests_of(task_id):
        label = test.name.split(": ", 1)[-1]
        if test.parent_check is not None:
            yield Case(test.name, label, None, {"mode": "parent"}, {}, None, False, parent=test.parent_check)
            continue
        needs = tuple(test.min_capability) if test.min_capability else None
        if test.kind == "speed":
            if needs and test.gpu_only:          # a row that says where it runs (no visible case: never run)
                yield Case(test.name, label, None, {"mode": "needs"}, {}, None, True, needs=needs, gpu_only=True)
            continue
        for i, params in enumerate(test.visible):
            call = task.build(params, rng)
            if call.mode != "script":
                call.expected = task.oracle(call)
            header, arrays = call_to_wire(call)
            label = test.name.split(": ", 1)[-1] + (f" #{i + 1}" if len(test.visible) > 1 else "")
            yield Case(test.name, label, call, header, arrays,
                       test.memory_limit(params) if test.memory_limit else None, bool(params.get("gpu")),
                       needs=needs, gpu_only=test.gpu_only, params=dict(params))


# -- student release: files -----------------------------------------------------------------------------------
def export(folder, seed=0, assignments=None) -> list:
    """Write the visible cases of ``assignments`` (default: every assignment) to ``folder/<aid>.json`` + ``.npz``
    (and ``index.json``)."""
    from . import specs
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index = {"tasks": {}}
    written = []
    for aid in (specs.ASSIGNMENTS if assignments is None else assignments):
        spec = specs.load(aid)
        rng = np.random.default_rng(seed)
        rows, blobs = [], {}
        for task_id, task in {**spec.tasks, **spec.warmups}.items():
            index["tasks"][task_id] = {"assignment": aid, "framework": task.framework, "name": task.name,
                                       **({"warmup": True} if task_id in spec.warmups else {})}
            for c in cases(task_id, rng):
                if c.call is None:               # compile-only checks and "needs sm_90" rows: not stored
                    continue
                n = len(rows)
                for k, a in c.arrays.items():
                    blobs[f"{n}.in.{k}"] = a
                for j, e in enumerate(c.call.expected or []):
                    blobs[f"{n}.out.{j}"] = np.asarray(e)
                rows.append({"task": task_id, "test": c.test, "label": c.label, "header": c.header,
                             "inputs": sorted(c.arrays), "n_expected": len(c.call.expected or []),
                             "outs": [[o.name, list(o.dtypes), o.tol, o.framework] for o in c.call.outs],
                             "arg_names": c.call.arg_names, "memory_limit": c.memory_limit,
                             "block_limit": c.call.block_limit,
                             "gpu": c.gpu})
        (folder / f"{aid}.json").write_text(json.dumps(rows, indent=0, default=_plain))
        np.savez_compressed(folder / f"{aid}.npz", **blobs)
        written += [folder / f"{aid}.json", folder / f"{aid}.npz"]
    (folder / "index.json").write_text(json.dumps(index, indent=1))
    return written + [folder / "index.json"]


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"cannot store {type(x).__name__} in a visible case")


def _index():
    return json.loads((DATA / "index.json").read_text())


def _read(task_id):
    info = _index()["tasks"].get(task_id)
    if info is None:
        raise ValueError(f"unknown task {task_id!r}; this release has {', '.join(_index()['tasks'])}")
    rows = json.loads((DATA / f"{info['assignment']}.json").read_text())
    with np.load(DATA / f"{info['assignment']}.npz", allow_pickle=False) as blobs:
        for n, r in enumerate(rows):
            if r["task"] != task_id:
                continue
            call = Call([], {}, [Out(o[0], tuple(o[1]), o[2], o[3]) for o in r["outs"]], mode=r["header"]["mode"],
                        script=r["header"].get("script"), arg_names=r["arg_names"])
            call.expected = [blobs[f"{n}.out.{j}"] for j in range(r["n_expected"])] or None
            call.block_limit = r.get("block_limit")
            yield Case(r["test"], r["label"], call, r["header"], {k: blobs[f"{n}.in.{k}"] for k in r["inputs"]},
                       r["memory_limit"], r["gpu"])
