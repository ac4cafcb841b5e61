#!/usr/bin/env bash
# Issue 16 on random weights of the 1.5B target's shapes, in one job that carries no weights (one call with the
# tree, then polling): the GPU tests of the early triggers (the graphed forward with every trigger, O, gate/up and down
# at every row count among them), of the LM head's rows and of a head merged at once; then on the whole step
# (gpu_rows.py modes at 512, 2,048, 8,192 and 32,704 tokens) beside the shipped one: O, gate/up and down over 16 rows
# letting the next launch start only at their exit (decode_attention.GEMV_TRIGGER_ROWS = 16, shipped None since
# 2026-12-07 21:51 UTC, not timed at 32k), the down launch with 10 stages of 64 columns (the same bits) or 5 of 128
# (other bits), and the attention merge taking a head's columns in one program where a row's splits fit one step
# (decode_attention.MERGE_HEAD_AT_ONCE); the tables are benchmarks/tables_2026-12-07/*.json. Then what each launch
# kind adds to the shipped step in its graph.
# Earlier versions of this job ran on an H100, 2026-12-07 15:48, 18:04, 21:10 and 21:49 UTC (benchmarks/RESULTS.md;
# the copies that ran are job.sh.txt in benchmarks/h100_2026-12-07_{kernels,ahead,tables,tables/call3}/).
#
#   carry: nothing past the tree (move drafts/ and the dated result folders out first: the tree must be < 64 MiB)
#   (setsid nohup bash benchmarks/h200_kernels.sh /root/kout > /root/k.log 2>&1 &)
# OUT must not be /root/out (the device tool's, emptied each call).
set -euo pipefail
chunks=""
out=$1
source "$(dirname "$0")/lease_start.sh" /root/repo_k  # the repository copy and the GPU's name (no weights)
t=benchmarks/tables_2026-12-07
python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_weight_tiles.py tests/test_gpu_fused.py \
  -k "graphed or lm_head_rows or rows_are_bit_identical or merged_at_once" > "$out/gpu_tests.log" 2>&1 || echo "a GPU test failed"
echo "TESTS_DONE $(date -u +%T)"
python3 benchmarks/gpu_rows.py --modes-only --mode-contexts 512,2048,8192,32704 \
  --tuned $t/down_s10.json,$t/down_bk128.json \
  --modes "K/V shared, 4 split programs per SM (shipped);shipped, O, gate/up and down over 16 rows letting the next launch start only at their exit;shipped with the given down_s10 block sizes;shipped with the given down_bk128 block sizes;shipped, attention merge taking a head at once where a row's splits fit one step" \
  --out "$out/tables" > "$out/tables.log" 2>&1 || echo "the tables run failed (tables.log)"
echo "TABLES_DONE $(date -u +%T)"
python3 benchmarks/step_timeline.py --rows 1,5,64 --contexts 512 --out "$out/timeline" \
  --mode "K/V shared, 4 split programs per SM (shipped)" > "$out/timeline.log" 2>&1 || echo "the timeline failed"
echo "TIMELINE_DONE $(date -u +%T)"
