#!/usr/bin/env bash
# Set up if needed, then run the test suite (CPU through the Triton interpreter;
# GPU tests are skipped without CUDA).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec python -m pytest -q "$@"
