#!/usr/bin/env bash
# The device kit's run script: one command on a lent GPU machine (no network), from the
# repository root, after `bash benchmarks/device/build_kit.sh` built the kit here:
#
#     OUT=$OUT bash runs/device-kit/run.sh        # carry: ["runs/device-kit"]
#
# The kit is the fixed, git-ignored directory runs/device-kit/ (wheels/, data/, this script;
# DEVICE_KIT overrides it, relative to the repository root). The script finds the root two levels
# above itself, so it runs as runs/device-kit/run.sh or as benchmarks/device/run.sh alike.
# benchmarks/README.md, "On a lent GPU machine", has the whole recipe.
#
# 1. picks the interpreter that imports torch, installs the carried wheels (the kit's wheels/,
#    chosen by its CPython version) into /tmp/site with pip --no-deps --no-index (else unzips
#    them); the code itself runs from the working tree (PYTHONPATH = tree, then /tmp/site: only
#    the fedaudit-*.dist-info of our own wheel is kept there, for the `simulate` entry point);
# 2. bash benchmarks/gpu_check.sh $OUT/gpu (the SDK tests, the CUDA e2e test, the three benches);
# 3. the stress matrix at 100 rounds in the remaining time, cut hard before the deadline, then its
#    table (--table-only); everything packed into $OUT/results.tar.gz.
#    PARALLEL=1: the matrix starts in the background before step 2 and runs beside it (the GPU
#    check's timings are then taken on a contended machine).
# Ends within DEADLINE_S (default 540) seconds of its start and exits 0 (see SUMMARY at the end).
#
# Knobs (environment): PYTHON, DEADLINE_S, GPU_CHECK_MAX_S (default 260), PACK_RESERVE_S (20),
# SKIP_GPU_CHECK=1, SKIP_MATRIX=1, AFTER_INSTALL (a command run after the install), FORCE_UNZIP=1,
# PARALLEL=1, MATRIX_ROUNDS (100), MATRIX_SEEDS ("0 1 2"),
# MATRIX_JOBS (15), MATRIX_ONLY (the five rows below), MATRIX_SCENARIOS (docs/eval/matrix: the
# folder of scenario files), SITE_DIR (/tmp/site),
# WORK_DIR (/tmp/device-kit-work), DEVICE_KIT (runs/device-kit).
set -u
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-540}
GPU_CHECK_MAX_S=${GPU_CHECK_MAX_S:-260}
PACK_RESERVE_S=${PACK_RESERVE_S:-20}
MATRIX_ROUNDS=${MATRIX_ROUNDS:-100}
MATRIX_SEEDS=${MATRIX_SEEDS:-0 1 2}
MATRIX_JOBS=${MATRIX_JOBS:-15}
MATRIX_SCENARIOS=${MATRIX_SCENARIOS:-docs/eval/matrix}
MATRIX_ONLY=${MATRIX_ONLY:-m01-digits-iid-sym m04-digits-k2-pairflip m09-bc-10-majority m10-bc-10-gauss-corrupt m11-pneumonia-10-dir05}
SITE_DIR=${SITE_DIR:-/tmp/site}
WORK_DIR=${WORK_DIR:-/tmp/device-kit-work}

cd "$(dirname "$0")/../.." || exit 0
ROOT=$(pwd)
KIT="$ROOT/${DEVICE_KIT:-runs/device-kit}"
OUT=${OUT:-$ROOT/runs/device-kit-out}
mkdir -p "$OUT" "$WORK_DIR"
exec > >(tee -a "$OUT/run.log") 2>&1

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( DEADLINE_S - $(elapsed) )); }
log() { echo "[$(date -u +%H:%M:%S) +$(elapsed)s] $*"; }
SUMMARY=()
note() { SUMMARY+=("$*"); log "$*"; }
# run_capped SECONDS CMD...: timeout in its own process group; afterwards kill what is left of
# that group (coordinators a cut simulation leaves behind), so nothing outlives its step
run_capped() {
  local cap=$1 tp rc
  shift
  timeout -k 10 "$cap" "$@" &
  tp=$!
  wait "$tp"; rc=$?
  kill -KILL -- "-$tp" 2>/dev/null
  return "$rc"
}

log "device kit $KIT in $ROOT; OUT=$OUT; deadline ${DEADLINE_S}s"

