#!/usr/bin/env bash
# Set up if needed, then run the tests (CPU through the Triton interpreter; GPU tests
# are skipped without CUDA).
#   bash scripts/test.sh           the default run: every test but those marked slow, with
#                                  pytest alone installed (the transformers tests skip)
#   bash scripts/test.sh --full    the full suite, as CI runs it: the slow tests too, with the
#                                  dev extra (transformers, MiniLM's weights, matplotlib)
# Other arguments go to pytest.
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
exec python -m pytest -q "${MARK[@]}" "${ARGS[@]+"${ARGS[@]}"}"
