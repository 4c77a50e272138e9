#!/usr/bin/env bash
# Every benchmark of benchmarks/README.md in one command, each writing its JSON into one
# directory (default runs/bench-<UTC date and time>/), with a summary of what ran and what was
# skipped. The aggregation benchmark runs in the Flower environment (.venv-flower, made by
# `FEDAUDIT_VENV=.venv-flower scripts/setup --flower`) when there is one, so that its Flower
# comparison is measured; otherwise in .venv without it (the JSON says so). bench_notify needs a
# PostgreSQL server: FEDAUDIT_TEST_POSTGRES_URL, else skipped. No timing is asserted anywhere:
# a benchmark that fails is reported and the others still run; the exit status counts failures.
#
#   benchmarks/run_all.sh [OUT_DIR]        # about 20-30 minutes on a 2-core machine
#   QUICK=1 benchmarks/run_all.sh DIR      # every script's smoke run (tiny sizes), a minute or two
set -uo pipefail
cd "$(dirname "$0")/.."

out="${1:-runs/bench-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
python=.venv/bin/python
flower_python=$python
if [ -x .venv-flower/bin/python ] && .venv-flower/bin/python -c "import flwr" 2>/dev/null; then
  flower_python=.venv-flower/bin/python
fi

failed=0
summary=()
quick=()
[ "${QUICK:-0}" = 1 ] && quick=(--quick)
run() {  # run NAME PYTHON SCRIPT ARGS... (QUICK=1 adds --quick)
  local name=$1 interpreter=$2
  shift 2
  echo "== $name" >&2
  if "$interpreter" "$@" "${quick[@]}" --out "$out/$name.json" >"$out/$name.log" 2>&1; then
    summary+=("ok       $name")
  else
    failed=$((failed + 1))
    summary+=("FAILED   $name (see $out/$name.log)")
  fi
}

run aggregation "$flower_python" benchmarks/bench_aggregation.py
run audit_scaling "$python" benchmarks/bench_audit_scaling.py
run round_overhead "$python" benchmarks/bench_round_overhead.py
run upload "$python" benchmarks/bench_upload.py
run load "$python" benchmarks/bench_load.py
run waiting_memory "$python" benchmarks/bench_waiting_memory.py
# bench_signals and bench_notify have no --quick: their smoke runs are smaller arguments
small_signals=() small_notify=()
if [ "${QUICK:-0}" = 1 ]; then
  small_signals=(--num-samples 64 --repeats 1)
  small_notify=(--writers 1 --seconds 0.5 --repeats 1)
fi
quick=()
run signals "$python" benchmarks/bench_signals.py "${small_signals[@]}"
if [ -n "${FEDAUDIT_TEST_POSTGRES_URL:-}" ]; then
  run notify "$python" benchmarks/bench_notify.py --url "$FEDAUDIT_TEST_POSTGRES_URL" \
    "${small_notify[@]}"
else
  summary+=("skipped  notify (no FEDAUDIT_TEST_POSTGRES_URL: scripts/start-postgres prints one)")
fi
[ "$flower_python" = "$python" ] && summary+=("note     aggregation ran without Flower (no .venv-flower with flwr)")

printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
echo "results in $out" >&2
exit "$failed"
