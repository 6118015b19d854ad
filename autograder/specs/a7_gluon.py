"""Spec of the optional assignment a7_gluon: the ping-pong turn of a warp-specialised Gluon FA3 forward (lecture 6
section 10; FA3, Shah et al. 2024, section 3.1).

The student writes the kernel's synchronisation: the ring's parities ``_ready_phase`` and ``_empty_phase``, the
ping-pong turn ``_turn_phase``, ``_take_turn``, ``_give_turn``, and the overlapped score wait ``_wait_scores``;
the graded function is the given host
wrapper ``flash_attention_forward_pingpong(q, k, v, causal=False, scale=None) -> (o, lse)`` that launches their
kernel. Out of 100 on a Hopper GPU (compute capability 9.0), 60 elsewhere:

* CPU, from the grading parent (``Test.parent_check``, ``autograder/gluon_compile.py``; the kernel never runs, so
  a wrong phase cannot hang the grader): the parities evaluated as plain Python, the producer and both
  consumers played through the mbarrier model with them, then each value against the model's (30); the kernel
  compiled for sm_90a with and without the turns: it compiles, nothing spills, exactly one more mbarrier wait
  and arrival per matmul round and consumer (+6 / +6), wgmma matmuls, the score wait leaves P V in flight (30);
* Hopper GPU only (``min_capability=(9, 0)``; "not run: needs sm_90" elsewhere): correctness against float64
  (ragged N, causal Nq != Nk, GQA, d = 64 and 128, bf16 and fp16; 25) and speed against the course's persistent
  ping-pong forward ``reference.triton.flash_attention_forward_gluon`` (15; full points up to 1.5x its time: the
  student's kernel is the one-CTA-per-tile ablation, which the lecture measures a few percent slower). A hang
  on the GPU (e.g. a missing arrive that slipped through) hits the case time limit and fails the test; a wrong
  phase does not hang on an H100 (measured: the wait returns at once, the matmuls run unordered, values stay
  right), so only the phase check sees it.
"""
from __future__ import annotations

from ._attn import build_triton_forward, oracle_triton_forward, tiled_qk, triton_case
from ._base import Spec, Task, Test
from ..gluon_compile import compile_check, phase_check

SHORT = "a7"
TID = "a7.flash_attention_forward_pingpong"
FORBIDDEN = ("scipy", "jax", "tensorflow", "flash_attn", "xformers")
HOPPER = (9, 0)
MAX_TILE = 128


def _gpu(rng, **kw):
    d = int(rng.choice([64, 128]))
    return triton_case(rng, dtype=str(rng.choice(["bfloat16", "float16"])), d=d, **kw)


def _hidden(r):
    return [_gpu(r), _gpu(r, nq=int(r.integers(300, 700)), nk=int(r.integers(300, 700))),
            _gpu(r, causal=True, nq=int(r.integers(20, 200)), nk=int(r.integers(300, 600))),
            _gpu(r, causal=True, nq=int(r.integers(300, 600)), nk=int(r.integers(20, 200))),
            _gpu(r, hq=4, hkv=2, causal=True, nq=int(r.integers(129, 500)))]


GPU_SPEED = [dict(B=4, Hq=16, Hkv=16, Nq=4096, Nk=4096, d=128, dtype="bfloat16", timing_only=True),
             dict(B=4, Hq=16, Hkv=16, Nq=4096, Nk=4096, d=128, dtype="bfloat16", causal=True, timing_only=True)]

TESTS = [
    Test(f"{TID}: parities and turn order (CPU, the kernel never runs)", TID, 30, parent_check=phase_check),
    Test(f"{TID}: compiles for sm_90a, no spills, one turn wait + arrive per round, overlapped score wait (CPU)",
         TID, 30,
         parent_check=compile_check),
    Test(f"{TID}: correctness vs float64 (Hopper GPU)", TID, 25,
         [dict(B=1, Hq=2, Hkv=2, Nq=200, Nk=200, d=64, dtype="bfloat16", causal=True)], _hidden,
         gpu_only=True, min_capability=HOPPER),
    Test(f"{TID}: speed vs the course's Gluon forward (Hopper GPU)", TID, 15, [], lambda r: GPU_SPEED,
         kind="speed", gpu_only=True, min_capability=HOPPER, speed_full=1.5, speed_zero=3.0, reps=4),
]

TASKS = {TID: Task(TID, "flash_attention_forward_pingpong", build_triton_forward, oracle_triton_forward,
                   framework="torch", reference="reference.triton:flash_attention_forward_gluon", case_timeout=120,
                   tiled=tiled_qk(MAX_TILE))}

ASSIGNMENT = Spec("a7_gluon", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, needs_torch=True,
                  address_space=8 << 30, rss_limit=4 << 30, load_timeout=120, total_timeout=1500,
                  parent_imports=("reference.triton.hopper._aot",))
