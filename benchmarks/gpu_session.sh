#!/usr/bin/env bash
# One device call: environment, GPU tests, benchmark suites. Run from the repository root on
# the GPU machine:  source .gpu/activate.sh && bash benchmarks/gpu_session.sh [steps...]
# Steps: doctor tests tests-kernels tests-rest public dispatch cost serving pretune kernel peers
# cache timings read-ceiling decode-chain int8-layouts placements suite
# (default: doctor tests public dispatch). `tests` runs `pytest -m gpu`; where one call may
# not run longer than 10 minutes, `tests-kernels` and `tests-rest` run its two halves
# (tests/kernels, everything else), each with its own 570 s limit. A suite step runs
# `python3 -m benchmarks SUITE` (cost: the tuning-cost suite, with $COST_ARGS; serving with
# $SERVING_ARGS; public and serving with --time-limit $SUITE_LIMIT, 480 s unless set, so that a
# step cut short keeps the rows it measured; decode-chain on the serving results file
# $CHAIN_RESULTS); suite:
# `gemmtune bench --json` on an empty cache. Results and logs go to $OUT.
set -uo pipefail
if [ ! -f benchmarks/__main__.py ]; then
  echo "run from the repository root: bash benchmarks/gpu_session.sh [steps]" >&2
  exit 2
fi
OUT=${OUT:-/tmp/gemmtune-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the plan-cache key in C (optional: without it tuned_gemm reads the key from Python)
python3 setup.py -q build_ext --inplace > "$OUT/build_ext.txt" 2>&1 ||
  echo "the _signature extension was not built (see $OUT/build_ext.txt)"
steps=${*:-doctor tests public dispatch}
for step in $steps; do  # check every name before the first step's minutes are spent
  case $step in
    doctor | tests | tests-kernels | tests-rest | public | dispatch | cost | serving | pretune | kernel | peers | cache | timings | read-ceiling | decode-chain | int8-layouts | placements | suite) ;;
    *) echo "unknown step $step (steps: doctor tests tests-kernels tests-rest public dispatch cost serving pretune kernel peers cache timings read-ceiling decode-chain int8-layouts placements suite)" >&2; exit 2 ;;
  esac
done

run_suite() {  # run_suite NAME [options]: one benchmark suite, its log in $OUT/NAME.txt
  local name=$1
  shift
  timeout 570 python3 -m benchmarks "$name" --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/$name.txt" | grep -v "^nvdisasm"
}

for step in $steps; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    doctor) python3 -m gemmtune doctor 2>&1 | tee "$OUT/doctor.txt" ;;
    tests) timeout 570 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -15 ;;
    tests-kernels) timeout 570 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels 2>&1 | tee "$OUT/pytest-gpu-kernels.txt" | tail -15 ;;
    tests-rest) timeout 570 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/kernels 2>&1 | tee "$OUT/pytest-gpu-rest.txt" | tail -15 ;;
    cost) run_suite tuning-cost ${COST_ARGS:-} ;;
    public) run_suite public --time-limit "${SUITE_LIMIT:-480}" ;;
    serving) run_suite serving --time-limit "${SUITE_LIMIT:-480}" ${SERVING_ARGS:-} ;;
    decode-chain) run_suite decode-chain --results "${CHAIN_RESULTS:?a serving results file}" ;;
    suite) GEMMTUNE_CACHE_DIR=$(mktemp -d) timeout 560 python3 -m gemmtune bench --json > "$OUT/tuned-gemm-suite.json" 2> "$OUT/tuned-gemm-suite.err"; tail -3 "$OUT/tuned-gemm-suite.err" ;;
    *) run_suite "$step" ;;
  esac
done
