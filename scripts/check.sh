#!/usr/bin/env bash
# Set up if needed, then run vflash's correctness matrix on the device present:
# a CUDA GPU when there is one, else the CPU through the Triton interpreter.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec vflash check "$@"
