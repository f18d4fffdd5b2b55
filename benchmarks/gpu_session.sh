#!/usr/bin/env bash
# One device call: environment, tile tuning, the fa sweep benchmark, the GPU test suite.
# Usage on the GPU machine: bash benchmarks/gpu_session.sh [tune] [bench] [tests]
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vflash-out}
mkdir -p "$OUT"
python3 -m vflash env | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$OUT/env.txt"
for step in "$@"; do
  case $step in
    tune) python3 benchmarks/tune.py 2>&1 | tee "$OUT/tune.txt" ;;
    bench) python3 -m vflash bench --sweep fa --dtype fp16 --out "$OUT/fa_fp16.csv" 2>&1 | tee "$OUT/bench.txt" ;;
    bench16bf) python3 -m vflash bench --sweep fa --dtype fp16,bf16 --out "$OUT/fa.csv" 2>&1 | tee "$OUT/bench.txt" ;;
    tests) VFLASH_TEST_DEVICE=cuda timeout 420 python3 -m pytest -q -x -p no:cacheprovider \
             tests/test_gpu.py tests/test_attention.py 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -25 ;;
    check) python3 -m vflash check --log "$OUT/check_gpu.log" | tail -5 ;;
  esac
done
