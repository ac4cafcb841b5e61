#!/usr/bin/env bash
# The next lease for issues 15 and 16, in one job: the GPU tests still owed (the 256-split attention merge at 16,400
# tokens, splits of 128 cache slots, the block head's CUDA test), then the shipped block feature head timed beside
# DFVG plain, the distilled draft and the chain head on the 20 held-out HumanEval prompts and on held-out ShareGPT
# (k = 4, bf16, greedy, one gpu_speed run each, every row through Engine.decode), then its int8 FPGA datapath
# (emulated on the GPU, sync, k = 4; board time modeled) on the HumanEval prompts; then the step's cost at 512 to 32k
# tokens, the 64-split merge and splits of 128 cache slots beside the shipped step, ncu at 32k and the step's
# timeline (what each launch adds in the graph, step_timeline.py); last, the prefill paths (issue 16, item 2: prefill
# at least at cuBLAS speed; `graphs.LONG_PROMPT` = 512 is still an estimate).
#
#   carry: .chunks/p (device_pack.py: the target GGUF and the three shipped drafts, one chunk a call),
#          .chunks/prompts.json (gpu_speed.py --write-prompts), .chunks/sharegpt_test.json
#          (feature_head_fpga.py --write-prompts), .whl
#   (setsid nohup bash benchmarks/h200_block_head.sh /root/p /root/bout > /root/bh.log 2>&1 &)
# OUT must not be /root/out (the device tool's, emptied each call).
set -euo pipefail
chunks=$1
out=$2
source "$(dirname "$0")/lease_start.sh" /root/repo_b  # the repository copy, the GPU's name, the weights
D=drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768
python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_gpu_fused.py tests/test_block_feature_head.py \
  > "$out/gpu_tests.log" 2>&1 || echo "some GPU test failed (gpu_tests.log)"
echo "GPU_TESTS_DONE $(date -u +%T)"
common=(--phases dfvg --ks 4 --one-kernel --trees "" --skip-draft --feature-head "$D-fh" --distilled-draft "$D"
        --extra-heads "$D-fh-b4" --gguf-dir /root/cache/gguf --work-dir /root/w --prompts 20)
for split in prompts sharegpt_test; do
  python3 benchmarks/gpu_speed.py "${common[@]}" --prompts-file ".chunks/$split.json" --results "/root/speed_$split" \
    --out "$out/$split" 2>&1 | grep -v "it/s\]" | tee "$out/$split.log" || echo "the $split run failed ($split.log)"
  python3 benchmarks/speed_breakdown.py "$out/$split/dfvg.json" | tee "$out/${split}_breakdown.txt" || \
    echo "no breakdown of the $split run"
done
python3 benchmarks/gpu_speed.py --phases fpga --fpga-head "$D-fh-b4" --fpga-ks 4 --skip-draft --gguf-dir /root/cache/gguf \
  --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20 --results /root/fpga --out "$out/fpga" \
  > "$out/fpga.log" 2>&1 || echo "the FPGA phase failed (fpga.log)"
echo "BLOCK_HEAD_DONE $(date -u +%T)"
# issue 16's cost against context with the 256-split merge, and with 128-slot splits (random weights of the target's
# shapes; ms against context plotted in contexts/), then the 32k step's first launches under ncu (H100s; an H200 says why not)
python3 benchmarks/gpu_rows.py --modes-only --mode-contexts 512,2048,8192,32704 \
  --modes "K/V shared, 8 split programs per SM (shipped);shipped, attention merging 64 splits a step (16 where a row's positions fill up to 16), 32 columns a program;shipped, attention splits of 128 cache slots;shipped, 4 split programs per SM" \
  --out "$out/contexts" > "$out/contexts.log" 2>&1 || echo "the context run failed (contexts.log)"
python3 benchmarks/ncu_step.py --rows 1,5 --kernels 14 --context 32704 --out "$out/ncu" > "$out/ncu.log" 2>&1 || \
  echo "ncu did not run (ncu.log)"
echo "CONTEXTS_DONE $(date -u +%T)"
# what each launch kind adds to the replayed step in its graph (CUPTI; ncu above times each kernel alone)
python3 benchmarks/step_timeline.py --rows 1,5,16,64 --contexts 512,32704 --out "$out/timeline" \
  > "$out/timeline.log" 2>&1 || echo "the timeline run failed (timeline.log)"
timeout 300 python3 benchmarks/gpu_decode.py --prefill-only --models qwen2.5-coder-1.5b --out "$out/prefill" \
  > "$out/prefill.log" 2>&1 || echo "the prefill run failed (prefill.log)"
echo "PREFILL_DONE $(date -u +%T)"
