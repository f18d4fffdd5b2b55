#!/usr/bin/env bash
# The transformers integration's tests (tests/test_transformers.py, tests/test_transformers_paged.py) against
# other transformers releases than the one the dev extra pins (5.17.0, the GPU machine's), each installed with
# its own huggingface-hub into .transformers-VERSION/ and put ahead of the environment's on PYTHONPATH.
#   bash scripts/test_transformers_versions.sh             5.25.0 (the newest tested)
#   bash scripts/test_transformers_versions.sh 5.23.0 ...  others; extra pytest arguments after --
# MiniLM's test needs the `kernels` package under 5.25 (sentence-transformers' choice): it is left out here.
set -euo pipefail
VERSIONS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do VERSIONS+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(5.25.0)
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
for v in "${VERSIONS[@]}"; do
  dir=".transformers-$v"
  [ -d "$dir/transformers" ] || python -m pip install -q --target "$dir" "transformers==$v" "huggingface-hub>=1.5,<3" \
    2>&1 | grep -v "dependency resolver\|requires huggingface-hub\|^WARNING" || true
  echo "== transformers $v"
  PYTHONPATH="$PWD/$dir" python -m pytest -q -m "not slow" -k "not minilm" tests/test_transformers.py \
    tests/test_transformers_paged.py "$@"
done
