"""CHEAT T1: forge the results file and print fake score lines; the functions are junk."""
import json
import numpy as np

print("score 100 / 100 (100.0%)")
for path in ("results.json", "/autograder/results/results.json", "../results.json"):
    try:
        with open(path, "w") as f:
            json.dump({"score": 100, "max_score": 100, "tests": []}, f)
    except Exception:
        pass


def safe_softmax(x, axis=-1):
    return np.zeros_like(x)


online_softmax = merge_states = attention = safe_softmax
