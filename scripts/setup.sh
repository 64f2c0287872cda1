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

# --compile-bytecode: every component is a process of its own that imports torch and transformers; where
# Python may not write bytecode itself (PYTHONDONTWRITEBYTECODE, a read-only venv) each one compiled ~13k
# modules again at start-up (import of torch + transformers' Llama: 12.5 s -> 6.5 s measured). Once compiled,
# re-running skips them (~1 s).
args=(sync --frozen --inexact --compile-bytecode)
for extra in "$@"; do args+=(--extra "$extra"); done
"${UV[@]}" "${args[@]}"
