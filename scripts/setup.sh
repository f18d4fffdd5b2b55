#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with torch installed FIRST
# (pinned, so pip never drags in a multi-GB build it did not ask for), then
# vflash in editable mode with its dev extras. Sourced by check.sh and test.sh.
#   TORCH_SPEC  torch requirement to install first (default torch==2.13.0)
#   PYTHON      interpreter to build the venv from (default python3)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
if ! "$PY" -c "import vflash, pytest" 2>/dev/null; then
  "$PY" -m pip install -q -e "$ROOT[dev]"
fi
export PATH="$VENV/bin:$PATH"
