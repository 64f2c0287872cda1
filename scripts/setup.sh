#!/usr/bin/env bash
# Create or reuse .venv and install the locked dependency set (uv.lock) with the given extras.
# Re-running is cheap: uv keeps its package cache and only changes what the lock changed.
# Usage: scripts/setup.sh [extra ...]     e.g. scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v uv >/dev/null 2>&1; then
    UV=(uv)
else
    python3 -m uv --version >/dev/null 2>&1 || {
        echo "setup: installing uv (the lock-file installer) with pip" >&2
        python3 -m pip install --quiet --disable-pip-version-check uv
    }
    UV=(python3 -m uv)
fi

args=(sync --frozen --inexact)
for extra in "$@"; do args+=(--extra "$extra"); done
"${UV[@]}" "${args[@]}"
