#!/usr/bin/env bash
# H100 speed calibration of the a4/a5 decode speed tests (the a4 solution graded 1.31x there once), then the
# compiled Triton attention/FP8 tests. Usage on the device machine: OUT=/some/dir bash benchmarks/grader/gpu_calibrate_h100.sh
set -u; export PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 300 python3 -m benchmarks.grader.calibrate_speed --only a4 a5 --gradings 2 --repeats 2 --reps 8 --budget 200 \
    --out "$OUT/h100-speed-calibration.json" 2>&1 | grep -v 'sub/s' | tail -40
echo "[cal] calibration done ${SECONDS}s"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_flash.py tests/test_triton_hopper.py \
    2>&1 | tail -8 | tee "$OUT/pytest_flash_hopper.log"
echo "[cal] total ${SECONDS}s"
