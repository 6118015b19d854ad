"""Judging a scripted ``BlockAllocator`` run (a5): the rules of allocate/free/incref/refcount/num_free, followed
on the block ids the submission itself handed out. Kept apart from ``oracles`` (the float64 reference maths)
so that a student release can judge the allocator without shipping any reference implementation.
"""
from __future__ import annotations


def check_allocator(num_blocks: int, ops: list, results: list):
    """Judge a BlockAllocator script run against a model that follows the student's own block ids.

    ``ops`` as built by the spec (see ``autograder.runner.run_script``), ``results`` what the submission did:
    ``{"ok": bool, "value": int|None, "exc": name}`` per op. Returns ``(passed, message)``.
    """
    if not isinstance(results, list) or len(results) != len(ops):
        return False, "the script did not run to the end"
    ref = {}                       # block id -> reference count, as handed out by the submission
    ids = []                       # result of each op (block id for allocate ops)
    for i, (op, res) in enumerate(zip(ops, results)):
        name = op[0]
        where = f"step {i} {name}{tuple(op[1:]) if len(op) > 1 else '()'}"
        ok, val = bool(res.get("ok")), res.get("value")
        nfree = num_blocks - sum(1 for c in ref.values() if c > 0)

        def blk(j):
            return ids[j] if isinstance(j, int) else None
        if name == "new":
            if not ok:
                return False, f"{where}: BlockAllocator({num_blocks}) raised {res.get('exc')}"
            ids.append(None)
            continue
        if name == "allocate":
            if nfree == 0:
                if ok:
                    return False, f"{where}: allocate() with no free block must raise, it returned {val!r}"
                ids.append(None)
                continue
            if not ok:
                return False, f"{where}: allocate() raised {res.get('exc')} with {nfree} free block(s)"
            if not isinstance(val, int) or not 0 <= val < num_blocks:
                return False, f"{where}: allocate() must return an int block index in [0, {num_blocks}), got {val!r}"
            if ref.get(val, 0) > 0:
                return False, f"{where}: allocate() returned block {val}, which is still in use"
            ref[val] = 1
            ids.append(val)
            continue
        ids.append(None)
        if name == "num_free":
            if not ok or val != nfree:
                got = val if ok else f"an exception ({res.get('exc')})"
                return False, f"{where}: num_free should be {nfree}, got {got}"
            continue
        b = op[1] if name in ("free_raw", "incref_raw") else blk(op[1])
        count = ref.get(b, 0) if isinstance(b, int) and 0 <= b < num_blocks else None
        if name in ("free", "free_raw"):
            if count:
                if not ok:
                    return False, f"{where}: free({b}) of an allocated block raised {res.get('exc')}"
                ref[b] = count - 1
            elif ok:
                return False, f"{where}: free({b}) of a {'free' if count == 0 else 'non-existent'} block must raise"
        elif name in ("incref", "incref_raw"):
            if count:
                if not ok:
                    return False, f"{where}: incref({b}) of an allocated block raised {res.get('exc')}"
                ref[b] = count + 1
            elif ok:
                return False, f"{where}: incref({b}) of a {'free' if count == 0 else 'non-existent'} block must raise"
        elif name == "refcount":
            if not ok or val != (count or 0):
                got = val if ok else f"an exception ({res.get('exc')})"
                return False, f"{where}: refcount({b}) should be {count or 0}, got {got}"
        else:
            return False, f"{where}: unknown op"
    return True, ""
