#!/usr/bin/env bash
# Builds the device kit: what a lent GPU machine (no network; python, a CUDA build of torch,
# numpy, scipy and scikit-learn, nothing else of ours) needs to run benchmarks/device/run.sh.
# Run it here, where PyPI is reachable, from anywhere in the repository:
#
#     bash benchmarks/device/build_kit.sh            # -> runs/device-kit/ (git-ignored)
#
# It writes, into KIT_DIR (default runs/device-kit; the run script expects that path, DEVICE_KIT
# there overrides it):
#   wheels/pure, wheels/abi3, wheels/cp311 .. wheels/cp314: the runtime dependencies the machine
#       lacks, at the versions of this project's environment (the tested ones): the closure of
#       pyproject.toml's dependencies, the `dp` extra and the test tools (pytest, pytest-timeout,
#       trustme), without descending into what the machine has (numpy, scipy, scikit-learn,
#       torch) and without matplotlib (imported only to draw plots). A pure wheel where PyPI has
#       one, else manylinux x86_64 wheels for CPython 3.11-3.14 (abi3 ones once);
#   wheels/own: our own wheel (run.sh keeps only its dist-info, for the entry points);
#   wheels/PINS.txt: NAME==VERSION pure|bin, one a line;
#   data/: the data sets (FEDAUDIT_DATASETS_DIR, else ../shared/data);
#   run.sh: a copy of benchmarks/device/run.sh.
# Then prints the kit's size and the device tool's command and carry list. Exits non-zero when a
# wheel could not be fetched or the kit exceeds the 64 MiB a device call may carry.
#
# Environment: PYTHON (default .venv/bin/python: the environment whose versions are pinned),
# KIT_DIR, PY_VERSIONS (default "3.11 3.12 3.13 3.14").
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
START=$(date +%s)
PY=${PYTHON:-.venv/bin/python}
KIT=${KIT_DIR:-runs/device-kit}
PY_VERSIONS=${PY_VERSIONS:-3.11 3.12 3.13 3.14}
DATA=${FEDAUDIT_DATASETS_DIR:-../shared/data}
LIMIT_BYTES=$((64 * 1024 * 1024))

