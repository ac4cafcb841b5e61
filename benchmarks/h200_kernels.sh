#!/usr/bin/env bash
# Issue 16 on random weights of the 1.5B target's shapes, in one job that carries no weights (one call with the
# tree, then polling): the GPU tests of the fused layers (every row-invariance case, the attention merge and split
# widths at 16,400 tokens, TMA weight tiles), the step with TMA weight tiles against per-thread loads at 512 and 32k
# tokens (with the shipped table and one a stage deeper), what each launch kind adds to the replayed step in its
# graph (step_timeline.py at 512 and 32,704 tokens), the step's cost at 512 to 32k tokens with the shipped attention
# beside the 64-split merge, 128-slot splits and 8 split programs a SM (gpu_rows.py modes, plotted), ncu of the 32k
# step's first launches and of the gate/up launch with its source counters (H100s; an H200 says why not in one
# line), and last the prefill paths against one eager cuBLAS pass (gpu_decode.py --prefill-only; issue 16, item 2).
# First ran on an H100, 2026-12-07 15:48 UTC (benchmarks/RESULTS.md).
#
#   carry: nothing past the tree (move drafts/ and the dated result folders out first: the tree must be < 64 MiB)
#   (setsid nohup bash benchmarks/h200_kernels.sh /root/kout > /root/k.log 2>&1 &)
# OUT must not be /root/out (the device tool's, emptied each call).
set -euo pipefail
chunks=""
out=$1
source "$(dirname "$0")/lease_start.sh" /root/repo_k  # the repository copy and the GPU's name (no weights)
python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_weight_tiles.py tests/test_gpu_fused.py \
  > "$out/gpu_tests.log" 2>&1 || echo "some GPU test failed (gpu_tests.log)"
echo "GPU_TESTS_DONE $(date -u +%T)"
# TMA's copies take less shared memory a stage (gpu/compile_sm90.py --tma): the "given" table is the Hopper one with a
# stage more for QKV, gate/up and O and 8 for down, timed with and without TMA (with TMA, QKV and gate/up keep 2
# programs a SM, 1 with per-thread loads; O drops from 3 to 2 either way)
mkdir -p "$out/tma" && cat > "$out/tma/deeper.json" <<'EOF'
[[2048, 1536, {"BN": 64, "BK": 128, "SPLIT_K": 4, "num_warps": 8, "num_stages": 4, "SWAP_AB": 1}],
 [1536, 1536, {"BN": 64, "BK": 128, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4, "SWAP_AB": 1}],
 [8960, 1536, {"BN": 64, "BK": 128, "SPLIT_K": 1, "num_warps": 8, "num_stages": 4, "SWAP_AB": 1}],
 [1536, 8960, {"BN": 64, "BK": 64, "SPLIT_K": 4, "num_warps": 4, "num_stages": 8, "SWAP_AB": 1}]]
EOF
python3 benchmarks/gpu_rows.py --modes-only --mode-contexts 512,32704 --tuned "$out/tma/deeper.json" \
  --modes "K/V shared, 4 split programs per SM (shipped);shipped, weights through TMA;shipped with the given block sizes;given block sizes, weights through TMA" \
  --out "$out/tma" > "$out/tma.log" 2>&1 || echo "the TMA run failed (tma.log)"
echo "TMA_DONE $(date -u +%T)"
python3 benchmarks/step_timeline.py --rows 1,5,16,64 --contexts 512,32704 --out "$out/timeline" \
  > "$out/timeline.log" 2>&1 || echo "the timeline run failed (timeline.log)"
echo "TIMELINE_DONE $(date -u +%T)"
python3 benchmarks/gpu_rows.py --modes-only --mode-contexts 512,2048,8192,32704 \
  --modes "K/V shared, 4 split programs per SM (shipped);shipped, attention merging 64 splits a step (16 where a row's positions fill up to 16), 32 columns a program;shipped, attention splits of 128 cache slots;shipped, 8 split programs per SM" \
  --out "$out/contexts" > "$out/contexts.log" 2>&1 || echo "the context run failed (contexts.log)"
echo "CONTEXTS_DONE $(date -u +%T)"
python3 benchmarks/ncu_step.py --rows 1,5 --kernels 14 --context 32704 --out "$out/ncu" > "$out/ncu.log" 2>&1 || \
  echo "ncu did not run (ncu.log)"
python3 benchmarks/ncu_step.py --launch w13 --rows 1 --out "$out/ncu_w13" > "$out/ncu_w13.log" 2>&1 || \
  echo "ncu of gate/up did not run (ncu_w13.log)"
echo "NCU_DONE $(date -u +%T)"
timeout 300 python3 benchmarks/gpu_decode.py --prefill-only --models qwen2.5-coder-1.5b --out "$out/prefill" \
  > "$out/prefill.log" 2>&1 || echo "the prefill run failed (prefill.log)"
echo "PREFILL_DONE $(date -u +%T)"
