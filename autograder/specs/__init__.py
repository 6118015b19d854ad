"""Assignment specs (data): one module per assignment, ``ASSIGNMENT`` (a ``Spec``) in each. Look-ups by id or short name."""
from __future__ import annotations

from importlib import import_module

ASSIGNMENTS = ("a1_attention", "a2_flash_numpy", "a3_triton", "a3b_triton_backward", "a4_decoding", "a5_paged",
               "a6_ring", "a7_gluon")
SHORT = {aid.split("_")[0]: aid for aid in ASSIGNMENTS}


def resolve(name: str) -> str:
    """``"a1"``, ``"a1_attention"`` -> ``"a1_attention"``; ValueError naming the choices otherwise."""
    if name in ASSIGNMENTS:
        return name
    if name in SHORT:
        return SHORT[name]
    raise ValueError(f"unknown assignment {name!r}; expected one of {', '.join(ASSIGNMENTS)}")


def load(name: str):
    return import_module(f"{__name__}.{resolve(name)}").ASSIGNMENT


def find_task(task_id: str):
    """``"a2.flash_attention_forward"`` -> (spec, task); a warm-up task (``Spec.warmups``) is found too."""
    if not isinstance(task_id, str) or "." not in task_id:
        raise ValueError(f"task_id must look like 'a1.attention', got {task_id!r}")
    short = task_id.split(".", 1)[0]
    spec = load(short)
    known = {**spec.tasks, **spec.warmups}
    if task_id not in known:
        raise ValueError(f"unknown task {task_id!r}; {spec.id} has {', '.join(known)}")
    return spec, known[task_id]
