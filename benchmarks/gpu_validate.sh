#!/usr/bin/env bash
# One GPU call that validates what CI cannot: every Triton test on CUDA, the assignments' Triton solutions
# compiled and graded by the autograder on the GPU (speed points included), and a stub notebook graded to 0.
# Usage on the device machine: OUT=/some/dir bash benchmarks/gpu_validate.sh [tests|grade|fp8|all]
# (parts that each fit one 10-minute device call: `audit` = the op-audit zoo on CUDA (AUDIT_ONLY="a4 a5"
# picks assignments), `tests` = every Triton test compiled, `grade` = the
# autograder on CUDA (a7 included), `a7` = a7's grading alone, `fp8` = a3's optional FP8 part alone: its tests compiled, the solution's FP8 grade with
# the speed ratio against the bf16 reference forward, the two FP8 mutants; `policy` = the host policy's zoo on
# CUDA (POLICY_ONLY="a4" picks assignments; SELFTEST_JOBS gradings at a time in `audit` and `policy`, default 4); default `all`). In `grade`, GRADE_ASSIGNMENTS lists the assignments
# graded (default a3_triton a3b_triton_backward a4_decoding a5_paged) and GRADE_A7=0 leaves a7 out.
set -u
STAGES=" ${*:-tests fp8 grade slow holes audit policy} "
has() { [[ "$STAGES" == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_validate}; mkdir -p "$OUT"
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
if has tests; then
    NPROC=""; python3 -c "import xdist" 2>/dev/null && NPROC="-n 8"  # parallel compilation where xdist exists
    timeout 420 python3 -m pytest -q -p no:cacheprovider $NPROC tests/test_triton_*.py tests/test_a3_fp8_bonus.py tests/test_spec_api.py \
        2>&1 | tail -15 | tee "$OUT/gpu_pytest.log"
    echo "[gpu_validate] pytest done at ${SECONDS}s"
fi
if has fp8; then
    # a3's FP8 bonus: compiled tests, then the solution (accuracy + speed, or "not run: needs sm_90" before
    # Hopper) and the two mutants, which must lose the FP8 accuracy tests (no V scale: all three FP8 tests)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_a3_fp8_bonus.py 2>&1 | tail -4 \
        | tee "$OUT/fp8_pytest.log"
    for sub in solution w_fp8_no_v_scale w_fp8_unscaled_cast; do
        if [ $sub = solution ]; then path=assignments/a3_triton/a3_triton_solution.py; else
            path=$(python3 -c "from pathlib import Path; from autograder.selftest import materialise_mutant; \
print(materialise_mutant(Path('autograder/submissions/a3_triton/wrong/$sub.mutant.json')))"); fi
        timeout 200 python3 -m autograder grade a3_triton "$path" --device cuda --test "(FP8)" \
            --json "$OUT/grade_a3_fp8_$sub.json" 2>&1 | tail -6
        python3 -c "import json; r = json.load(open('$OUT/grade_a3_fp8_$sub.json')); \
print('[gpu_validate] fp8 $sub:', [(t['name'].split(': ')[-1][:28], t['score'], t.get('ratio')) for t in r['tests']])" \
            | tee -a "$OUT/fp8_grades.log"
    done
    echo "[gpu_validate] fp8 done at ${SECONDS}s"
fi
if has grade; then
for a in ${GRADE_ASSIGNMENTS:-a3_triton a3b_triton_backward a4_decoding a5_paged}; do   # GRADE_ASSIGNMENTS: another order or subset
    t0=$SECONDS
    timeout 240 python3 -m autograder grade "$a" "assignments/$a/${a}_solution.py" --device cuda \
        --json "$OUT/grade_${a}_solution.json" 2>&1 | tail -25
    echo "[gpu_validate] grade $a solution: $((SECONDS - t0)) s wall"
done
timeout 120 python3 -m autograder grade a3_triton assignments/a3_triton/a3_triton.ipynb --device cuda \
    --json "$OUT/grade_a3_triton_stub.json" 2>&1 | tail -4
echo "[gpu_validate] grade done at ${SECONDS}s"
fi
if has a7 || { has grade && [ "${GRADE_A7:-1}" != 0 ]; }; then   # GRADE_A7=0: `grade` without a7
# a7 (optional, Hopper; `a7` runs this part alone): the solution (the CPU compile checks in a sandboxed compile
# child, judged by the parent, + GPU correctness and speed), then the wrong-phase mutant's GPU correctness test:
# its kernel hangs, and the case time limit must end it (a fail, not a stuck grader)
t0=$SECONDS
timeout 500 python3 -m autograder grade a7_gluon assignments/a7_gluon/a7_gluon_solution.py --device cuda \
    --json "$OUT/grade_a7_gluon_solution.json" 2>&1 | tail -8
echo "[gpu_validate] grade a7_gluon solution: $((SECONDS - t0)) s wall"
path=$(python3 -c "from pathlib import Path; from autograder.selftest import materialise_mutant; \
print(materialise_mutant(Path('autograder/submissions/a7_gluon/wrong/w_turn_wrong_phase.mutant.json')))")
t0=$SECONDS
timeout 400 python3 -m autograder grade a7_gluon "$path" --device cuda \
    --json "$OUT/grade_a7_gluon_wrong_phase.json" 2>&1 | tail -6
echo "[gpu_validate] grade a7_gluon wrong phase (loses the CPU phase check; on an H100 the kernel runs unordered, no hang): $((SECONDS - t0)) s wall"
fi
if has slow; then
# GPU-only submissions graded as the selftest expects on CUDA: the side-stream cheat (T13) and the slow but
# correct submissions, which must lose speed points (s_one_split in a4/a5, a4's s_split_thrice, s_tiny_tiles in a3;
# a3b has none)
# (the a3 one last and on its own: a full a3 grading is the longest step)
timeout 240 python3 -m autograder selftest --only a3 a4 a5 --match t13_cuda s_one_split s_split_thrice \
    --device cuda -j 1 --out /tmp/selftest_gpu 2>&1 | tr '\r' '\n' | grep -v 'sub/s' | tail -6 \
    | tee "$OUT/selftest_gpu.log"
echo "[gpu_validate] GPU selftest (T13, slow a4/a5) done at ${SECONDS}s"
timeout 200 python3 -m autograder selftest --only a3 --match s_tiny_tiles \
    --device cuda -j 1 --out /tmp/selftest_gpu_a3 2>&1 | tr '\r' '\n' | grep -v 'sub/s' | tail -3 \
    | tee -a "$OUT/selftest_gpu.log"
fi
if has holes; then
# Grader holes on the GPU: a token Triton launch beside a torch decode loses the Triton points, a process
# forked after CUDA init (and the CPU escape cheats) is refused and killed, the checkout is hidden from the
# child. The selftest fails if any process of a graded submission survives; pgrep double-checks.
timeout 300 python3 -m autograder selftest --only a1 a4 --device cuda -j 1 --out /tmp/selftest_gpu_holes \
    --match t10_token_triton t17_fork_after_cuda t17_posix_fork t17_library_spawn t02_ t10_reference_via \
    2>&1 | tr '\r' '\n' | grep -v 'sub/s' | tail -12 | tee "$OUT/selftest_gpu_holes.log"
python3 -c "import json; r = json.load(open('/tmp/selftest_gpu_holes/a4_decoding__cheat__t10_token_triton_launch.json')); \
print('[gpu_validate] sandbox:', r['sandbox'].get('checkout'), '|', r['sandbox'].get('processes'))" 2>&1 \
    | tee -a "$OUT/selftest_gpu_holes.log"
sleep 1; pgrep -af autograder-escape-test && echo "[gpu_validate] SURVIVING SUBMISSION PROCESSES" \
    | tee -a "$OUT/selftest_gpu_holes.log"
fi
if has audit; then
# The op audit on CUDA (grader integrity): per Triton assignment, the zeros-allocating correct submission must
# score 100% (speed included, the audit on in every timed call of both children), the torch-compute +
# copy-kernel cheat and the poisoned-run detector must be zeroed with T10; w_ignores_num_splits must lose every
# flash_decode test (the split gate reads the compiled launches' grids). AUDIT_ONLY picks assignments.
for a in ${AUDIT_ONLY:-a4 a5 a3b a3}; do
    timeout 560 python3 -m autograder selftest --only $a --device cuda -j ${SELFTEST_JOBS:-4} --out /tmp/selftest_gpu_audit_$a \
        --match own_zeros_alloc t10_torch_compute t19_poison w_ignores_num_splits w_fp8_no_float8 2>&1 \
        | tr '\r' '\n' | grep -v 'sub/s' | tail -8 | tee -a "$OUT/selftest_gpu_audit.log"
    cp /tmp/selftest_gpu_audit_$a/*.json "$OUT/" 2>/dev/null
    echo "[gpu_validate] audit $a done at ${SECONDS}s" | tee -a "$OUT/selftest_gpu_audit.log"
done
fi
if has policy; then
# The host policy on CUDA (notes/host_policy.md): the unusual correct submissions and the solution score 100% with
# their speed points (the timed reps run the code as written, CellCompiler.plain); each policy cheat is zeroed
# with T10 (compiled kernels: the duck-typed pointer reaches the launch check, not the interpreter).
for a in ${POLICY_ONLY:-a4 a5 a3b}; do
    timeout 560 python3 -m autograder selftest --only $a --device cuda -j ${SELFTEST_JOBS:-4} --out /tmp/selftest_gpu_policy_$a \
        --match "solution source" own_alloc_variants own_index_assign t10_no_dispatch t10_pop_mode t10_exclude \
        t10_torch_on_thread t10_duck t10_grid_clone t10_saved t10_numpy_view t10_harness 2>&1 \
        | tr '\r' '\n' | grep -v 'sub/s' | tail -16 | tee -a "$OUT/selftest_gpu_policy.log"
    cp /tmp/selftest_gpu_policy_$a/*.json "$OUT/" 2>/dev/null
    echo "[gpu_validate] policy $a done at ${SECONDS}s" | tee -a "$OUT/selftest_gpu_policy.log"
done
fi
echo "[gpu_validate] total ${SECONDS}s"
