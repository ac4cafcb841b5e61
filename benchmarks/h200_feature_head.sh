#!/usr/bin/env bash
# Issue 15's feature-head lease: train an EAGLE-style head (dfvg/feature_head.py) and time it end to end against
# the standalone 4 x 512 draft it extends. One background job after the target's GGUF (and, for HEAD, the shipped
# drafts) arrived as benchmarks/device_pack.py's chunks (h200_weights.sh says how they are made), carried one per
# call with drafts/ moved out of the tree: a call carries at most 64 MiB, the tracked tree is 8 MB without drafts/
# and 126 MB with them:
#
#   (setsid nohup bash benchmarks/h200_feature_head.sh /root/p /root/fout > /root/fh.log 2>&1 &)
#
# carry: results/distill_prompts (humaneval, sharegpt5k and pystdlib JSONL: `distill_h200.sh prompts`), .whl,
# .chunks/prompts.json (gpu_speed.py --write-prompts) and the HELDOUT files.
# Without HEAD:
# 1. distill_h200.sh prepare teacher: the target installed from the GGUF; teacher data of HumanEval x 8,
#    ShareGPT (5k) and the Python standard library's functions (pystdlib): 10 % validation, 25 % test;
# 2. the standalone draft S (4 x 512, 32k head, 2,000 steps; the shipped recipe on this split);
# 3. the head H: S's weights plus fuse/predict (--init-from S: it starts as exactly S), HEAD_STEPS more steps;
#    it lands in $out/h as 15 MiB parts (fetch these first: at most 8 files come back per call);
# 4. with CONTROL=1, S+: S trained HEAD_STEPS more steps without features (same data, same schedule), so H's
#    gain over S is not just more training;
# 5. gpu_speed --phases dfvg on the 20 held-out prompts: plain, S and H at k = 4 and each TREES shape, in one run;
#    then HELDOUT (below).
# HEAD=DIR skips 1-4: step 5 times that head (e.g. the shipped drafts/...-fh, packed with the GGUF; or a folder
# carried in, whose model.safetensors may come in parts, DIR/model.safetensors.part*, joined here) beside the
# standalone draft DRAFT (default: the shipped one, packed with it).
# With HEAD, MORE_STEPS=N then trains that head N more steps (--init-from it: the run starts as exactly that
# head, keeps its head vocabulary, and regenerates the teacher data of step 1 first; PROMPT_DIR holds the
# prompt files when they were carried in an earlier call) and times the result the same way, as H2 ($out/h2).
# MORE_ALT="LR=3e-4 FEATURE_UNROLL=4" (distill_h200.sh's settings) trains a second candidate H2b the same way;
# the validation split chooses between them ($out/chosen.txt, both recipes in $out), and only that one is timed.
# Measured on an H100 (2026-12-06): the 23 chunks ~1.5 min, the teacher data 2 min 39 s, 2,000 head steps 298 s
# (the target's features kept after the first epoch), each timing ~1 min; a lease holds 30 min, so MORE_ALT with
# MORE_STEPS=2000 fits beside the timings (the two candidates side by side; a step's peak: 9.5 GiB, RESULTS.md).
# TRAIN_FIRST=1 trains before any timing, then times H2 and HEAD, each with HELDOUT (no FPGA phase, no probe).
# TREES (default "dynamic:16 dynamic:40") are the tree shapes the first timing adds for the draft and the head.
# With HEAD, after the first timing, gpu_speed.py --phases fpga --fpga-head drafts with the head's int8 datapath
# (emulated on the GPU, sync, k = 4, 5 prompts): its schedule measured, projected onto the U280 model (fpga.json),
# and benchmarks/feature_head_probe.py splits the head's prefill and profiles a request.
# DEEP_TREES="dynamic:40 ..." times those shapes again at depth DEEP_DEPTH (default 6; chains at that k too) on the
# HumanEval prompts, before HELDOUT: for the head trained here, without HEAD, or H2, with MORE_STEPS.
# HELDOUT="a.json b.json" times the head the same way on each of those prompt files (held-out prompts of other
# sources: feature_head_fpga.py --write-prompts; with HELDOUT_TREES, default dynamic:16).
# Acceptance tables are the training runs' last log lines and their distill_recipe.json (validation chooses;
# test is reported, per prompt source too). OUT must not be /root/out (the device tool empties it at every call).
# GPU_TESTS=1 runs the gpu-marked tests of the head and of device trees (lockstep and lossless checks): first
# with HEAD, last without.
set -euo pipefail
chunks=$1
out=$2
case $out in /root/out | /root/out/*) echo "error: $out is the device tool's \$OUT, emptied at every call" >&2; exit 2;; esac
HEAD_STEPS=${HEAD_STEPS:-1000}
rm -rf /root/repo_f && cp -r "$(dirname "$0")/.." /root/repo_f && cd /root/repo_f
# shellcheck source=benchmarks/h200_weights.sh
source benchmarks/h200_weights.sh  # the GGUF (and drafts/ when packed) from device_pack.py's chunks, checked
export GGUF_DIR=/root/cache/gguf DFVG_CACHE=/root/dfvg-cache RESULTS=/root/res
pd=${PROMPT_DIR:-results/distill_prompts}
export PROMPTS=$pd/humaneval.jsonl*8,$pd/sharegpt5k.jsonl,$pd/pystdlib.jsonl
draft=${DRAFT:-drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768}
time_head() {  # head folder, log name[, trees[, prompts file[, depth]]]: plain, the standalone $draft and the
  # head at k = depth (default 4; and each tree shape at that depth for both), in one run
  python3 benchmarks/gpu_speed.py --phases dfvg --ks "${5:-4}" --tree-depth "${5:-4}" --one-kernel --trees "${3:-}" \
    --skip-draft --feature-head "$1" --distilled-draft "$draft" \
    --gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file "${4:-.chunks/prompts.json}" --prompts 20 \
    --results /root/speed --out "$out" 2>&1 | tee "$out/$2.log"
  mv "$out/dfvg.json" "$out/$2.json"
}
time_heldout() {  # head folder[, tag]: HELDOUT's prompt files, one run each
  for file in ${HELDOUT:-}; do
    time_head "$1" "gpu_speed_fh${2:-}_$(basename "$file" .json)" "${HELDOUT_TREES-dynamic:16}" "$file" \
      || echo "timing on $file failed (its log says why)"
  done
}
time_deep() {  # head folder, log name: DEEP_TREES at depth DEEP_DEPTH (chains at that k too), when set
  if [ -n "${DEEP_TREES:-}" ]; then
    time_head "$1" "$2" "$DEEP_TREES" .chunks/prompts.json "${DEEP_DEPTH:-6}" || echo "the deep trees failed (their log says why)"
  fi
}
gpu_tests() {
  [ "${GPU_TESTS:-0}" = 1 ] || return 0
  python3 -m pytest -q -m gpu tests/test_feature_head.py tests/test_feature_device_step.py tests/test_feature_tree.py \
    tests/test_tree_device.py 2>&1 | tail -15 | tee "$out/gpu_tests.log" || true
}
train() {  # name, then env assignments: train until the run exported (a run stopped by its time budget resumes;
  # an error stops after three tries)
  local name=$1 attempt
  shift
  for attempt in 1 2 3; do
    [ -f "$RESULTS/$name/model.safetensors" ] && break
    echo "== train $name $* attempt $attempt ($(date -u +%T))"
    env "$@" TIME_BUDGET=540 bash benchmarks/distill_h200.sh train 2>&1 | grep -v "^step" | tail -14
    cp "$RESULTS/$name.log" "$out"/ || true
  done
  cp "$RESULTS/$name/distill_recipe.json" "$out/$name.recipe.json"
}
bring_back() {  # trained head folder, name under $out: what comes back from the device is at most 8 files of
  # 16 MiB a call, so the body travels in 15 MiB parts
  mkdir -p "$out/$2" && split -b 15m -d "$1/model.safetensors" "$out/$2/model.safetensors.part"
  cp "$1"/{feature_head.safetensors,feature_head.json,config.json,draft_vocab.json} "$out/$2/"
  sha256sum "$1"/*.safetensors > "$out/$2/sha256.txt"
  echo "TRAINED $2 ($(date -u +%T))"
}
more() {  # MORE_STEPS more steps of $HEAD (H2), timed with the same prompts and trees as $HEAD; with MORE_ALT,
  # also H2b (the same steps with MORE_ALT's settings), and the one with the higher validation τ at k = 4 is timed
  echo "== prepare teacher ($(date -u +%T))"
  # the runs below only read the teacher cache: unfilled, both would write it at once
  bash benchmarks/distill_h200.sh prepare teacher 2>&1 | tail -20 || { echo "the teacher data failed" >&2; return 1; }
  local chosen=l4-d512-v32768-fh2 word alt=
  for word in ${MORE_ALT:-}; do  # training settings only (a flag would become env's option or its command; a
    # setting of the teacher data would make the second run write the cache the first reads)
    [[ $word =~ ^(LR|FEATURE_UNROLL|BATCH_SIZE)=[^*?]*$ ]] \
      || { echo "error: MORE_ALT word '$word' is not LR=, FEATURE_UNROLL= or BATCH_SIZE=value" >&2; return 2; }
  done
  rm -f "$out"/train_fh2.out "$out"/train_fh2b.out
  # the two candidates train side by side. On the 2026-12-06 H100 both ran out of memory so: each step held
  # full-vocabulary logits, 30-44 GB. The loss now reads the head's own rows of the loss positions only: a step's
  # peak is 9.5 GiB against 27.1 before (benchmarks/train_step.py, H100, 2026-12-06 04:03 lease; random weights, a
  # 2-layer target); with the 3 GB target and the kept features (up to ~6 GB) two should fit on one H100 (not yet run)
  train l4-d512-v32768-fh2 FEATURE_HEAD=1 SUFFIX=2 INIT_FROM="$HEAD" STEPS="$MORE_STEPS" > "$out/train_fh2.out" 2>&1 &
  local first=$!
  if [ -n "${MORE_ALT:-}" ]; then
    # shellcheck disable=SC2086  # MORE_ALT is a list of VAR=value words
    train l4-d512-v32768-fh2b FEATURE_HEAD=1 SUFFIX=2b INIT_FROM="$HEAD" STEPS="$MORE_STEPS" $MORE_ALT \
      > "$out/train_fh2b.out" 2>&1 &
    alt=$!
  fi
  wait "$first" || echo "H2 failed (its log says why)"
  [ -z "$alt" ] || wait "$alt" || echo "H2b failed (its log says why); H2 goes on"
  cat "$out"/train_fh2*.out
  if [ -n "${MORE_ALT:-}" ]; then
    chosen=$(python3 - "$RESULTS" l4-d512-v32768-fh2 l4-d512-v32768-fh2b <<'PY' | tee "$out/chosen.txt"
import json, pathlib, sys
# validation chooses (the test split is only reported): the higher replayed τ at k = 4; a run that did not finish loses
def tau(name):
    recipe = pathlib.Path(sys.argv[1], name, "distill_recipe.json")
    return json.loads(recipe.read_text())["acceptance_after"]["4"]["mean_accepted_length"] if recipe.exists() else 0.0
print(max(sys.argv[2:], key=tau))
PY
)
  fi
  chosen=${chosen:-l4-d512-v32768-fh2}  # the chooser failed: H2
  [ -f "$RESULTS/$chosen/model.safetensors" ] || { echo "no trained H2 ($RESULTS/$chosen): nothing to time" >&2; return 1; }
  bring_back "$RESULTS/$chosen" h2
  time_head "$RESULTS/$chosen" gpu_speed_fh2 "${TREES-dynamic:16 dynamic:40}"
  time_deep "$RESULTS/$chosen" gpu_speed_fh2_deep
  time_heldout "$RESULTS/$chosen" 2
}
if [ -n "${HEAD:-}" ]; then
  compgen -G "$HEAD/model.safetensors.part*" >/dev/null && cat "$HEAD"/model.safetensors.part* > "$HEAD/model.safetensors"
  sha256sum "$HEAD"/*.safetensors | tee -a "$out/sha256.txt"
  if [ "${MORE_STEPS:-0}" -gt 0 ] && [ "${TRAIN_FIRST:-0}" = 1 ]; then  # the lease's time goes to training first
    more || echo "training or timing H2 failed (the logs say why); timing HEAD anyway"
    time_head "$HEAD" gpu_speed_fh "${TREES-dynamic:16 dynamic:40}" || echo "timing the head failed (its log says why)"
    time_heldout "$HEAD"
    gpu_tests
    echo DONE
    exit 0
  fi
  gpu_tests
  time_head "$HEAD" gpu_speed_fh "${TREES-dynamic:16 dynamic:40}" || echo "timing the head failed (its log says why); training goes on"
  # the head on the emulated int8 datapath (this GPU), its schedule measured and projected onto the U280 model
  python3 benchmarks/gpu_speed.py --phases fpga --fpga-head "$HEAD" --fpga-ks 4 --skip-draft \
    --gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20 --results /root/fpga \
    --out "$out" 2>&1 | tail -40 > "$out/fpga_head.log" || echo "the FPGA head phase failed (its log says why)"
  time_heldout "$HEAD"
  python3 benchmarks/feature_head_probe.py --phases dfvg --ks 4 --one-kernel --skip-draft --feature-head "$HEAD" \
    --gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 6 --results /root/probe \
    --out "$out" 2>&1 | tail -80 > "$out/feature_head_probe.log" || echo "the probe failed (its log says why)"
  [ "${MORE_STEPS:-0}" -gt 0 ] && { more || echo "training or timing H2 failed (the logs say why)"; }
  echo DONE
  exit 0
fi
echo "== prepare teacher ($(date -u +%T))"
bash benchmarks/distill_h200.sh prepare teacher 2>&1 | tail -20
base=$RESULTS/l4-d512-v32768
train l4-d512-v32768
train l4-d512-v32768-fh FEATURE_HEAD=1 INIT_FROM="$base" STEPS="$HEAD_STEPS"
bring_back "$RESULTS/l4-d512-v32768-fh" h
[ "${CONTROL:-1}" = 1 ] && train l4-d512-v32768-more SUFFIX=-more INIT_FROM="$base" STEPS="$HEAD_STEPS"
# the shipped draft when drafts/ travelled, else this lease's S (a folder moved out of the tree before a call can
# stay on the device empty: test for its config, not the folder)
[ -f "$draft/config.json" ] || draft=$base
time_head "$RESULTS/l4-d512-v32768-fh" gpu_speed_fh "${TREES-dynamic:16 dynamic:40}" || echo "timing the head failed (its log says why)"
time_deep "$RESULTS/l4-d512-v32768-fh" gpu_speed_fh_deep
time_heldout "$RESULTS/l4-d512-v32768-fh"
gpu_tests
echo DONE
