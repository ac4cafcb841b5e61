#!/usr/bin/env bash
# Issue 16 on random weights of the 1.5B target's shapes, in one job that carries no weights (one call with the
# tree, then polling): on the whole step (gpu_rows.py modes at 512, 2,048 and 8,192 tokens) beside the shipped one,
# O, gate/up and down of any row count letting the next launch start after their weight loop (decode_attention.
# GEMV_TRIGGER_ROWS = None; QKV and the attention's launches keep their 16-row bound), and block-size tables: QKV, O
# and both split 2 ways instead of 4; down split 5 ways, or with 10 stages of 64 columns or 5 of 128 (100 KiB in
# flight); the tables are benchmarks/tables_2026-12-07/*.json. Then what each launch kind adds to the shipped step in
# its graph (step_timeline.py), and the graphed-trigger GPU test.
# Earlier versions of this job ran on an H100, 2026-12-07 15:48, 18:04 and 21:10 UTC (benchmarks/RESULTS.md; the copies
# that ran are job.sh.txt in benchmarks/h100_2026-12-07_{kernels,ahead,tables}/).
#
#   carry: nothing past the tree (move drafts/ and the dated result folders out first: the tree must be < 64 MiB)
#   (setsid nohup bash benchmarks/h200_kernels.sh /root/kout > /root/k.log 2>&1 &)
# OUT must not be /root/out (the device tool's, emptied each call).
set -euo pipefail
chunks=""
out=$1
source "$(dirname "$0")/lease_start.sh" /root/repo_k  # the repository copy and the GPU's name (no weights)
t=benchmarks/tables_2026-12-07
python3 benchmarks/gpu_rows.py --modes-only --mode-contexts 512,2048,8192 \
  --tuned $t/qkv2.json,$t/o2.json,$t/qkv2_o2.json,$t/down5.json,$t/down_s10.json,$t/down_bk128.json \
  --modes "K/V shared, 4 split programs per SM (shipped);shipped with the given qkv2 block sizes;shipped with the given o2 block sizes;shipped with the given qkv2_o2 block sizes;shipped with the given down5 block sizes;shipped with the given down_s10 block sizes;shipped with the given down_bk128 block sizes;shipped, O, gate/up and down of any row count letting the next launch start after their weight loop" \
  --out "$out/tables" > "$out/tables.log" 2>&1 || echo "the tables run failed (tables.log)"
echo "TABLES_DONE $(date -u +%T)"
python3 benchmarks/step_timeline.py --rows 1,5,64 --contexts 512 --out "$out/timeline" \
  --mode "K/V shared, 4 split programs per SM (shipped)" > "$out/timeline.log" 2>&1 || echo "the timeline failed"
echo "TIMELINE_DONE $(date -u +%T)"
python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_weight_tiles.py -k graphed > "$out/gpu_tests.log" 2>&1 \
  || echo "a GPU test failed (gpu_tests.log)"
echo "TESTS_DONE $(date -u +%T)"
