#!/usr/bin/env bash
# One device call that produces a full results folder, packed as one archive
# (the device tool returns at most 8 files). Each step has its own time limit so
# a slow step cannot take the archive down with it.
# Usage on the GPU machine: VFLASH_COMMIT=<sha> bash benchmarks/gpu_session.sh STEP...
# (the device gets a copy of the tree without .git: VFLASH_COMMIT names the commit in env records)
# A cold machine (empty Triton cache) needs ~380 s for `tests`; keep the call's limit above the sum, and run
# tests_kernels and tests_rest (the whole GPU suite) each alone in its call.
# HOPPER_TIMEOUT (seconds, default 300) bounds the sm90_variants step; HOPPER_ARTICLE=1 times the article's shapes,
# HOPPER_GRAPHS=1 times each candidate's CUDA graph (short calls: the kernel, not Python's launch path),
# HOPPER_ROUNDS=R times every candidate R times in alternating order (one pass is not evidence for a few per cent).
# BENCH_INTERLEAVE=1 runs the sweeps with `vflash bench --interleave` (a shape's methods timed in turn, same clocks).
# Steps are named for what they run: a `vflash` command, a test set, or the experiment script of that name
# (benchmarks/experiments/NAME.py; tune* run benchmarks/tune.py).
STEPS="check tests tests_kernels tests_forward tests_sm90 tests_dispatch_backward tests_rest tests_serving tests_some memory fa_bf16 fa_fp16 fa_fp16_flex article d256
  clocks decode varlen chunked kvops bwd tune tune_short tune_split tune_article_d256 kvops_tune invariant_tune
  chunked_ring decode_tune bwd_tune check_cost sanitize_serving hf_llama hf_gpt_oss hf_cb ring_single_gpu ring_nccl ring_scaling
  launch_overhead host_sm90 host_sm90_old check_sinks fa_sinks bwd_sinks decode_sinks decode_sinks_ab check_fp8 fa_fp8 fp8_bars decode_fp8 fp8_sm90 fp8_varlen_bisect check_sm90_forced check_mla mla_decode vhead_prefill sm90_launcher sm90_variants profile_sm90 profile_mla profile_decode
  profile_decode_full bwd_sm90 bwd_host decode_host decode_trees ab_trees"
