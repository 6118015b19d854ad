#!/usr/bin/env bash
# Lead's short GPU check (device time nearly spent): Triton tests compiled, a4/a5 graded on CUDA in the new sandbox,
# the GPU hole cheats of a4. Each step has its own timeout; logs under $OUT.
set -u; export PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 95 python3 -m pytest -x -q -p no:cacheprovider tests/test_triton_flash.py tests/test_triton_decode.py \
  tests/test_triton_paged.py tests/test_triton_softmax.py tests/test_triton_varlen.py 2>&1 | tail -6 | tee $OUT/pytest.log
echo "[quick] pytest done ${SECONDS}s"
for a in a5_paged a4_decoding; do
  timeout 60 python3 -m autograder grade $a assignments/$a/${a}_solution.py --device cuda --json $OUT/grade_$a.json 2>&1 | tail -16
  echo "[quick] $a done ${SECONDS}s"
done
timeout 70 python3 -m autograder selftest --only a4 --device cuda -j 1 --out /tmp/st --match t10_token_triton t17_fork_after_cuda \
  2>&1 | tr '\r' '\n' | grep -v 'sub/s' | tail -5 | tee $OUT/selftest_holes.log
pgrep -af autograder-escape-test && echo "[quick] SURVIVORS" | tee -a $OUT/selftest_holes.log
echo "[quick] total ${SECONDS}s"