# ---------------------------------------------------------------------------------------------
# 0. the machine and the interpreter
log "=== machine"
uname -a; nproc; free -g 2>/dev/null | head -2; df -h /tmp 2>/dev/null | tail -1
nvidia-smi 2>&1 | head -25 || true

PY=""
for cand in ${PYTHON:-} python3 python /opt/conda/bin/python /usr/local/bin/python3 /usr/bin/python3; do
  p=$(command -v "$cand" 2>/dev/null) || continue
  if "$p" -c "import torch" >/dev/null 2>&1; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
  PY=$(command -v "${PYTHON:-python3}" 2>/dev/null || command -v python)
  note "WARNING: no interpreter imports torch; using $PY"
fi
PYV=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
log "=== python: $PY ($("$PY" -VV 2>&1 | tr '\n' ' '))"
"$PY" - <<'EOF' 2>&1
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
for name in ("numpy", "scipy", "sklearn", "threadpoolctl", "pytest", "yaml", "httpx", "typer"):
    try:
        m = __import__(name); print("image has", name, getattr(m, "__version__", "?"))
    except Exception as exc:
        print("image lacks", name, f"{type(exc).__name__}: {exc}")
EOF
case "$PYV" in
  311|312|313|314) ;;
  *) note "WARNING: CPython $PYV: the kit has compiled wheels for 3.11-3.14 only, and fedaudit needs >= 3.11 (datetime.UTC)";;
esac

