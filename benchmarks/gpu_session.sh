#!/usr/bin/env bash
# One device call: environment, GPU tests, kernel benchmarks. Run from the repository root on
# the GPU machine:  source .gpu/activate.sh && bash benchmarks/gpu_session.sh [steps...]
# Steps: doctor tests kernel confirm peers launch b2b decomp energy timings tuning cost cache suite
# (default: doctor tests kernel launch decomp). Results and logs go to $OUT. peers needs QuACK
# importable (bench_peers.py says how).
set -uo pipefail
OUT=${OUT:-/tmp/gemmtune-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
steps=${*:-doctor tests kernel launch decomp}
for step in $steps; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    doctor) python3 -m gemmtune doctor 2>&1 | tee "$OUT/doctor.txt" ;;
    tests) timeout 570 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -15 ;;
    kernel) timeout 570 python3 benchmarks/bench_kernel.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench-kernel.txt" | grep -v "^nvdisasm" ;;
    confirm) timeout 560 python3 benchmarks/bench_confirm.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench-confirm.txt" | grep -v "^nvdisasm" ;;
    peers) timeout 560 python3 benchmarks/bench_peers.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench-peers.txt" | grep -v "^nvdisasm\|^Autotuning kernel\|autotuning for\| -> " ;;
    launch) timeout 120 python3 benchmarks/bench_launch.py --out-dir "$OUT" 2>&1 | tail -5 ;;
    b2b) timeout 300 python3 benchmarks/bench_back_to_back.py --out-dir "$OUT" 2>&1 | grep -v "^nvdisasm" ;;
    timings) timeout 560 python3 benchmarks/collect_timings.py --out-dir "$OUT" 2>&1 | tee "$OUT/collect-timings.txt" | grep -v "^nvdisasm" ;;
    tuning) timeout 560 python3 benchmarks/bench_tuning.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench-tuning.txt" | grep -v "^nvdisasm" ;;
    cost) timeout 590 python3 benchmarks/bench_tuning_cost.py --out-dir "$OUT" ${COST_ARGS:-} 2>&1 | tee "$OUT/bench-tuning-cost.txt" | grep -v "^nvdisasm" ;;
    cache) timeout 560 python3 benchmarks/bench_cache.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench-cache.txt" | grep -v "^nvdisasm" ;;
    suite) GEMMTUNE_CACHE_DIR=$(mktemp -d) timeout 560 python3 -m gemmtune bench --json > "$OUT/tuned-gemm-suite.json" 2> "$OUT/tuned-gemm-suite.err"; tail -3 "$OUT/tuned-gemm-suite.err" ;;
    energy) timeout 300 python3 benchmarks/bench_energy.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench-energy.txt" | grep -v "^nvdisasm" ;;
    decomp) timeout 400 python3 benchmarks/bench_decomposition.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench-decomposition.txt" | grep -v "^nvdisasm" ;;
    *) echo "unknown step $step" ;;
  esac
done
