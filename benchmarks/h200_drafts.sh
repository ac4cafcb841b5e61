#!/usr/bin/env bash
# Issue 15's two untried drafts, trained and measured beside the shipped ones in one lease:
#   - a block drafter (dfvg.block_draft: all k tokens of a block from one pass, PARD-style mask tokens), started
#     from the shipped 4 x 512 chain draft (--init-from) and trained on its data with the mask-row loss, at two
#     learning rates;
#   - a deeper chain draft, 5 x 512 (docs/distill.md's sizing table: on chip at int8), trained as the shipped
#     4 x 512 was (same data, steps and learning rate; from the target's PCA).
# They train at once (small drafts leave the GPU mostly idle; TRAIN_AT_ONCE), then one gpu_speed run times DFVG plain, the
# shipped draft, the feature head and both new drafts on the 20 held-out HumanEval prompts (k = 3 and 4), every
# row through Engine.decode, the product's path. The training logs end with the exact teacher-forced acceptance
# on the test split by source (HumanEval, ShareGPT).
#
#   carry: .chunks/p (device_pack.py's chunks of the target GGUF and both shipped drafts, one per call),
#          results/distill_prompts (distill_h200.sh prompts), .chunks/prompts.json, .whl (the gguf wheel)
#   (setsid nohup bash benchmarks/h200_drafts.sh /root/p /root/dout > /root/drafts.log 2>&1 &)
# Env: BLOCK_STEPS (default 1000: 7 passes over the 4,709 continuations; 18 passes over a third of them
# over-fitted on 2026-12-07), BLOCK_LRS (default "1e-3 3e-4": a run each, at once; the validation tau in each
# log's eval lines chooses, the test split and the timed rows are only reported), BLOCK_SIZES (default 4; "4 8":
# a block drafter of each size K at each learning rate; k above K drafts K), DEEP_SHAPE (default
# 5:512:32768; '' = no deeper draft), STEPS (the deeper draft's, default 2000), KS (draft lengths timed, default 3,4), SKIP_TRAIN=1 (time drafts already in $RESULTS),
# FEATURE_BLOCK (a size K: a block feature head, dfvg.feature_head.BlockFeatureDrafter, trained beside the others from
# the shipped head, FEATURE_BLOCK_STEPS default 1000 at FEATURE_BLOCK_LR default 1e-3, then timed beside the others
# with gpu_speed's --extra-heads), GPU_TESTS (test files: `pytest -v -m gpu` on them while the teacher and the trainings run, finished before the
# timing; log gpu_tests.log), MODES (gpu_rows.py --modes after the timing, at MODE_CONTEXTS, default 512,32704;
# random weights of the target's shapes: issue 16's switches side by side; out modes/), FPGA_BLOCK=1 (after the
# timing: the block run validation chooses on the emulated FPGA datapath, gpu_speed's fpga phase at k = 4, out fpga/;
# its folder tarred and split in 15 MiB pieces, out ship/, for the device tool's 16 MiB files), NCU_ROWS (e.g. "1,5":
# before the modes, ncu_step.py over the first 14 launches of those steps at NCU_CONTEXT, default 32704; out ncu/).
# BLOCK_INIT_FROM (the block drafters' --init-from, default the shipped draft, whose training prompts include the
# validation split, so their validation tau is not held out; '' = from the target's PCA, as the deeper chain, and
# then BLOCK_STEPS should be about 2000), TRAIN_AT_ONCE (trainers on the GPU at a time; default: all of them on a card of 100 GB or more, else 3: on an
# H100's 80 GB six trainers at once ran two of them out of memory on 2026-12-07; the block feature head starts first).
# OUT must not be /root/out (the device tool's, emptied each call).
set -euo pipefail
chunks=$1
out=$2
source "$(dirname "$0")/lease_start.sh" /root/repo_d  # the repository copy, the GPU's name, the weights
D=drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768
export GGUF_DIR=/root/cache/gguf DFVG_CACHE=/root/dfvg-cache RESULTS=/root/distill TIME_BUDGET=1500
DEEP_SHAPE=${DEEP_SHAPE-5:512:32768}
BLOCK_LRS=${BLOCK_LRS:-"1e-3 3e-4"}  # one block run per peak learning rate and block size, at once; validation chooses
BLOCK_SIZES=${BLOCK_SIZES:-4}
blocks=$(for b in $BLOCK_SIZES; do for lr in $BLOCK_LRS; do echo -n "$RESULTS/l4-d512-v32768-b$b-lr$lr "; done; done)
deep=""
if [ -n "$DEEP_SHAPE" ]; then IFS=: read -r dl dd dv <<<"$DEEP_SHAPE"; deep=$RESULTS/l${dl}-d${dd}-v${dv}; fi
if [ -n "${GPU_TESTS:-}" ]; then
  # shellcheck disable=SC2086
  (rc=0; python3 -m pytest -v -m gpu -p no:cacheprovider $GPU_TESTS > "$out/gpu_tests.log" 2>&1 || rc=$?
   echo "GPU_TESTS_DONE rc=$rc $(date -u +%T)") &
