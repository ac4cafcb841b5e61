#!/usr/bin/env python
"""Distil a small, FPGA-sized draft from a target checkpoint (docs/distill.md).

    python scripts/distill_draft.py --target models/qwen2.5-coder-1.5b-instruct --output models/draft-l4-d512 \
        --layers 4 --hidden 512 --vocab-top 32768 --steps 2000 --device cuda --prompts humaneval,sharegpt:2000

The target continues every prompt (teacher data, cached under <output>/teacher/), a seeded draft learns the
target's top-k distribution on those continuations, its greedy acceptance is measured on validation
prompts (and reported on test prompts), and the draft is saved as a checkpoint DFVG loads (config.json +
model.safetensors + tokenizer + draft_vocab.json + distill_recipe.json). Training longer than one lease:
--checkpoint-dir DIR --time-budget S, then the same command with --resume DIR (docs/distill.md).
The last line printed is one JSON object; sizing lines are modeled.
A flag mistake is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.distill.pipeline import DistillOptions, run  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.outputs import check_writable  # noqa: E402


def parse_args(argv: list[str] | None) -> DistillOptions:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target checkpoint directory")
    p.add_argument("--output", required=True, help="where the draft checkpoint is written")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=0, help="0 = hidden // 64")
    p.add_argument("--kv-heads", type=int, default=0, help="0 = heads // 4")
    p.add_argument("--intermediate", type=int, default=0, help="0 = 3 x hidden")
    p.add_argument("--vocab-top", type=int, default=0, help="LM head over the V most frequent target tokens; 0 = all")
    p.add_argument("--embed", default="head",
                   help="head: input embedding over the head's tokens, tied to it (small, all on chip); "
                        "full: every token's own row, untied")
    p.add_argument("--save-dtype", default="bfloat16", help="bfloat16 or float32 (the weights on disk)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (teacher generation and training)")
    p.add_argument("--prompts", default="humaneval",
                   help="comma list of humaneval, sharegpt or files, each [:LIMIT][*SAMPLES per training prompt]")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of prompts for validation: the end-of-run evaluation runs are compared on")
    p.add_argument("--test-fraction", "--heldout-fraction", type=float, default=0.25, dest="test_fraction",
                   help="share of prompts for test, only reported (0.25 = the first drafts' held-out set)")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--teacher-top-k", type=int, default=32)
    p.add_argument("--teacher-temperature", type=float, default=0.0, help="0 = greedy training continuations")
    p.add_argument("--sample-temperature", type=float, default=0.7,
                   help="temperature of the extra continuations asked for with source*N")
    p.add_argument("--teacher-batch", type=int, default=16)
    p.add_argument("--teacher-dtype", default="", help="float32 or bfloat16 (default: bfloat16 on cuda)")
    p.add_argument("--teacher-cache", default="", help="teacher data folder (default: <output>/teacher)")
    p.add_argument("--checkpoint-dir", default="",
                   help="write resumable training checkpoints here (files <= 16 MiB + checkpoint.json)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0 = at the end)")
    p.add_argument("--stop-after", type=int, default=0, help="steps this run may take, then checkpoint and stop")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds of training this run may take (e.g. a lease's), then checkpoint and stop")
    p.add_argument("--resume", default="", help="continue the training checkpoint in this folder")
    p.add_argument("--feature-head", action="store_true",
                   help="train an EAGLE-style head that also reads the target's hidden states (dfvg/feature_head.py)")
    p.add_argument("--feature-unroll", type=int, default=2,
                   help="feature head: loss passes (the first reads the target's features, the others the head's own)")
    p.add_argument("--feature-weight", type=float, default=1.0, help="feature head: weight of the feature regression")
    p.add_argument("--block-size", type=int, default=0,
                   help="> 0: train a block drafter that drafts up to this many tokens in one pass (mask tokens)")
    p.add_argument("--init", default="target-pca", help="target-pca or random")
    p.add_argument("--init-from", default="",
                   help="start from this standalone draft or feature head (same shape and training prompts): "
                        "a feature head begins as exactly that draft (or head), a draft trains on")
    p.add_argument("--eval-k", default="2,4,6,8", help="draft lengths measured on the held-out prompts")
    p.add_argument("--board", default="u280")
    p.add_argument("--verify-ms", type=float, help="a target verify time to compare the modeled block with")
    a = p.parse_args(argv)
    try:
        ks = tuple(int(k) for k in a.eval_k.split(",") if k.strip())
    except ValueError:
        p.error(f"--eval-k must be comma-separated integers, got {a.eval_k!r}")
    return DistillOptions(
        target=a.target, output=a.output, layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
        intermediate=a.intermediate, vocab_top=a.vocab_top, embed=a.embed, save_dtype=a.save_dtype,
        steps=a.steps, batch_size=a.batch_size, lr=a.lr,
        seed=a.seed, device=a.device, prompts=a.prompts, val_fraction=a.val_fraction,
        test_fraction=a.test_fraction,
        max_prompt_tokens=a.max_prompt_tokens, max_new_tokens=a.max_new_tokens, teacher_top_k=a.teacher_top_k,
        teacher_temperature=a.teacher_temperature, sample_temperature=a.sample_temperature,
        teacher_batch=a.teacher_batch, teacher_dtype=a.teacher_dtype,
        teacher_cache=a.teacher_cache, checkpoint_dir=a.checkpoint_dir,
        checkpoint_every=a.checkpoint_every, stop_after=a.stop_after, time_budget=a.time_budget, resume=a.resume,
        init=a.init, init_from=a.init_from, eval_ks=ks, board=a.board, verify_ms=a.verify_ms,
        feature_head=a.feature_head, feature_unroll=a.feature_unroll, feature_weight=a.feature_weight,
        block_size=a.block_size)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        check_writable(opts.output, "--output")
        if opts.teacher_cache:
            check_writable(opts.teacher_cache, "--teacher-cache")
        if opts.checkpoint_dir:
            check_writable(opts.checkpoint_dir, "--checkpoint-dir")
        summary = run(opts, log=lambda line: print(line, flush=True))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not summary["finished"]:
        print(json.dumps({k: summary[k] for k in ("finished", "step", "checkpoint")}))
        return 0
    final = {k: summary[k] for k in ("shape", "acceptance_before", "acceptance_after", "acceptance_test",
                                     "head_coverage_of_train_tokens")}
    final["final_loss"] = summary["losses"][-1]
    final["sizing_modeled"] = {bits: {"fits_on_chip": s["fits_on_chip"], "block_ms": s["block_time"]["value"] * 1e3}
                               for bits, s in summary["sizing"].items()}
    print(json.dumps(final))
    return 0


if __name__ == "__main__":
    sys.exit(main())
