#!/usr/bin/env bash
# Token trees on the H200 (benchmarks/RESULTS.md, issue 15): the target from the carried GGUF chunks (the
# shipped distilled draft travels in drafts/), installed as a user does, then benchmarks/tree_tau.py on CUDA
# (eager fp32: trees verify on the eager model) for the chain and three tree shapes.
# Usage there: bash benchmarks/h200_tree_tau.sh CHUNKS_DIR OUT_DIR PROMPTS
set -euo pipefail
chunks=$1 out=$2 prompts=$3
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /root/cache/gguf "$out"
cat "$chunks"/c* > /root/all.bin  # not piped into head: with pipefail, cat's SIGPIPE would end the script
head -c 1117320768 /root/all.bin > /root/cache/gguf/qwen2.5-coder-1.5b-instruct.gguf
rm /root/all.bin
sha256sum /root/cache/gguf/qwen2.5-coder-1.5b-instruct.gguf drafts/*/model.safetensors > "$out/sha256.txt"
python3 scripts/download_models.py --cache-dir /root/cache --only target 2>&1 | tail -2
python3 benchmarks/tree_tau.py --device cuda --prompts "$prompts" --max-new-tokens 128 \
  --shapes 2,2,1,1 4,2,1,1 dynamic:16 --output "$out/tree_tau.json" 2>&1 | tee "$out/tree_tau.log"
echo DONE
