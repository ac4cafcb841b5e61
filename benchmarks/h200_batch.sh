#!/usr/bin/env bash
# Second call of issue 14's work on the H200 (benchmarks/RESULTS.md): the same install as h200_one_engine.sh,
# the gpu-marked engine tests, then configs/gpu.yaml's baseline, speculative and batch variants (B = 4, 16).
# Usage there: bash benchmarks/h200_batch.sh /root/g /root/d/d00 OUT_DIR
set -euo pipefail
chunks=$1 draft_weights=$2 out=$3
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/h200_weights.sh
source benchmarks/h200_weights.sh
python3 -m pytest -q -m gpu tests/test_gpu_graphs.py tests/test_gpu_kernels.py 2>&1 | tail -3 > "$out/gpu_tests.log" &
tests=$!
python3 scripts/download_models.py --cache-dir /root/cache --only target 2>&1 | tail -2
wait $tests || true
sed -e 's/^variants: .*/variants: [baseline, speculative, batch]/' -e '/^extra_drafts:/d' configs/gpu.yaml > configs/gpu-batch.yaml
python3 scripts/run_experiments.py --config configs/gpu-batch.yaml --output /root/results > "$out/batch.log" 2>&1
cp /root/results/gpu-*/performance_summary.json "$out/batch_performance_summary.json"
echo DONE