[ -x "$PY" ] || { echo "no interpreter at $PY (set PYTHON to the project's environment)" >&2; exit 2; }
case "$KIT" in /*) ;; *) KIT="$ROOT/$KIT";; esac
case "$KIT" in
  "$ROOT"/runs/*) ;;
  *) echo "note: $KIT is outside runs/; make sure git ignores it" >&2;;
esac
echo "kit: $KIT (pins from $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])'))"
rm -rf "$KIT"
mkdir -p "$KIT/wheels/pure" "$KIT/wheels/abi3" "$KIT/wheels/own" "$KIT/data"
for v in $PY_VERSIONS; do mkdir -p "$KIT/wheels/cp${v/./}"; done

# --- the pins: the closure of the roots over the environment's installed metadata
PINS=$("$PY" - <<'EOF'
import importlib.metadata as md
import re
import tomllib

from packaging.requirements import Requirement

def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
ON_DEVICE = {"numpy", "scipy", "scikit-learn", "torch"}  # the machine's image has these
LEFT_OUT = {"matplotlib"}  # plots only (fedaudit_sim.plots imports it when drawing)
TEST_TOOLS = ["pytest", "pytest-timeout", "trustme"]  # gpu_check.sh's tests (the dev extra's)
roots = [Requirement(r).name for r in project["dependencies"]]
roots += [Requirement(r).name for r in project["optional-dependencies"]["dp"]]
roots += TEST_TOOLS
queue = [r for r in roots if canon(r) not in ON_DEVICE | LEFT_OUT]
seen: set[str] = set()
while queue:
    name = queue.pop(0)
    if canon(name) in seen or canon(name) in ON_DEVICE:
        continue
    seen.add(canon(name))
    dist = md.distribution(name)  # PackageNotFoundError: the environment lacks a dependency
    print(f"{dist.metadata['Name']}=={dist.version}")
    for r in dist.requires or []:
        req = Requirement(r)
        # markers as this interpreter sees them, no extras (3.11 is the lowest Python we support)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            queue.append(req.name)
EOF
)
echo "$(echo "$PINS" | wc -l) distributions"

# --- the wheels
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failed=()
: > "$KIT/wheels/PINS.txt"
dl() {  # dl DEST ARGS...: pip download one wheel into DEST, quietly
  "$PY" -m pip download -q --only-binary=:all: --no-deps -d "$1" "${@:2}" >"$TMP/pip.log" 2>&1
}
for pin in $PINS; do
  rm -rf "$TMP/w"; mkdir -p "$TMP/w"
  if dl "$TMP/w" --python-version 3.11 --implementation py --abi none --platform any "$pin"; then
    mv "$TMP"/w/*.whl "$KIT/wheels/pure/"
    echo "$pin pure" >> "$KIT/wheels/PINS.txt"
    continue
  fi
  for v in $PY_VERSIONS; do
    rm -rf "$TMP/w"; mkdir -p "$TMP/w"
    if ! dl "$TMP/w" --python-version "$v" --implementation cp --abi "cp${v/./}" --abi abi3 \
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 "$pin"; then
      failed+=("$pin cp${v/./}"); tail -3 "$TMP/pip.log"; continue
    fi
    for w in "$TMP"/w/*.whl; do
      case "$(basename "$w")" in
        *-abi3-*) [ -e "$KIT/wheels/abi3/$(basename "$w")" ] || mv "$w" "$KIT/wheels/abi3/";;
        *) mv "$w" "$KIT/wheels/cp${v/./}/";;
      esac
    done
  done
  echo "$pin bin" >> "$KIT/wheels/PINS.txt"
done

# --- our own wheel (its dist-info carries the entry points)
if "$PY" -c "import setuptools, wheel" 2>/dev/null; then
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$KIT/wheels/own" . >"$TMP/own.log" 2>&1 \
    || { cat "$TMP/own.log"; failed+=("own wheel"); }
else
  "$PY" -m pip wheel -q --no-deps -w "$KIT/wheels/own" . >"$TMP/own.log" 2>&1 \
    || { cat "$TMP/own.log"; failed+=("own wheel"); }
fi

# --- the data sets and the run script
if [ -d "$DATA" ]; then
  cp -rL "$DATA"/. "$KIT/data/"
else
  echo "WARNING: no data sets at $DATA (set FEDAUDIT_DATASETS_DIR)"; failed+=("data")
fi
cp benchmarks/device/run.sh "$KIT/run.sh"
cat > "$KIT/README.txt" <<EOF
Device kit, built by benchmarks/device/build_kit.sh; git-ignored, never committed.
See benchmarks/README.md, "On a lent GPU machine". wheels/PINS.txt: the versions.
EOF

# --- report
bytes=$(du -sb "$KIT" | cut -f1)
rel=${KIT#"$ROOT"/}
echo
echo "kit: $rel, $(du -sh "$KIT" | cut -f1) ($bytes bytes; a device call carries at most 64 MiB)"
for d in "$KIT"/wheels/*/; do printf '  %-8s %3d wheels  %s\n' "$(basename "$d")" "$(ls "$d" | wc -l)" "$(du -sh "$d" | cut -f1)"; done
echo "  data     $(du -sh "$KIT/data" | cut -f1)"
echo "built in $(( $(date +%s) - START ))s"
echo
echo "device tool invocation (from the repository root; results come back under \$OUT):"
echo "  command: OUT=\$OUT bash $rel/run.sh"
echo "  carry:   [\"$rel\"]"
echo "  (PARALLEL=1 runs the matrix beside the GPU check; DEADLINE_S, default 540, bounds the run)"
status=0
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"; status=1
fi
if [ "$bytes" -gt "$LIMIT_BYTES" ]; then
  echo "TOO LARGE: $bytes bytes > 64 MiB"; status=1
fi
exit "$status"