fi
if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  bash benchmarks/distill_h200.sh prepare teacher > "$out/teacher.log" 2>&1
  echo "TEACHER_DONE $(date -u +%T)"
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  at_once=${TRAIN_AT_ONCE:-$([ "${gpu_mib:-0}" -ge 100000 ] && echo 99 || echo 3)}
  trainers=()
  running() { local n=0 pid; for pid in "${trainers[@]}"; do kill -0 "$pid" 2>/dev/null && n=$((n + 1)); done; echo $n; }
  slot() { while [ "$(running)" -ge "$at_once" ]; do wait -n || true; done; }  # trainers only, not the GPU tests
  if [ -n "${FEATURE_BLOCK:-}" ]; then  # a block feature head from the shipped head (timed below with the others)
    (FEATURE_HEAD=1 BLOCK=$FEATURE_BLOCK INIT_FROM=$D-fh STEPS=${FEATURE_BLOCK_STEPS:-1000} LR=${FEATURE_BLOCK_LR:-1e-3} \
      SHAPES=4:512:32768 bash benchmarks/distill_h200.sh train > "$out/train_feature_block.log" 2>&1
     cp -f "$RESULTS/l4-d512-v32768-fh-b$FEATURE_BLOCK/distill_recipe.json" "$out/feature_block_recipe.json" || true
     echo "FEATURE_BLOCK_DONE $(date -u +%T)") &
    trainers+=($!)
  fi
  for b in $BLOCK_SIZES; do for lr in $BLOCK_LRS; do
    slot
    (BLOCK=$b INIT_FROM=${BLOCK_INIT_FROM-$D} STEPS=${BLOCK_STEPS:-1000} LR=$lr SUFFIX=-lr$lr SHAPES=4:512:32768 \
      bash benchmarks/distill_h200.sh train > "$out/train_block$b-lr$lr.log" 2>&1; echo "BLOCK_DONE $b $lr $(date -u +%T)") &
    trainers+=($!)
  done; done
  if [ -n "$deep" ]; then
    slot
    (SHAPES=$DEEP_SHAPE bash benchmarks/distill_h200.sh train > "$out/train_deep.log" 2>&1; echo "DEEP_DONE $(date -u +%T)") &
    trainers+=($!)
  fi
  wait
  for b in $blocks; do cp -f "$b/distill_recipe.json" "$out/$(basename "$b")_recipe.json" || true; done
  [ -z "$deep" ] || cp -f "$deep/distill_recipe.json" "$out/deep_recipe.json" || true
fi
wait  # the GPU tests too (SKIP_TRAIN=1): nothing else on the GPU while it is timed
extra=$(for d in $blocks $deep; do if [ -f "$d/config.json" ]; then echo -n "$d,"; fi; done)  # runs that finished
heads=""
[ -n "${FEATURE_BLOCK:-}" ] && [ -f "$RESULTS/l4-d512-v32768-fh-b$FEATURE_BLOCK/config.json" ] && \
  heads="$RESULTS/l4-d512-v32768-fh-b$FEATURE_BLOCK"
python3 benchmarks/gpu_speed.py --phases dfvg --ks "${KS:-3,4}" --one-kernel --trees "" --skip-draft \
  --feature-head $D-fh --distilled-draft $D --extra-drafts "${extra%,}" --extra-heads "$heads" --gguf-dir /root/cache/gguf \
  --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20 --results /root/speed_d --out "$out/speed" \
  2>&1 | grep -v "it/s\]" | tee "$out/speed.log"
python3 benchmarks/speed_breakdown.py "$out/speed/dfvg.json" | tee "$out/breakdown.txt"
echo "DRAFTS_DONE $(date -u +%T)"
if [ -n "${FPGA_BLOCK:-}" ] && [ -n "$blocks" ]; then
  # The block run validation chooses (its recipe's validation tau at k = 4), on the emulated FPGA datapath: the
  # gpu_speed fpga phase (int8, on this GPU) beside its float rows above; then its folder, split for $OUT. (Runs
  # started from the shipped draft were trained on prompts of that validation split: it ranks them, biased alike,
  # but is no held-out figure; RESULTS.md, 2026-12-07 09:41.)
  chosen=$(python3 - $blocks <<'PY'
import json, sys
from pathlib import Path
runs = [Path(d) for d in sys.argv[1:] if (Path(d) / "distill_recipe.json").is_file()]
def tau(run):  # validation tau at k = 4, or at the run's largest draft length below it (a block of 2 or 3)
    after = json.loads((run / "distill_recipe.json").read_text())["acceptance_after"]
    return after[str(max(int(k) for k in after if int(k) <= 4))]["mean_accepted_length"]
print(max(runs, key=tau) if runs else "")
PY
) || chosen=""
  echo "FPGA_BLOCK chosen=$chosen $(date -u +%T)"
  if [ -n "$chosen" ]; then
    rc=0
    python3 benchmarks/gpu_speed.py --phases fpga --fpga-ks 4 --one-kernel --skip-draft --distilled-draft "$chosen" \
      --gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20 \
      --results /root/speed_f --out "$out/fpga" > "$out/fpga.log" 2>&1 || rc=$?
    mkdir -p "$out/ship" && tar -C "$(dirname "$chosen")" -cf - --exclude='dfvg_fpga_*' "$(basename "$chosen")" | \
      split -b 15m - "$out/ship/$(basename "$chosen").tar."
    (cd "$out/ship" && sha256sum ./*.tar.* > sha256.txt)
    echo "FPGA_BLOCK_DONE rc=$rc $(date -u +%T)"
  fi
fi
if [ -n "${NCU_ROWS:-}" ]; then  # ncu counters of the long-context step's first launches (H100s; an H200 says why not)
  rc=0
  python3 benchmarks/ncu_step.py --rows "$NCU_ROWS" --kernels 14 --context "${NCU_CONTEXT:-32704}" --out "$out/ncu" \
    > "$out/ncu.log" 2>&1 || rc=$?
  echo "NCU_DONE rc=$rc $(date -u +%T)"
fi
if [ -n "${MODES:-}" ]; then
  rc=0
  python3 benchmarks/gpu_rows.py --modes-only --mode-contexts "${MODE_CONTEXTS:-512,32704}" --modes "$MODES" \
    --out "$out/modes" > "$out/modes.log" 2>&1 || rc=$?
  echo "MODES_DONE rc=$rc $(date -u +%T)"
fi
