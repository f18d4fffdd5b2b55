#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with torch installed FIRST
# (pinned, so pip never drags in a multi-GB build it did not ask for), then
# vflash in editable mode with the extras asked for. Sourced by check.sh and test.sh.
#   TORCH_SPEC     torch requirement to install first (default torch==2.13.0)
#   PYTHON         interpreter to build the venv from (default python3)
#   VFLASH_EXTRAS  vflash's extras to install (default "test": pytest, all the default
#                  tests and `vflash check` need; "dev" is the full suite's)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${VFLASH_EXTRAS:-test}"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
# the extras' marker file, one a pyproject.toml: a venv set up for other extras, or for an older
# pyproject.toml, installs these on top
STAMP="$VENV/.vflash-extras-${EXTRAS//,/-}-$(cksum < "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -e "$STAMP" ] || ! "$PY" -c "import vflash" 2>/dev/null; then
  "$PY" -m pip install -q -e "$ROOT[$EXTRAS]"
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
