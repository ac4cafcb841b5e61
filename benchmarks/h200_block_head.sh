#!/usr/bin/env bash
# Issue 15's block feature head on the H200, in one job (after h200_kernels.sh, the weightless job for issue 16): its
# CUDA test, then the shipped block feature head timed beside DFVG plain, the distilled draft and the chain head on
# the 20 held-out HumanEval prompts and on held-out ShareGPT (k = 4, bf16, greedy, one gpu_speed run each, every row
# through Engine.decode), then its int8 FPGA datapath (emulated on the GPU, sync, k = 4; board time modeled) on the
# HumanEval prompts.
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
python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_block_feature_head.py \
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