set -u
# $PWD on the path too: the experiment scripts run as `python3 -m benchmarks.experiments.NAME`.
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off on a machine of several GPUs (the device rules), in every process started here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/vflash-out}
R=$OUT/results
# A second invocation in the same call adds to the first one's archive instead of replacing it.
if [ -f "$OUT/results.tar.gz" ] && [ ! -d "$R" ]; then tar -C "$OUT" -xzf "$OUT/results.tar.gz"; fi
mkdir -p "$R"
python3 -m vflash env --json > "$R/env.json"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  >> "$R/nvidia-smi.txt"
# A command with nvidia-smi sampling the SM clock and power every 200 ms into $R/clocks_NAME.csv: the sweeps
# run at the board's power cap, whose clock moves between runs (docs/performance.md); report.py prints its median.
# SAMPLE_MS sets the interval.
sampled() {
  local name=$1; shift
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms "${SAMPLE_MS:-200}" > "$R/clocks_$name.csv" 2>&1 &
  local smi=$!
  "$@"
  kill $smi; wait $smi 2>/dev/null
}
# The GPU suite over TESTS_WORKERS workers (pytest-xdist from .device-wheels): output file, time limit, pytest
# arguments. Most of its time is Gluon compiles, on the CPU (16 cores), but the long-sequence backward tests
# hold fp64 references of several GB each: the default is one worker per 9 GiB of GPU memory, at most 16
# (the H200's 141 GB: 15; the H100's 80 GB: 8, where 16 workers ran out of memory; there tests_kernels may
# pass one call's limit: run tests_forward, tests_sm90 and tests_dispatch_backward instead).
gpu_tests() {
  local out=$1 limit=$2; shift 2
  pip install -q --no-deps .device-wheels/*.whl > /dev/null 2>&1
  local mib workers
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  workers=$(( mib / 9216 )); [ "$workers" -gt 16 ] && workers=16; [ "$workers" -lt 1 ] && workers=1
  # a test still running after TESTS_STALL_S seconds (default 240) dumps every thread's stack into the output:
  # a stalled compile shows where it stalls before the step's limit cuts the run
  VFLASH_TEST_DEVICE=cuda timeout "$limit" python3 -m pytest -q -p no:cacheprovider -n "${TESTS_WORKERS:-$workers}" \
    -o faulthandler_timeout="${TESTS_STALL_S:-240}" --durations=20 "$@" > "$R/$out" 2>&1
  tail -2 "$R/$out"
}
for step in "$@"; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    check) # the full GPU matrix (244 cases): 437 s on a cold H200
           timeout ${CHECK_TIMEOUT:-560} python3 -m vflash check --log "$R/check_gpu.log" | tail -3 ;;
    tests) VFLASH_TEST_DEVICE=cuda timeout 540 python3 -m pytest -q -p no:cacheprovider \
             tests/test_gpu.py tests/test_attention.py tests/test_plans.py tests/test_sm90.py \
             > "$R/pytest_gpu.txt" 2>&1
           tail -2 "$R/pytest_gpu.txt" ;;
    memory) timeout 90 python3 -m vflash memory --out "$R/memory.csv" ;;
    fa_bf16) sampled fa_bf16 timeout 100 python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} --sweep fa \
               --dtype bf16 --methods vflash,sdpa_flash,sdpa_cudnn --out "$R/fa_bf16.csv" | tail -4 ;;
    article) sampled article timeout 130 python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} --sweep article \
               --dtype fp16 --out "$R/article_fp16.csv" | tail -4 ;;
    fa_fp16) sampled fa_fp16 timeout 120 python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} --sweep fa \
               --dtype fp16 --methods vflash,sdpa_flash,sdpa_cudnn --out "$R/fa_fp16.csv" | tail -4 ;;
    fa_fp16_flex) sampled fa_fp16_flex timeout 160 python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} \
               --sweep fa --dtype fp16 --methods vflash,sdpa_flash,sdpa_cudnn,flex --out "$R/fa_fp16.csv" | tail -4 ;;
    launch_overhead) timeout 90 python3 -m benchmarks.experiments.launch_overhead > "$R/launch_overhead.txt" 2>&1
            cat "$R/launch_overhead.txt" ;;
    tune) timeout 200 python3 benchmarks/tune.py > "$R/tune.txt" 2>&1 ;;
    tune_short) timeout 200 python3 benchmarks/tune.py --short > "$R/tune_short.txt" 2>&1; cat "$R/tune_short.txt" ;;
    d256) sampled d256 timeout 150 python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} --sweep d256 \
            --dtype fp16 --methods vflash,sdpa_flash,sdpa_cudnn --out "$R/d256_fp16.csv" | tail -3 ;;
    # The whole GPU suite in two calls (16 workers on the H200: 524 s and 197 s, a warm Triton cache).
    tests_kernels) gpu_tests pytest_gpu_kernels.txt 560 tests/test_gpu.py tests/test_attention.py tests/test_plans.py \
                     tests/test_sm90.py tests/test_dispatch.py tests/test_backward.py ;;
    # tests_kernels in three parts, for the H100 (8 workers: the whole set passes one call's limit)
    tests_forward) gpu_tests pytest_gpu_forward.txt 560 tests/test_gpu.py tests/test_attention.py tests/test_plans.py ;;
    tests_sm90) gpu_tests pytest_gpu_sm90.txt 560 tests/test_sm90.py ;;
    tests_dispatch_backward) gpu_tests pytest_gpu_dispatch_backward.txt 400 tests/test_dispatch.py \
                     tests/test_backward.py ;;
    tests_rest) gpu_tests pytest_gpu_rest.txt 560 tests/test_varlen.py tests/test_merge.py tests/test_kvcache_write.py \
                  tests/test_kvcache.py tests/test_example_serve.py tests/test_transformers.py \
                  tests/test_distributed.py tests/test_validation.py tests/test_layers.py tests/test_sinks.py tests/test_fp8.py \
                  tests/test_value_head_dim.py tests/test_mla.py tests/test_transformers_paged.py ;;
    tests_serving) gpu_tests pytest_gpu_serving.txt 300 tests/test_varlen.py tests/test_merge.py \
                  tests/test_kvcache_write.py tests/test_kvcache.py tests/test_example_serve.py ;;
    decode) sampled decode timeout 240 python3 -m vflash bench --sweep decode --out "$R/decode.csv" | tail -14 ;;
    bwd) # the backward (BWD_MODE: bwd or fwd_bwd) over the fa and d256 sweeps, BWD_DTYPES (default bf16)
         sampled bwd timeout ${BWD_TIMEOUT:-300} python3 -m vflash bench --mode ${BWD_MODE:-bwd} --sweep fa \
           --dtype ${BWD_DTYPES:-bf16} --methods vflash,sdpa_flash,sdpa_cudnn --out "$R/${BWD_MODE:-bwd}.csv" | tail -4
         [ -n "${BWD_D256:-}" ] && sampled bwd_d256 timeout 200 python3 -m vflash bench --mode ${BWD_MODE:-bwd} \
           --sweep d256 --dtype ${BWD_DTYPES:-bf16} --methods vflash,sdpa_flash,sdpa_cudnn \
           --out "$R/${BWD_MODE:-bwd}_d256.csv" | tail -3 ;;
    bwd_tune) timeout ${TUNE_TIMEOUT:-420} python3 -m benchmarks.experiments.bwd_tune ${BWD_ROWS:+--rows $BWD_ROWS} \
                --out "$R/bwd_tune.csv" > "$R/bwd_tune.txt" 2>&1
              grep "BEST\|Error\|WRONG" "$R/bwd_tune.txt" | tail -30 ;;
    hf_llama) timeout ${HF_TIMEOUT:-400} python3 -m benchmarks.experiments.hf_llama --out "$R/hf_llama.csv" \
                > "$R/hf_llama.txt" 2>&1
              grep -v Warning "$R/hf_llama.txt" | tail -14 ;;
    hf_gpt_oss) timeout ${HF_TIMEOUT:-400} python3 -m benchmarks.experiments.hf_gpt_oss --out "$R/hf_gpt_oss.csv" \
                  > "$R/hf_gpt_oss.txt" 2>&1; tail -9 "$R/hf_gpt_oss.txt" ;;
    hf_cb) # issue 56: generate_batch (continuous batching) with vflash against paged|sdpa / paged|eager (CB_REQUESTS:
           # the request counts, CB_PROFILE: the profiled run's, 0 for none)
           timeout ${HF_TIMEOUT:-400} python3 -m benchmarks.experiments.hf_cb --out "$R/hf_cb.csv" \
             ${CB_REQUESTS:+--requests $CB_REQUESTS} ${CB_PROFILE:+--profile-requests $CB_PROFILE} > "$R/hf_cb.txt" 2>&1; grep -v WARNING "$R/hf_cb.txt" | tail -12 ;;
    ring_nccl) # issue 26: ring attention over NCCL on 2, 4 and 8 GPUs (as many as the host has), forward and
               # backward, against one GPU's vflash.attention on the full sequence
               VFLASH_TEST_DEVICE=cuda timeout ${RING_TIMEOUT:-540} python3 -m pytest -q -p no:cacheprovider \
                 tests/test_distributed.py > "$R/pytest_ring_nccl.txt" 2>&1; tail -2 "$R/pytest_ring_nccl.txt" ;;
    ring_scaling) # issue 26: per-GPU TFLOP/s over RING_GPUS (default 1,2,4,8) and RING_TOKENS, beside PyTorch's
                  # context_parallel over SDPA cuDNN, added to ring_scaling.csv (split the world sizes over calls:
                  # RING_GPUS=1,2 then 4,8, a 600 s call each)
                  timeout ${RING_TIMEOUT:-540} python3 -m benchmarks.experiments.ring_scaling --append \
                    --gpus ${RING_GPUS:-1,2,4,8} --tokens ${RING_TOKENS:-32768,131072,262144} \
                    --out "$R/ring_scaling.csv" --plot "$R/ring_scaling.png" \
                    >> "$R/ring_scaling.txt" 2>&1; tail -20 "$R/ring_scaling.txt" ;;
    ring_single_gpu) timeout ${RING_TIMEOUT:-300} python3 -m benchmarks.experiments.ring_single_gpu \
                       --out "$R/ring_single_gpu.csv" > "$R/ring_single_gpu.txt" 2>&1
                     tail -30 "$R/ring_single_gpu.txt" ;;
    sanitize_serving) # issue 22: every serving kernel on edge-case metadata under compute-sanitizer's memcheck
              # (SANITIZE_ARGS: the script's options, e.g. --in-order-only)
              timeout ${SANITIZE_TIMEOUT:-400} compute-sanitizer --tool memcheck --error-exitcode 1 \
                python3 -m benchmarks.experiments.sanitize_serving ${SANITIZE_ARGS:-} > "$R/sanitize.txt" 2>&1
              echo "sanitize rc $?" >> "$R/sanitize.txt"; tail -25 "$R/sanitize.txt" ;;
    check_cost) # the checked decode call's wall time against the unchecked one's, for the library of each tree of
                # CHECK_TREES (source dirs, default "src"; e.g. ".ab/old/src src"), alternating, two rounds
                for r in 1 2; do for t in ${CHECK_TREES:-src}; do
                  label=$( [ "$t" = src ] && echo new || basename "$(dirname "$t")" )
                  PYTHONPATH=$PWD/$t:$PWD timeout 120 python3 -m benchmarks.experiments.check_cost --label "$label" \
                    --out "$R/check_cost_${label}_r$r.csv"
                done; done >> "$R/check_cost.txt" 2>&1; tail -40 "$R/check_cost.txt" ;;
    varlen) sampled varlen timeout 90 python3 -m vflash bench --sweep varlen --out "$R/varlen.csv" | tail -3 ;;
    chunked) sampled chunked timeout 90 python3 -m vflash bench --sweep chunked --out "$R/chunked.csv" | tail -4 ;;
    kvops) # merge_states and write_kvcache against PyTorch ops (vflash bench --sweep merge, write)
           sampled merge timeout 120 python3 -m vflash bench --sweep merge --out "$R/merge.csv" | tail -6
           sampled write timeout 120 python3 -m vflash bench --sweep write --out "$R/write.csv" | tail -5 ;;
    invariant_tune) # the batch-invariant split rule's variants (INVARIANT_VARIANTS keys:most splits) on the
                    # decode rows
                    timeout ${TUNE_TIMEOUT:-300} python3 -m benchmarks.experiments.invariant_tune \
                      --rounds ${TUNE_ROUNDS:-2} ${INVARIANT_VARIANTS:+--variants $INVARIANT_VARIANTS} \
                      --out "$R/invariant_tune.csv" \
                      > "$R/invariant_tune.txt" 2>&1; grep "VARIANT\|Error" "$R/invariant_tune.txt" | tail -12 ;;
    kvops_tune) timeout ${TUNE_TIMEOUT:-300} python3 -m benchmarks.experiments.kvops_tune --out "$R/kvops_tune.csv" \
                  > "$R/kvops_tune.txt" 2>&1; grep "BEST\|Error\|WRONG" "$R/kvops_tune.txt" | tail -20 ;;
    chunked_ring) # chunked prefill's K/V ring at other depths (CHUNKED_PAGES, default 16,64; CHUNKED_VARIANTS
                    # block_n:stages[:q_buffers], default 128:3:1,64:4,64:3:1, empty for none)
                    sampled chunked_ring timeout ${CHUNKED_TIMEOUT:-300} \
                      python3 -m benchmarks.experiments.chunked_ring --pages "${CHUNKED_PAGES:-16,64}" \
                      --variants "${CHUNKED_VARIANTS-128:3:1,64:4,64:3:1}" \
                      --out "$R/chunked_ring.csv" > "$R/chunked_ring.txt" 2>&1
                    tail -4 "$R/chunked_ring.txt" ;;
    decode_tune) # TUNE_NAME: the output files' name (default decode_tune), for several runs in one call
                 name=${TUNE_NAME:-decode_tune}
                 timeout ${TUNE_TIMEOUT:-300} python3 -m benchmarks.experiments.decode_tune ${TUNE_QUICK:+--quick} \
                   ${TUNE_GRID:+--grid} ${TUNE_ROWS:+--rows "$TUNE_ROWS"} ${TUNE_TILES:+--tiles "$TUNE_TILES"} \
                   ${TUNE_SPLITS:+--splits "$TUNE_SPLITS"} ${TUNE_D:+--head-dim $TUNE_D} ${TUNE_FP8:+--fp8} \
                   ${TUNE_PAGE:+--page $TUNE_PAGE} --out "$R/$name.csv" > "$R/$name.txt" 2>&1
                 grep -v "^B .* grid " "$R/$name.txt" | tail -60 ;;
    check_sinks) timeout ${CHECK_TIMEOUT:-300} python3 -m vflash check --match sinks --log "$R/check_gpu_sinks.log" \
                   | tail -2 ;;
    fa_sinks) # issue 53: the fa sweep's forward with and without sinks (vflash_sinks), beside cuDNN, one run
              sampled fa_sinks timeout ${SWEEP_TIMEOUT:-200} python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} \
                --sweep fa --dtype bf16 \
                --methods vflash,vflash_sinks,sdpa_cudnn --out "$R/fa_sinks.csv" | tail -3 ;;
    bwd_sinks) sampled bwd_sinks timeout ${SWEEP_TIMEOUT:-300} python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} \
                 --mode bwd --sweep fa \
                 --dtype bf16 --methods vflash,vflash_sinks,sdpa_cudnn --out "$R/bwd_sinks.csv" | tail -3 ;;
    decode_sinks) # paged decode with and without sinks (pages of 16 and 64), beside cuDNN, one run
              sampled decode_sinks timeout ${SWEEP_TIMEOUT:-240} python3 -c "
import torch; from vflash.harness.serving import run_serving
run_serving('decode', '$R/decode_sinks.csv', torch.device('cuda'), methods=['vflash_paged16',
            'vflash_paged16_sinks', 'vflash_paged64', 'vflash_paged64_sinks', 'sdpa_cudnn'])" | tail -3 ;;
    check_fp8) timeout ${CHECK_TIMEOUT:-300} python3 -m vflash check --match fp8 --log "$R/check_gpu_fp8.log" | tail -2 ;;
    fa_fp8) # issue 54: the fa and d256 sweeps' forward in FP8 (vflash_fp8) beside bf16 vflash and cuDNN, one run
              sampled fa_fp8 timeout ${SWEEP_TIMEOUT:-200} python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} \
                --sweep fa --dtype bf16 --methods vflash,vflash_fp8,sdpa_cudnn --out "$R/fa_fp8.csv" | tail -3
              sampled d256_fp8 timeout ${SWEEP_TIMEOUT:-200} python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} \
                --sweep d256 --dtype bf16 --methods vflash,vflash_fp8,sdpa_cudnn --out "$R/d256_fp8.csv" | tail -3 ;;
    fp8_bars) # issue 54's two bar shapes (D 128 and D 256, N 16k, non-causal) in FP8 beside bf16 vflash and cuDNN
              for s in 1,16,16,16384,16384,128 1,8,8,16384,16384,256; do
                sampled "fp8_bar_${s//,/_}" timeout ${SWEEP_TIMEOUT:-90} python3 -m vflash bench --interleave \
                  --shape "$s" --dtype bf16 --methods vflash,vflash_fp8,sdpa_cudnn --out "$R/fp8_bar_${s//,/_}.csv" \
                  | tail -1
              done ;;
    check_sm90_forced) # the sm90 builds dispatch takes where forced only (tables.SM90_FORCED_ONLY): the FP8
              # cases, the v-head-dim ones (forward and backward) and MLA decode, the sm90 kernels forced (cases
              # they cannot take: refused, not run)
              for m in fp8 D128/64 D192/128 MLA; do
                timeout ${CHECK_TIMEOUT:-300} python3 -m vflash check --match "$m" --kernel sm90 \
                  --log "$R/check_gpu_sm90_${m//\//_}.log" | tail -1
              done ;;
    fp8_sm90) # the sm90 FP8 build checked and timed at the bar shapes; FP8_TILES: candidate tiles (the script's --tiles)
              timeout ${SWEEP_TIMEOUT:-200} python3 -m benchmarks.experiments.fp8_sm90 ${FP8_TILES:+--tiles $FP8_TILES} \
                > "$R/fp8_sm90.txt" 2>&1
              tail -20 "$R/fp8_sm90.txt" ;;
    check_mla) # issue 55: the GPU matrix's v-head-dim cases (forward and gradients: D 192 / 128, D 128 / 64) and MLA
               # decode on a latent cache ("MLA" cases)
              for m in D192/128 D128/64 MLA; do
                timeout ${CHECK_TIMEOUT:-300} python3 -m vflash check --match "$m" --log "$R/check_gpu_${m//\//_}.log" \
                  | tail -1
              done ;;
    mla_decode) # issue 55's MLA decode rows (Hq 16 memory-bound, Hq 128 compute-bound) beside SDPA on the unpacked
                # cache, vflash's GQA decode and the run's HBM read bandwidth; MLA_TILES=1: the latent path's candidate
                # tiles too; MLA_ROWS mem|compute|all; MLA_NQ new queries a sequence (files mla_decode_nqN.*,
                # which report.py does not read: a run's NOTE cites them)
              name=mla_decode${MLA_NQ:+_nq$MLA_NQ}
              sampled $name timeout ${SWEEP_TIMEOUT:-400} python3 -m benchmarks.experiments.mla_decode \
                --rows ${MLA_ROWS:-all} ${MLA_TILES:+--tiles} ${MLA_NQ:+--nq $MLA_NQ} --out "$R/$name.csv" \
                > "$R/$name.txt" 2>&1
              tail -40 "$R/$name.txt" ;;
    vhead_prefill) # issue 55's prefill row: v head dims unlike q's (192 / 128, 128 / 64, 256 / 128) through the dispatch
                   # and the sm90 kernel forced, beside SDPA's backends and vflash's D 128 (VHEAD_DIMS "Dqk/Dv ...")
              sampled vhead_prefill timeout ${SWEEP_TIMEOUT:-400} python3 -m benchmarks.experiments.vhead_prefill \
                --dims ${VHEAD_DIMS:-192/128 128/64 256/128} --out "$R/vhead_prefill.csv" > "$R/vhead_prefill.txt" 2>&1
              tail -40 "$R/vhead_prefill.txt" ;;
    decode_sinks_ab) # issue 53: paged decode with and without sinks on the same inputs, over input draws (DECODE_ROWS
                     # "B:KV", default 1:1024 8:1024 1:8192)
              timeout ${SWEEP_TIMEOUT:-300} python3 -m benchmarks.experiments.decode_sinks_ab \
                ${DECODE_ROWS:+--rows $DECODE_ROWS} --out "$R/decode_sinks_ab.csv" > "$R/decode_sinks_ab.txt" 2>&1
              tail -8 "$R/decode_sinks_ab.txt" ;;
    fp8_varlen_bisect) # the FP8 varlen check case's features one at a time on the forced sm90 kernel (each in its
                       # own process), then the case under compute-sanitizer
              timeout 300 python3 -m benchmarks.experiments.fp8_varlen_bisect > "$R/fp8_varlen_bisect.txt" 2>&1
              VFLASH_KERNEL=sm90 timeout 200 compute-sanitizer --print-limit 4 python3 -m \
                benchmarks.experiments.fp8_varlen_bisect --one case > "$R/fp8_varlen_sanitizer.txt" 2>&1
              cat "$R/fp8_varlen_bisect.txt"; grep -m12 -i "error\|illegal\|at 0x\|by thread" "$R/fp8_varlen_sanitizer.txt" ;;
    decode_fp8) # issue 54: paged decode from an FP8 cache against the bf16 cache (pages of 16 and 64), beside cuDNN
              sampled decode_fp8 timeout ${SWEEP_TIMEOUT:-240} python3 -c "
import torch; from vflash.harness.serving import run_serving
run_serving('decode', '$R/decode_fp8.csv', torch.device('cuda'), methods=['vflash_paged16',
            'vflash_paged16_fp8', 'vflash_paged64', 'vflash_paged64_fp8', 'sdpa_cudnn'])" | tail -3 ;;
    tests_some) # a part of the GPU suite: TESTS (pytest arguments, split on spaces), TESTS_K (a -k expression,
                # spaces kept), TESTS_TIMEOUT seconds (default 300)
                gpu_tests pytest_gpu_some.txt "${TESTS_TIMEOUT:-300}" $TESTS ${TESTS_K:+-k "$TESTS_K"} ;;
    sm90_launcher) # the launcher's own Hopper tiles on the feature cases (oracle), then timed against the
            # portable kernel and SDPA
            timeout 300 python3 -m benchmarks.experiments.sm90_variants --variants launcher \
              --dims ${HOPPER_DIMS:-64,128,256} --n ${HOPPER_N:-1024,4096,16384} \
              > "$R/sm90_launcher.txt" 2>&1; tail -20 "$R/sm90_launcher.txt" ;;
    sm90_variants) timeout ${HOPPER_TIMEOUT:-300} python3 -m benchmarks.experiments.sm90_variants \
              --dims ${HOPPER_DIMS:-64,128,256} --n ${HOPPER_N:-1024,4096,16384} --causal ${HOPPER_CAUSAL:-0,1} \
              --variants "${HOPPER_VARIANTS:-}" \
              ${HOPPER_TIME_ONLY:+--time-only} ${HOPPER_ARTICLE:+--article} ${HOPPER_GRAPHS:+--graphs} \
              --rounds ${HOPPER_ROUNDS:-1} \
              >> "$R/sm90_variants.txt" 2>&1
               tail -40 "$R/sm90_variants.txt" ;;
    profile_sm90) # Nsight Compute on one launch of the sm90 kernel per shape
             # ("D:N[:causal[:Q buffers[:tiles]]]", PROFILE_SHAPES; e.g. 128:512:causal:2, or
             # 128:1024:causal::short for one consumer a CTA).
             # PROFILE_BACKWARD=1: forward and backward calls, the kernel PROFILE_KERNEL (default
             # dkdv_sm90; dq_sm90 the other) profiled. PROFILE_FP8=1: e4m3 inputs, the FP8 build forced.
             for shape in ${PROFILE_SHAPES:-64:16384 128:16384 128:512:causal}; do
               IFS=: read -r d n c qb tl <<< "$shape"; name=prof_d${d}_n${n}${c:+_$c}${qb:+_q$qb}${tl:+_$tl}
               name=${name}${PROFILE_FP8:+_fp8}
               kernel=sm90
               if [ -n "${PROFILE_BACKWARD:-}" ]; then kernel=${PROFILE_KERNEL:-dkdv_sm90}; name=${name}_$kernel; fi
               timeout 240 ncu --clock-control none --set full --import-source yes -k regex:$kernel --launch-skip 3 \
                 --launch-count 1 -f -o "/tmp/$name" python3 -m benchmarks.experiments.profile_sm90 --d "$d" \
                 --n "$n" ${c:+--causal} ${qb:+--q-buffers $qb} ${tl:+--tiles $tl} \
                 ${PROFILE_BACKWARD:+--backward} ${PROFILE_FP8:+--fp8} > "$R/$name.log" 2>&1
               ncu -i "/tmp/$name.ncu-rep" --page details --print-details all > "$R/$name.details.txt" 2>&1
               ncu -i "/tmp/$name.ncu-rep" --page raw --csv > "$R/$name.raw.csv" 2>&1
               ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$R/$name.sass.csv" 2>&1
               python3 -m benchmarks.experiments.ncu_summary "$R/$name.details.txt" "$R/$name.sass.csv" \
                 > "$R/$name.summary.txt" 2>&1
               tail -3 "$R/$name.log"; grep -i -m3 "duration\|pipe" "$R/$name.details.txt"
             done ;;
    profile_mla) # Nsight Compute's full set on one launch of the sm90 MLA kernel per row (PROFILE_MLA "Hq:B:KV",
                 # default a compute-bound row and a memory-bound one): tensor-pipe, shared-memory and stall figures
             for row in ${PROFILE_MLA:-128:64:4096 16:32:4096}; do
               IFS=: read -r hq b kv <<< "$row"; name=prof_mla_h${hq}_b${b}_kv${kv}
               timeout 240 ncu --clock-control none --set full --import-source yes -k regex:mla_decode --launch-skip 2 \
                 --launch-count 1 -f -o "/tmp/$name" python3 -m benchmarks.experiments.profile_mla --hq "$hq" \
                 --b "$b" --kv "$kv" > "$R/$name.log" 2>&1
               ncu -i "/tmp/$name.ncu-rep" --page details --print-details all > "$R/$name.details.txt" 2>&1
               ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$R/$name.sass.csv" 2>&1
               python3 -m benchmarks.experiments.ncu_summary "$R/$name.details.txt" "$R/$name.sass.csv" \
                 > "$R/$name.summary.txt" 2>&1
               tail -2 "$R/$name.log"; head -30 "$R/$name.summary.txt"
             done ;;
    bwd_sm90) # the sm_90 backward kernels against the portable ones (BWD_ROWS "D:N:causal", HOPPER_DQ_TILES /
                # HOPPER_DKDV_TILES "m:n ...", BWD_APART=1: dK and dV apart, D 256; BWD_GRAPHS=1: CUDA graph replays,
                # BWD_ROUNDS=R: the dK / dV tiles and the whole backward R times, in turn; BWD_PAIRED=1: the whole
                # backward for each dQ / dK-dV tile pair)
             timeout ${TUNE_TIMEOUT:-300} python3 -m benchmarks.experiments.bwd_sm90 ${BWD_ROWS:+--rows $BWD_ROWS} \
               ${HOPPER_DQ_TILES:+--tiles $HOPPER_DQ_TILES} ${HOPPER_DKDV_TILES:+--dkdv-tiles $HOPPER_DKDV_TILES} \
               ${BWD_APART:+--apart} ${BWD_GRAPHS:+--graphs} ${BWD_PAIRED:+--paired} \
               ${BWD_ROUNDS:+--rounds $BWD_ROUNDS} --out "$R/bwd_sm90${BWD_APART:+_apart}.csv" \
               >> "$R/bwd_sm90${BWD_APART:+_apart}.txt" 2>&1
             tail -30 "$R/bwd_sm90${BWD_APART:+_apart}.txt" ;;
    decode_host) # a planned decode call's host time in pieces (key, lookup, allocations, launches;
                 # DECODE_ROWS "B:KV")
             timeout ${TUNE_TIMEOUT:-200} python3 -m benchmarks.experiments.decode_host \
               ${DECODE_ROWS:+--rows $DECODE_ROWS} --out "$R/decode_host.csv" > "$R/decode_host.txt" 2>&1
             tail -20 "$R/decode_host.txt" ;;
    bwd_host) # a short backward's host cost and GPU time (eager, CUDA graph, per-call host us; BWD_ROWS "D:N:causal")
             timeout ${TUNE_TIMEOUT:-200} python3 -m benchmarks.experiments.bwd_host ${BWD_ROWS:+--rows $BWD_ROWS} \
               --out "$R/bwd_host.csv" > "$R/bwd_host.txt" 2>&1; tail -20 "$R/bwd_host.txt" ;;
    profile_decode) # Nsight Compute per launch of decode's kernels (PROFILE_DECODE rows "B:KV") for the library
                    # of each tree of PROFILE_TREES (source dirs, default "src"; e.g. ".ab/old/src src");
                    # PROFILE_SINKS=1: with a sink a head
             for t in ${PROFILE_TREES:-src}; do for row in ${PROFILE_DECODE:-1:1024 1:8192 8:8192 128:1024}; do
               IFS=: read -r b kv <<< "$row"
               name=prof_decode_b${b}_kv${kv}${PROFILE_SINKS:+_sinks}$( [ "$t" = src ] || echo "_$(basename "$(dirname "$t")")" ).csv
               PYTHONPATH=$PWD/$t:$PWD timeout 120 ncu --csv \
                 --metrics \
                 gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
                 python3 -m benchmarks.experiments.profile_decode --b "$b" --kv "$kv" ${PROFILE_SINKS:+--sinks} \
                 > "$R/$name" 2>&1
               echo "$t B $b KV $kv"; grep -v "^==" "$R/$name" | grep gpu__time | cut -c1-220 | tail -6
             done; done ;;
    profile_decode_full) # Nsight Compute's full set (unlocked clocks) on the last launch of each PROFILE_METHODS
                    # method (paged contiguous sdpa_cudnn) at each PROFILE_DECODE row: what a decode kernel stalls on;
                    # PROFILE_FP8=1: vflash's methods on e4m3 caches
             for row in ${PROFILE_DECODE:-1:8192}; do for m in ${PROFILE_METHODS:-paged contiguous sdpa_cudnn}; do
               IFS=: read -r b kv <<< "$row"
               fp8=; [ -n "${PROFILE_FP8:-}" ] && [ "$m" != sdpa_cudnn ] && fp8=--fp8
               name=prof_full_${m}${fp8:+_fp8}_b${b}_kv${kv}.txt
               timeout 150 ncu --set full --clock-control none -k "regex:attention|sdpa|fmha|cudnn|flash" \
                 --launch-skip 2 --launch-count 2 python3 -m benchmarks.experiments.profile_decode --b "$b" \
                 --kv "$kv" --method "$m" --calls 4 $fp8 > "$R/$name" 2>&1
               echo "$m $fp8 B $b KV $kv"
               grep -E -e "^  [a-zA-Z_]+.*\(|Duration|DRAM Throughput|Registers Per|Grid Size|Block Size" \
                 -e "Achieved Occupancy|Dynamic Shared|Static Shared" "$R/$name" | head -14
             done; done ;;
    decode_trees) # decode GB/s of the library of each tree of AB_TREES (source dirs), alternating, two rounds
               # (DECODE_ROWS "B:KV", DECODE_METHODS comma-separated)
        for r in 1 2; do for t in ${AB_TREES:-src}; do
          PYTHONPATH=$PWD/$t:$PWD timeout 120 python3 -m benchmarks.experiments.decode_trees --label "$t" \
            ${DECODE_ROWS:+--rows $DECODE_ROWS} ${DECODE_METHODS:+--methods $DECODE_METHODS} --out "$R/decode_trees.csv"
        done; done >> "$R/decode_trees.txt" 2>&1; tail -30 "$R/decode_trees.txt" ;;
    ab_trees) # ab_trees (this checkout's) on the library of each tree of AB_TREES (source dirs, e.g.
        # ".ab/old/src src"), alternating, two rounds
        for r in 1 2; do for t in ${AB_TREES:-src}; do
          PYTHONPATH=$PWD/$t:$PWD timeout 80 python3 -m benchmarks.experiments.ab_trees --label "$t" \
            ${AB_SHAPES:+--shapes "$AB_SHAPES"}
        done; done >> "$R/ab.txt" 2>&1; tail -40 "$R/ab.txt" ;;
    clocks) # SM clock, power and throttle reasons sampled every 100 ms (clocks_shape.csv) during one fp16 and
            # one bf16 bench of CLOCKS_SHAPE (default the fa sweep's D = 128 non-causal N = 8192 row)
            SAMPLE_MS=100 sampled shape timeout 120 python3 -m vflash bench ${BENCH_INTERLEAVE:+--interleave} \
              --shape ${CLOCKS_SHAPE:-2,16,16,8192,8192,128} --dtype fp16,bf16 --methods vflash,sdpa_cudnn \
              --out "$R/clocks_bench.csv" | tail -4 ;;
    host_sm90) timeout 90 python3 -m benchmarks.experiments.host_sm90 > "$R/host_sm90.txt" 2>&1
                 cat "$R/host_sm90.txt" ;;
    host_sm90_old) # the same host measurement by the tree in HOST_OLD, its script and its library (a copy of an
              # older checkout, e.g. .ab/old made by `git archive <commit> src benchmarks | tar -x -C .ab/old`;
              # carry it), for a same-run before/after
              # (a tree from before the sm90 rename has the script as host_hopper)
              (cd "${HOST_OLD:-.ab/old}" && script=host_sm90 && \
                { [ -f benchmarks/experiments/host_sm90.py ] || script=host_hopper; } && \
                PYTHONPATH=$PWD/src:$PWD timeout 90 python3 -m "benchmarks.experiments.$script") \
                > "$R/host_sm90_old.txt" 2>&1; cat "$R/host_sm90_old.txt" ;;
    tune_split) timeout 200 python3 benchmarks/tune.py --split > "$R/tune_split.txt" 2>&1; cat "$R/tune_split.txt" ;;
    tune_article_d256) timeout 200 python3 benchmarks/tune.py --article > "$R/tune_article.txt" 2>&1
                timeout 200 python3 benchmarks/tune.py --d256 > "$R/tune_d256.txt" 2>&1
                cat "$R/tune_article.txt" "$R/tune_d256.txt" ;;
    *) echo "unknown step $step; steps:" $STEPS >&2 ;;
  esac
  # Pack after every step: if the call is cut short, what finished still comes back.
  tar -C "$OUT" -czf "$OUT/results.tar.gz.tmp" results && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$R/nvidia-smi.txt"
tar -C "$OUT" -czf "$OUT/results.tar.gz" results && rm -rf "$R"
echo "== packed $(date -u +%H:%M:%S)"
