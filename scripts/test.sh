#!/usr/bin/env bash
# Set up if needed, then run the tests (CPU through the Triton interpreter; GPU tests
# are skipped without CUDA).
#   bash scripts/test.sh           the default run: every test but those marked slow, with
#                                  pytest alone installed (the transformers tests skip)
#   bash scripts/test.sh --full    the full suite, as CI runs it: the slow tests too, with the
#                                  dev extra (transformers, MiniLM's weights, matplotlib)
# The run spreads over the CPU's cores (pytest-xdist, one worker a core, at most 8: each holds its own
# torch and Triton; with a GPU, at most one per 9 GiB of its memory); VFLASH_TEST_WORKERS sets the count, 0 runs
# in one process. Other arguments go to pytest.
set -euo pipefail
FULL=0
ARGS=()
for arg in "$@"; do
  if [ "$arg" = "--full" ]; then FULL=1; else ARGS+=("$arg"); fi
done
if [ "$FULL" = 1 ]; then
  export VFLASH_EXTRAS="${VFLASH_EXTRAS:-dev}"
  MARK=()
else
  MARK=(-m "not slow")
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
CORES=$(nproc 2>/dev/null || echo 1)
WORKERS="${VFLASH_TEST_WORKERS:-$(( CORES < 8 ? CORES : 8 ))}"
# with a GPU, at most a worker per 9 GiB of its memory: the long-sequence backward tests hold fp64 references
# of several GB each
if [ -z "${VFLASH_TEST_WORKERS:-}" ] && command -v nvidia-smi > /dev/null 2>&1; then
  MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [ -n "$MIB" ] && [ "$(( MIB / 9216 ))" -lt "$WORKERS" ]; then WORKERS=$(( MIB / 9216 )); fi
fi
SPREAD=()
if [ "$WORKERS" -gt 1 ]; then SPREAD=(-n "$WORKERS"); fi
exec python -m pytest -q "${SPREAD[@]+"${SPREAD[@]}"}" "${MARK[@]}" "${ARGS[@]+"${ARGS[@]}"}"
