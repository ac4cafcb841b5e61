#!/usr/bin/env bash
# The lease of 2026-12-04 (afternoon) on the H200 (benchmarks/RESULTS.md, "Token trees on the graph path"):
# with the GGUF chunks carried to $chunks and llama.cpp built in the background from the first call
# (benchmarks/llama_cpp_peer.py's build into /root/w/peers), measure in one lease, on the 20 held-out prompts:
#   1. the gpu-marked tests (tree attention and bf16 trees == plain decoding among them);
#   2. gpu_speed --phases dfvg --ks 4: DFVG plain, speculative and the device tree step (--trees' shapes) with
#      the 0.5B and the distilled draft, through Engine.decode;
#   3. --phases llama_cpp: llama-bench BF16 / Q4_K_M, llama-speculative with the 0.5B draft;
#   4. dfvg generate --device cuda on one held-out prompt: no draft, the distilled chain, its dynamic:16 tree;
#   5. --phases hf_eager,hf_static and hf_assist at k = 4 (HF's best k on 2026-12-03);
#   6. --phases report after 3 and again at the end (one table, gpu_speed.json).
# It copies the repository first, so calls made while it runs may resync the working tree.
# Usage there: setsid nohup bash benchmarks/h200_trees.sh /root/g /root/out > /root/lease.log 2>&1 &
set -euo pipefail
chunks=$1 out=$2
rm -rf /root/repo && cp -r "$(dirname "$0")/.." /root/repo && cd /root/repo
draft_weights=$(ls drafts/*/model.safetensors)
# shellcheck source=benchmarks/h200_weights.sh
source benchmarks/h200_weights.sh
python3 -m pytest -q -m gpu tests/test_tree_device.py tests/test_gpu_fused.py tests/test_gpu_graphs.py \
  tests/test_gpu_kernels.py > "$out/gpu_tests.log" 2>&1 || true
tail -3 "$out/gpu_tests.log"
python3 scripts/download_models.py --cache-dir /root/cache 2>&1 | tail -2
common=(--gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20
        --results /root/res --out "$out" --llama-src /root/peers.tar.gz)
python3 benchmarks/gpu_speed.py --phases dfvg --ks 4 --one-kernel "${common[@]}" 2>&1 | tee "$out/gpu_speed_dfvg.log"
python3 benchmarks/gpu_speed.py --phases llama_cpp,report "${common[@]}" 2>&1 | tee "$out/gpu_speed_llama.log"
# shellcheck source=benchmarks/h200_generate.sh
source benchmarks/h200_generate.sh
python3 benchmarks/gpu_speed.py --phases hf_eager,hf_static,hf_assist,report --ks 4 "${common[@]}" 2>&1 \
  | tee "$out/gpu_speed_hf.log"
echo DONE
