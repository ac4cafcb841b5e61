#!/usr/bin/env python
"""DFVG with repeated trials from the command line: every variant --num-runs times, mean ± std.

    python scripts/run_all.py --model-path /path/to/model [--draft-path /path/to/draft] \
        --dataset-path data/custom_data.json --max-new-tokens 128 --draft-length 8 --batch-size 1 \
        --num-runs 5 --tag qwen3-test [--output results/] [--variants baseline,speculative,fpga]

Without --draft-path, the draft registered for the target in configs/models.yaml (scripts/add_model.py)
is used. --dataset-path takes a prompt file (see scripts/prepare_dataset.py) or a built-in name
(humaneval, sharegpt). The run is an ordinary experiment named after --tag: its reports land in
<output>/<tag>-<time>/ like scripts/run_experiments.py's, and the last stdout line is one JSON object
with each variant's tokens/s and speedup (mean ± std over the runs). Bad input: one line, exit 2.
Ctrl-C: one line, exit 130, no report; the repetitions completed so far are kept under
<output>/.<tag>.progress/ and the same command run again resumes after them (dfvg/host/resume.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.errors import OneLineParser, UserError, report_interrupt  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="target checkpoint directory")
    parser.add_argument("--draft-path", help="draft checkpoint directory (default: the registered draft)")
    parser.add_argument("--dataset-path", required=True, help="prompt file, or humaneval / sharegpt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-length", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--num-runs", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=10, help="first N prompts of the data set")
    parser.add_argument("--tag", required=True, help="name of this experiment (letters, digits, . _ -)")
    parser.add_argument("--output", default="results", help="results root (default: results/)")
    parser.add_argument("--variants", default="baseline,speculative", help="comma-separated variants")
    parser.add_argument("--device-config", help="device mapping YAML (default: draft and verify on cpu)")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on cpu, bfloat16 on cuda), float32, bfloat16")
    parser.add_argument("--temperature", type=float, default=0.0)
    return parser.parse_args(argv)


def experiment(args: argparse.Namespace) -> dict:
    """The experiment config mapping these arguments stand for."""
    from dfvg.host import experiment_config as ec

    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.tag):
        raise UserError(f"--tag {args.tag!r} may hold only letters, digits, '.', '_' and '-' (it names a folder)")
    target = ec.resolve_model(args.model_path, "target")
    draft = ec.resolve_model(args.draft_path, "draft") if args.draft_path else ec.registered_draft(target)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if draft is None and any(v != "baseline" for v in variants):
        raise UserError(f"no draft registered for {target} in {ec.REGISTRY}; pass --draft-path DIR or register "
                        "one with scripts/add_model.py --target ... --draft ...")
    raw = {"name": args.tag, "target_model": str(target), "draft_model": str(draft) if draft else None,
           "dataset": args.dataset_path, "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length,
           "batch_size": args.batch_size, "num_runs": args.num_runs, "num_prompts": args.num_prompts,
           "variants": variants, "output_dir": args.output, "dtype": args.dtype, "temperature": args.temperature}
    if args.device_config:
        raw["device_config"] = args.device_config
    return raw


def headline(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "performance_summary.json").read_text())
    out = {"run_dir": str(run_dir), "provenance": "measured"}
    for name, v in summary["variants"].items():
        m = v["measured"]
        out[name] = {"tokens_per_second": m["tokens_per_second"]["value"],
                     "tokens_per_second_std": m["tokens_per_second_std"]["value"], "speedup": m["speedup"]["value"]}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        raw = experiment(args)
        from dfvg.host.experiment_config import build_config
        from dfvg.host.experiments import run_experiments

        run_dir = run_experiments(build_config(raw, "run_all.py arguments"))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return report_interrupt(resumable=True)
    print(json.dumps(headline(run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
