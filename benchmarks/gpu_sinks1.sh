set -u
export PYTHONPATH=$PWD/src:$PWD VFLASH_TEST_DEVICE=cuda
pip install -q --no-deps .device-wheels/*.whl > /dev/null 2>&1
python3 -m vflash env --json > $OUT/env.json
(timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_sinks.py tests/test_distributed.py tests/test_transformers.py -k "sinks or gpt_oss or one_rank" > $OUT/pytest_gpu_sinks.txt 2>&1; tail -2 $OUT/pytest_gpu_sinks.txt) &
timeout 200 python3 -c "
import sys, torch
from vflash.harness import check
cases = [c for c in check.gpu_matrix() if 'sinks' in c.name]
with open('$OUT/check_gpu_sinks.log', 'w') as f:
    failed = check.run_matrix(cases, torch.device('cuda'), stream=f)
print('check sinks failed', failed)
" 2>&1 | tail -2
wait
timeout 200 python3 -m vflash bench --sweep fa --dtype bf16 --methods vflash,vflash_sinks,sdpa_cudnn --out $OUT/fa_sinks.csv 2>&1 | tail -3
