#!/usr/bin/env bash
# Issue 14's lease on the H200 (benchmarks/RESULTS.md, "One engine"): assemble the carried GGUF chunks, install
# the pair the way a user does (scripts/download_models.py), then, in one lease, measure
#   1. benchmarks/gpu_speed.py --phases dfvg: DFVG plain (and spec) through Engine.decode, the benchmark's rows;
#   2. the seed's job on one GPU: python scripts/run_experiments.py --config configs/gpu.yaml;
#   3. dfvg generate --device cuda on one held-out prompt: --no-draft, distilled draft, 0.5B draft (--json);
# after the gpu-marked engine tests (graphs, device batches, fused layers, kernels) in the background.
# Usage there: bash benchmarks/h200_one_engine.sh /root/p OUT_DIR   (device_pack.py's chunks: h200_weights.sh)
set -euo pipefail
chunks=$1 out=$2
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/h200_weights.sh
source benchmarks/h200_weights.sh
python3 -m pytest -q -m gpu tests/test_gpu_graphs.py tests/test_gpu_kernels.py tests/test_gpu_fused.py \
  > "$out/gpu_tests.log" 2>&1 || true
tail -3 "$out/gpu_tests.log"
python3 scripts/download_models.py --cache-dir /root/cache 2>&1 | tail -4
python3 benchmarks/gpu_speed.py --phases dfvg --ks 4 --gguf-dir /root/cache/gguf --work-dir /root/w \
  --prompts-file .chunks/prompts.json --prompts 20 --results /root/res --out "$out" 2>&1 | tee "$out/gpu_speed.log"
python3 scripts/run_experiments.py --config configs/gpu.yaml --output /root/results 2>&1 | tee "$out/run_experiments.log"
cp /root/results/gpu-*/performance_summary.json "$out/"
prompt=$(python3 -c "import json; print(json.loads(open('data/humaneval-heldout.jsonl').readline())['prompt'])")
for draft in none models/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768 models/qwen2.5-coder-0.5b-instruct; do
  flags=(--no-draft); [ "$draft" = none ] || flags=(--draft "$draft" --draft-length 4)
  python3 -m dfvg generate --target models/qwen2.5-coder-1.5b-instruct "${flags[@]}" --device cuda \
    --raw-prompt --prompt "$prompt" --max-new-tokens 128 --json > "$out/generate-$(basename "$draft").json"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stats']; print(sys.argv[1], round(s['tokens_per_second'],1), 'tok/s, warmup', round(s['warmup_s'],1), 's, tau', round(s['mean_accepted_length'],2))" "$out/generate-$(basename "$draft").json"
done
echo DONE