# ---------------------------------------------------------------------------------------------
# 1. the wheels
log "=== install wheels into $SITE_DIR"
[ -d "$KIT/wheels" ] || note "WARNING: no wheels in $KIT (build the kit: bash benchmarks/device/build_kit.sh)"
rm -rf "$SITE_DIR"; mkdir -p "$SITE_DIR"
WHEELS=("$KIT"/wheels/pure/*.whl "$KIT"/wheels/abi3/*.whl)
[ -d "$KIT/wheels/cp$PYV" ] && WHEELS+=("$KIT"/wheels/cp$PYV/*.whl)
WHEELS+=("$KIT"/wheels/own/*.whl)
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
installed=no
if [ "${FORCE_UNZIP:-0}" != 1 ] && "$PY" -m pip --version >/dev/null 2>&1; then
  if "$PY" -m pip install -q --no-deps --no-index --no-compile --target "$SITE_DIR" "${WHEELS[@]}"; then
    installed=pip
  else
    log "pip install failed; unzipping the wheels instead"
    rm -rf "$SITE_DIR"; mkdir -p "$SITE_DIR"
  fi
fi
if [ "$installed" = no ]; then
  for w in "${WHEELS[@]}"; do "$PY" -m zipfile -e "$w" "$SITE_DIR" || log "unzip failed: $w"; done
  installed=unzip
fi
# our own packages run from the tree: keep only the wheel's dist-info (the entry points)
rm -rf "$SITE_DIR"/service "$SITE_DIR"/client_sdk "$SITE_DIR"/fedaudit_privacy \
  "$SITE_DIR"/fedaudit_flower "$SITE_DIR"/fedaudit_sim
note "install: $installed, $(ls -d "$SITE_DIR"/*.dist-info | wc -l) distributions, cp$PYV wheels $([ -d "$KIT/wheels/cp$PYV" ] && echo present || echo MISSING)"

# Also a .pth file, for the subprocesses that set PYTHONPATH themselves (a test of the SDK runs a
# child with PYTHONPATH=<tree> only): the user site (ahead of the system's site-packages), else
# the interpreter's own site-packages when the user site is off (a venv) or not writable.
PTH_OK=no
for d in $("$PY" -c 'import site; print(site.getusersitepackages() if site.ENABLE_USER_SITE else "")') \
         $("$PY" -c 'import site; print(" ".join(site.getsitepackages()))'); do
  if mkdir -p "$d" 2>/dev/null && echo "$SITE_DIR" > "$d/fedaudit-device-kit.pth" 2>/dev/null; then
    if env -u PYTHONPATH "$PY" -c "import httpx, yaml" >/dev/null 2>&1; then PTH_OK="$d"; break; fi
    rm -f "$d/fedaudit-device-kit.pth"
  fi
done
note "site .pth: $PTH_OK"
export PYTHONPATH="$ROOT:$SITE_DIR${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE  # let the many short processes reuse compiled modules
export FEDAUDIT_DATASETS_DIR="$KIT/data"
# only our pytest plugins: none of the image's (pytest-timeout: the `timeout` ini option)
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS="-p pytest_timeout"
export PYTHON="$PY"
# matrix.py calls `fedaudit simulate`: a wrapper on this interpreter
mkdir -p "$WORK_DIR/bin"
printf '#!/usr/bin/env bash\nexec "%s" -m service.cli "$@"\n' "$PY" > "$WORK_DIR/bin/fedaudit"
chmod +x "$WORK_DIR/bin/fedaudit"

"$PY" - <<'EOF' 2>&1
import importlib, sys
bad = []
for name in ("fastapi starlette pydantic pydantic_core pydantic_settings sqlalchemy alembic mako "
             "httpx typer rich safetensors python_multipart yaml pythonjsonlogger prometheus_client "
             "dp_accounting tree pytest pytest_timeout trustme opentelemetry numpy scipy sklearn "
             "threadpoolctl torch service.main client_sdk fedaudit_sim.runner").split():
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '')} {getattr(m, '__file__', '')}")
    except Exception as exc:
        bad.append(name); print(f"  FAILED {name}: {type(exc).__name__}: {exc}")
print("imports:", "ok" if not bad else f"FAILED {bad}")
EOF
if "$PY" -m service.cli simulate --help >/dev/null 2>&1; then
  note "cli: 'python -m service.cli simulate --help' works"
else
  note "WARNING: 'python -m service.cli simulate --help' fails:"; "$PY" -m service.cli simulate --help 2>&1 | tail -20
fi

# AFTER_INSTALL: one more bash command, run here with $PY set (e.g. a benchmark writing under
# $OUT), cut before the deadline; its output goes to $OUT/after_install.log
if [ -n "${AFTER_INSTALL:-}" ]; then
  log "=== after install: $AFTER_INSTALL"
  t0=$(date +%s)
  PY="$PY" run_capped $(( $(left) - PACK_RESERVE_S )) bash -c "$AFTER_INSTALL" \
    > "$OUT/after_install.log" 2>&1
  note "after install: exit $? after $(( $(date +%s) - t0 ))s (after_install.log)"
fi

# ---------------------------------------------------------------------------------------------
# 3. the matrix at 100 rounds, cut hard before the deadline
MX="$WORK_DIR/mx$MATRIX_ROUNDS"
mkdir -p "$MX"
MXARGS=(--rounds "$MATRIX_ROUNDS" --seeds $MATRIX_SEEDS --out "$MX" --only $MATRIX_ONLY
        --scenarios "$MATRIX_SCENARIOS" --fedaudit "$WORK_DIR/bin/fedaudit")
run_matrix() {
budget=$(( $(left) - PACK_RESERVE_S ))
if [ "$budget" -lt 30 ]; then
  note "matrix: NOT RUN, only $(left)s left"
else
  log "=== matrix: ${MATRIX_JOBS} jobs, one thread each, cut after ${budget}s -> $MX"
  t0=$(date +%s)
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 NUMEXPR_NUM_THREADS=1 \
  VECLIB_MAXIMUM_THREADS=1 TORCH_NUM_THREADS=1 CUDA_VISIBLE_DEVICES="" \
    run_capped "$budget" "$PY" docs/eval/matrix.py "${MXARGS[@]}" --jobs "$MATRIX_JOBS" \
    > >(tee "$MX/matrix_run.log" | grep --line-buffered -E "runs already finished|: rc ") 2>&1
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "matrix: CUT after $(( $(date +%s) - t0 ))s (timeout ${budget}s)"
  else
    note "matrix: exit $rc after $(( $(date +%s) - t0 ))s"; [ "$rc" -eq 0 ] || tail -20 "$MX/matrix_run.log"
  fi
fi
}

# PARALLEL=1: the matrix in the background from now on (its notes go to its log), the GPU check
# in the foreground beside it; otherwise one after the other.
if [ "${PARALLEL:-0}" = 1 ]; then
  run_matrix > "$WORK_DIR/matrix_step.log" 2>&1 &
  MATRIX_PID=$!
  log "=== matrix started in the background (pid $MATRIX_PID)"
fi
# ---------------------------------------------------------------------------------------------
# 2. benchmarks/gpu_check.sh
if [ "${SKIP_GPU_CHECK:-0}" = 1 ]; then
  note "gpu_check: skipped (SKIP_GPU_CHECK=1)"
elif [ "$(left)" -lt 60 ]; then
  note "gpu_check: NOT RUN, only $(left)s left"
else
  cap=$GPU_CHECK_MAX_S; [ "$cap" -gt $(( $(left) - PACK_RESERVE_S )) ] && cap=$(( $(left) - PACK_RESERVE_S ))
  log "=== gpu_check (cap ${cap}s) -> $OUT/gpu"
  t0=$(date +%s)
  run_capped "$cap" bash benchmarks/gpu_check.sh "$OUT/gpu"
  rc=$?
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && rc="$rc (CUT at ${cap}s)"
  note "gpu_check: exit $rc in $(( $(date +%s) - t0 ))s; steps: $(grep -ho '^=== [a-z0-9-]*: exit [0-9]*' "$OUT/gpu/log.txt" 2>/dev/null | sed 's/=== //' | tr '\n' ';')"
fi

if [ "${PARALLEL:-0}" = 1 ]; then
  wait "$MATRIX_PID"; cat "$WORK_DIR/matrix_step.log"
  note "matrix (background): $(grep -h 'matrix: ' "$WORK_DIR/matrix_step.log" | tail -1)"
elif [ "${SKIP_MATRIX:-0}" = 1 ]; then
  note "matrix: skipped (SKIP_MATRIX=1)"
else
  run_matrix
fi
# what finished, what failed, what was cut
done_list=(); failed_list=(); cut_list=()
for s in $MATRIX_ONLY; do
  for seed in $MATRIX_SEEDS; do
    if [ -f "$MX/$s/seed$seed/results.json" ]; then done_list+=("$s/seed$seed")
    elif [ -f "$MX/$s/seed$seed.meta.json" ]; then failed_list+=("$s/seed$seed")
    else cut_list+=("$s/seed$seed"); fi
  done
done
note "matrix runs: finished ${#done_list[@]}: ${done_list[*]:-}"
[ "${#failed_list[@]}" -gt 0 ] && note "matrix runs: FAILED (rc != 0, see seedN.log) ${#failed_list[@]}: ${failed_list[*]}"
[ "${#cut_list[@]}" -gt 0 ] && note "matrix runs: CUT or never started ${#cut_list[@]}: ${cut_list[*]}"
if [ -d "$MX" ]; then
  timeout -k 5 20 "$PY" docs/eval/matrix.py "${MXARGS[@]}" --table-only > "$MX/table.log" 2>&1 \
    && note "matrix table: $MX/matrix.md" || note "matrix table: FAILED (see table.log)"
  cp "$MX/matrix.md" "$OUT/matrix.md" 2>/dev/null
fi

# ---------------------------------------------------------------------------------------------
# 4. pack: results, tables, logs, meta; no coordinator databases or model blobs
log "=== pack"
{ printf '%s\n' "${SUMMARY[@]}"; } > "$OUT/summary.txt"
( cd "$WORK_DIR" && find "mx$MATRIX_ROUNDS" -type f \( -name '*.json' -o -name '*.csv' -o -name '*.md' \
    -o -name '*.log' -o -name '*.txt' \) -size -20M -print 2>/dev/null ) > "$WORK_DIR/pack.list"
mkdir -p "$WORK_DIR/pack"
[ -d "$OUT/gpu" ] && cp -r "$OUT/gpu" "$WORK_DIR/pack/gpu"
cp "$OUT/summary.txt" "$WORK_DIR/pack/" 2>/dev/null
tar -czf "$OUT/results.tar.gz" -C "$WORK_DIR" -T "$WORK_DIR/pack.list" \
  -C "$WORK_DIR/pack" . 2>&1 | tail -3
[ -f "$OUT/gpu/log.txt" ] && cp "$OUT/gpu/log.txt" "$OUT/gpu_check.log"
[ -s "$OUT/results.tar.gz" ] && rm -rf "$OUT/gpu"
log "OUT: $(ls "$OUT" | tr '\n' ' ') ($(du -sh "$OUT/results.tar.gz" 2>/dev/null | cut -f1) tar)"

log "=== SUMMARY"
printf '  %s\n' "${SUMMARY[@]}"
log "done in $(elapsed)s (deadline ${DEADLINE_S}s)"
exit 0
