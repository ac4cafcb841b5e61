#!/usr/bin/env bash
# Issue 16's lease script (benchmarks/RESULTS.md, "programmatic dependent launch, re-swept block sizes"), in two
# parts so the kernel measurements run while the GGUF chunks travel. OUT must not be /root/out: that is the
# device tool's $OUT, emptied at every call (the 2026-12-04 lease lost its first part to it).
#
#   bash benchmarks/h200_pdl.sh kernels OUT          # first call (no model weights needed):
#     1. the gpu-marked kernel, graph and tree tests (bit-identical rows for T = 1..64 among them);
#     2. benchmarks/gpu_rows.py --sweep: block sizes per weight shape (PDL on), the T = 1 / 5 / 16 step with
#        PDL off / on / on + the sweep's block sizes side by side, rows x contexts, invariance;
#        fastest_tuned.json = the block-size table of the faster whole step.
#   bash benchmarks/h200_pdl.sh pair CHUNKS OUT       # after the chunks arrived, with drafts/ carried:
#     3. waits for part 1, puts fastest_tuned.json into dfvg/gpu/block_sizes.py (what the product then runs:
#        `dfvg generate` and gpu_speed.py load the package's table, no --tuned);
#     4. gpu_speed --phases dfvg --ks 4 --trees 2,2,1,1: DFVG plain, chain and tree with the 0.5B and the
#        distilled draft on the 20 held-out prompts; --phases llama_cpp,report (llama.cpp built in the background
#        by a separate command of the first call, as for h200_trees.sh: llama_cpp_peer.build into /root/w/peers);
#     5. dfvg generate on one held-out prompt: plain and the distilled chain.
# Each part copies the repository first, so calls made while it runs may resync the working tree.
# Usage there: (setsid nohup bash benchmarks/h200_pdl.sh kernels /root/kout > /root/kernels.log 2>&1 &)
#             (setsid nohup bash benchmarks/h200_pdl.sh pair /root/g /root/pout > /root/pair.log 2>&1 &)
set -euo pipefail
part=$1
out=${*: -1}
case $out in /root/out | /root/out/*) echo "error: $out is the device tool's \$OUT, emptied at every call" >&2; exit 2;; esac
if [ "$part" = kernels ]; then
  trap 'echo KERNELS_FAILED' ERR
  rm -rf /root/repo_k && cp -r "$(dirname "$0")/.." /root/repo_k && cd /root/repo_k
  mkdir -p "$out"
  python3 -m pytest -q -m gpu tests/test_gpu_fused.py tests/test_tree_device.py tests/test_gpu_graphs.py \
    tests/test_gpu_kernels.py > "$out/gpu_tests.log" 2>&1 || true
  tail -3 "$out/gpu_tests.log"
  python3 benchmarks/gpu_rows.py --sweep --out "$out/rows" 2>&1 | tee "$out/rows.log"
  cp "$out/rows/fastest_tuned.json" /root/fastest_tuned.json
  echo KERNELS_DONE
  exit 0
fi
chunks=$2
mkdir -p "$out"
for _ in $(seq 1 360); do  # part 1 takes ~5 min; give up after 30
  grep -q KERNELS_DONE /root/kernels.log 2>/dev/null && break
  grep -q KERNELS_FAILED /root/kernels.log 2>/dev/null && { echo "error: the kernels part failed" >&2; exit 1; }
  sleep 5
done
grep -q KERNELS_DONE /root/kernels.log || { echo "error: no KERNELS_DONE in /root/kernels.log" >&2; exit 1; }
rm -rf /root/repo && cp -r "$(dirname "$0")/.." /root/repo && cd /root/repo
python3 - /root/fastest_tuned.json <<'EOF'
"""Write a tuned.json table into dfvg/gpu/block_sizes.py's TUNED literal."""
import json
import re
import sys
from pathlib import Path

rows = json.loads(Path(sys.argv[1]).read_text())
body = "".join(f"    ({n}, {k}): {json.dumps(c)},\n" for n, k, c in rows)
path = Path("dfvg/gpu/block_sizes.py")
text, count = re.subn(r"(TUNED: dict\[tuple\[int, int\], dict\] = \{\n)(.*?)(\n\})",
                      lambda m: m[1] + body.rstrip("\n") + m[3], path.read_text(), flags=re.S)
assert count == 1, "TUNED not found in dfvg/gpu/block_sizes.py"
path.write_text(text)
print("block sizes:", rows)
EOF
draft_weights=$(ls drafts/*/model.safetensors)
# shellcheck source=benchmarks/h200_weights.sh
source benchmarks/h200_weights.sh
python3 scripts/download_models.py --cache-dir /root/cache 2>&1 | tail -2
common=(--gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20
        --results /root/res --out "$out" --llama-src /root/peers.tar.gz)
python3 benchmarks/gpu_speed.py --phases dfvg --ks 4 --trees 2,2,1,1 "${common[@]}" 2>&1 \
  | tee "$out/gpu_speed_dfvg.log"
python3 benchmarks/gpu_speed.py --phases llama_cpp,report "${common[@]}" 2>&1 | tee "$out/gpu_speed_llama.log"
prompt=$(python3 -c "import json; print(json.loads(open('data/humaneval-heldout.jsonl').readline())['prompt'])")
distilled=models/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768
i=0
for flags in "--no-draft" "--draft $distilled --draft-length 4"; do
  i=$((i + 1)) name=$i$(echo "$flags" | tr -c 'a-z0-9\n' '_' | tail -c 24)
  # shellcheck disable=SC2086
  python3 -m dfvg generate --target models/qwen2.5-coder-1.5b-instruct $flags --device cuda --raw-prompt \
    --prompt "$prompt" --max-new-tokens 128 --json > "$out/generate$name.json" || true
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stats']; print(sys.argv[1], round(s['tokens_per_second'],1), 'tok/s, tau', round(s['mean_accepted_length'],2))" "$out/generate$name.json" || true
done
cp dfvg/gpu/block_sizes.py "$out/block_sizes.py.txt"
echo DONE
