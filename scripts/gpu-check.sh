#!/usr/bin/env bash
# The checks that need a GPU, in a few minutes (scripts/gpu_check.py says which): for a lent GPU machine
# with Python 3.12, torch and transformers but no network, no vLLM and no DeepSpeed.
#
# The project's other runtime dependencies the checks import (pydantic, pyyaml, rich, click, psutil)
# travel as wheels: on a machine with the network, `scripts/gpu-check.sh --wheels` downloads them for
# CPython 3.12 into wheels/gpu/ (ignored by git: give it to the device machine with the run's carry);
# there, this script installs them from that folder alone, then runs the checks and writes
# benchmarks/results/gpu_check.json (under $OUT as well when the device tool sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=wheels/gpu
NEEDS=(pydantic pyyaml rich click psutil)

if [[ "${1:-}" == "--wheels" ]]; then
  mkdir -p "$WHEELS"
  "$PYTHON" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 "${NEEDS[@]}"
  ls "$WHEELS"
  exit 0
fi

missing=$("$PYTHON" - <<'PY'
import importlib.util
print(" ".join(name for name in ("pydantic", "yaml", "rich", "click", "psutil") if importlib.util.find_spec(name) is None))
PY
)
if [[ -n "$missing" ]]; then
  if [[ ! -d "$WHEELS" ]]; then
    echo "gpu-check: $missing missing and no $WHEELS/ to install them from (scripts/gpu-check.sh --wheels makes it)" >&2
    exit 2
  fi
  "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" "${NEEDS[@]}"
fi

out=benchmarks/results/gpu_check.json
status=0
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/gpu_check.py --out "$out" "$@" || status=$?
if [[ -n "${OUT:-}" ]]; then cp "$out" "$OUT/"; fi
exit $status
