#!/usr/bin/env bash
# Issue 16 on random weights of the 1.5B target's shapes, in one job that carries no weights (one call with the
# tree, then polling): the GPU tests of the fused layers (every row-invariance case, TMA weight tiles, QKV's and O's
# weights loaded before the wait, the graphed forward with every early trigger, the streaming-ahead launches), then
# the shipped step (early triggers up to 16 rows, the attention split's up to 128 splits) beside every launch
# triggering at its exit, QKV's and O's weights loaded before the wait (fused.WEIGHTS_AHEAD) and the triggers
# unbounded, at 512, 2,048, 8,192 and 32,704 tokens (gpu_rows.py modes), and what each launch kind adds to the
# replayed step in its graph (step_timeline.py).
# Earlier versions of this job ran on an H100, 2026-12-07 15:48 UTC (TMA, 128-slot splits, ncu, prefill paths) and
# 18:04 UTC (the weights-ahead and trigger modes); benchmarks/RESULTS.md, the copies that ran are job.sh.txt in
# benchmarks/h100_2026-12-07_kernels/ and benchmarks/h100_2026-12-07_ahead/.
#
#   carry: nothing past the tree (move drafts/ and the dated result folders out first: the tree must be < 64 MiB)
#   (setsid nohup bash benchmarks/h200_kernels.sh /root/kout > /root/k.log 2>&1 &)
# OUT must not be /root/out (the device tool's, emptied each call).
set -euo pipefail
chunks=""
out=$1
source "$(dirname "$0")/lease_start.sh" /root/repo_k  # the repository copy and the GPU's name (no weights)
python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_weight_tiles.py tests/test_gpu_fused.py \
  tests/test_stream_ahead.py > "$out/gpu_tests.log" 2>&1 || echo "some GPU test failed (gpu_tests.log)"
echo "GPU_TESTS_DONE $(date -u +%T)"
python3 benchmarks/gpu_rows.py --modes-only --mode-contexts 512,2048,8192,32704 \
  --modes "K/V shared, 4 split programs per SM (shipped);shipped, each launch triggering the next at its exit;shipped, QKV and O weights before the wait, early trigger up to 16 rows, the split's up to 128 splits;shipped, next launch triggered after the weight loop, the attention split's too" \
  --out "$out/triggers" > "$out/triggers.log" 2>&1 || echo "the trigger run failed (triggers.log)"
echo "TRIGGERS_DONE $(date -u +%T)"
python3 benchmarks/step_timeline.py --rows 1,5,16,64 --contexts 512 --out "$out/timeline" \
  > "$out/timeline.log" 2>&1 || echo "the timeline run failed (timeline.log)"
python3 benchmarks/step_timeline.py --rows 1,64 --contexts 512 --out "$out/timeline_exit" \
  --mode "shipped, each launch triggering the next at its exit" \
  > "$out/timeline_exit.log" 2>&1 || echo "the timeline run failed (timeline_exit.log)"
echo "TIMELINE_DONE $(date -u +%T)"
