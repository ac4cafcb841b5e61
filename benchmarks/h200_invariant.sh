#!/usr/bin/env bash
# Issue 16's lease on the H200 (benchmarks/RESULTS.md, "Batch-invariant rows"): with the GGUF chunks carried
# and llama.cpp built in the background from the first call (benchmarks/llama_cpp_peer.py's build into
# /root/w/peers), measure in one lease
#   1. the gpu-marked kernel tests (bit-identical rows for T = 1..64 among them);
#   2. benchmarks/gpu_speed.py --phases dfvg: DFVG plain and speculative (k = 4) through Engine.decode, with
#      spec_identical_to_plain over the 20 held-out prompts;
#   3. --phases llama_cpp: llama-bench BF16 / Q4_K_M and llama-speculative with the 0.5B draft;
#   4. --phases report: one table and gpu_speed.json.
# Usage there: bash benchmarks/h200_invariant.sh /root/g OUT_DIR
set -euo pipefail
chunks=$1 out=$2
cd "$(dirname "$0")/.."
draft_weights=$(ls drafts/*/model.safetensors)
# shellcheck source=benchmarks/h200_weights.sh
source benchmarks/h200_weights.sh
python3 -m pytest -q -m gpu tests/test_gpu_fused.py tests/test_gpu_graphs.py tests/test_gpu_kernels.py \
  > "$out/gpu_tests.log" 2>&1 || true
tail -3 "$out/gpu_tests.log"
python3 scripts/download_models.py --cache-dir /root/cache 2>&1 | tail -2
common=(--gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20
        --results /root/res --out "$out" --llama-src /root/peers.tar.gz)
python3 benchmarks/gpu_speed.py --phases dfvg --ks 4 "${common[@]}" 2>&1 | tee "$out/gpu_speed_dfvg.log"
python3 benchmarks/gpu_speed.py --phases llama_cpp "${common[@]}" 2>&1 | tee "$out/gpu_speed_llama.log"
python3 benchmarks/gpu_speed.py --phases report "${common[@]}" 2>&1 | tee "$out/gpu_speed_report.log"
echo DONE
