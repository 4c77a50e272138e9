#!/usr/bin/env bash
# The SDK on a GPU, in one go: the card and torch, the SDK's tests with CUDA present (the tests
# marked `gpu` skip without a device), the CUDA end-to-end test of every method, and
# bench_signals.py on cuda, cuda with --amp and the CPU of the same machine.
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]        # default OUT_DIR: runs/gpu_check
#
# Needs a CUDA build of torch in the environment (FEDAUDIT_TORCH, see docs/site-guide.md).
# PYTHON picks the interpreter (default .venv/bin/python, else python3). About 2 minutes on an
# H200. Writes log.txt, the test reports (JUnit XML) and the three bench JSON files into OUT_DIR;
# the exit status is that of the first step that failed. Results: docs/performance.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-runs/gpu_check}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONUNBUFFERED=1
status=0
step() {  # step NAME COMMAND...: run, log, remember the first failure
  local name=$1 rc
  shift
  echo "=== $name: $*"
  "$@"
  rc=$?
  echo "=== $name: exit $rc"
  [ "$rc" -eq 0 ] || [ "$status" -ne 0 ] || status=$rc
}

exec > >(tee "$OUT_DIR/log.txt") 2>&1
step gpu nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
step torch "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'available', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
step sdk-tests "$PY" -m pytest -q -p no:cacheprovider -rfEs tests/client_sdk \
  --junitxml="$OUT_DIR/sdk_tests.xml"
step e2e-cuda "$PY" -m pytest -q -p no:cacheprovider -rfEs \
  "tests/e2e/test_methods_e2e.py::test_method_runs_end_to_end_on_cuda" \
  --junitxml="$OUT_DIR/e2e_cuda.xml"
step bench-cuda "$PY" benchmarks/bench_signals.py --device cuda --repeats 7 \
  --out "$OUT_DIR/bench_cuda.json"
step bench-cuda-amp "$PY" benchmarks/bench_signals.py --device cuda --amp --repeats 7 \
  --out "$OUT_DIR/bench_cuda_amp.json"
step bench-cpu "$PY" benchmarks/bench_signals.py --device cpu --repeats 7 \
  --out "$OUT_DIR/bench_cpu.json"
echo "=== done: exit $status"
exit "$status"
