"""CHEAT T2: look for expected outputs / hidden cases (files, the parent's memory, the grader's specs)."""
import os
import numpy as np

FOUND = {}
for root in ("/autograder", "..", os.environ.get("HOME", "."), "/tmp"):
    try:
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f.endswith((".npy", ".json")):
                    FOUND[f] = os.path.join(dirpath, f)
    except Exception:
        pass
try:
    with open(f"/proc/{os.getppid()}/mem", "rb") as f:
        FOUND["mem"] = f.read(16)
except Exception:
    pass
try:
    from autograder.specs import a1_attention as HIDDEN    # the cases are generated there, from a secret seed
except Exception:
    HIDDEN = None


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    o = np.zeros_like(q)
    return (o, np.zeros(q.shape[:-1], np.float32)) if return_lse else o


def safe_softmax(x, axis=-1):
    return np.full_like(x, 1.0 / x.shape[axis])


online_softmax = safe_softmax


def merge_states(o_a, lse_a, o_b, lse_b):
    return o_a, lse_a
