#!/usr/bin/env python
"""Normalise a prompt file into DFVG's JSONL form: one `{"id": ..., "prompt": ...}` per line.

    python scripts/prepare_dataset.py --input custom_data.json [--output data/custom_data.jsonl]
    python scripts/prepare_dataset.py --input humaneval          # the built-in sets work too

Accepted inputs are listed in `dfvg/datasets.py`. Malformed records are reported (one line each, with
their index) and skipped; a missing or unparseable file stops with one line. The output is written to a
temp file and renamed, so an interrupted run never leaves a half-written data set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg import datasets  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.outputs import check_output_file  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def default_output(source: str) -> Path:
    """data/<input stem>.jsonl: 'custom_data.jsonl.gz' -> data/custom_data.jsonl."""
    name = Path(source).name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return REPO_ROOT / "data" / f"{name}.jsonl"


def read(source: str) -> tuple[list[dict[str, str]], list[tuple[int, str]]]:
    if source in datasets.BUILTIN:
        return datasets.load_prompts(source), []
    return datasets.read_prompt_file(source)


def write_jsonl(prompts: list[dict[str, str]], output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for prompt in prompts:
                f.write(json.dumps({"id": prompt["id"], "prompt": prompt["prompt"]}, ensure_ascii=False) + "\n")
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True,
                        help="a .json/.jsonl/.jsonl.gz file, or humaneval, sharegpt, sharegpt-code or pystdlib")
    parser.add_argument("--output", type=Path, help="output JSONL (default: data/<input name>.jsonl)")
    parser.add_argument("--limit", type=int, help="keep only the first N prompts")
    args = parser.parse_args(argv)
    output = args.output or default_output(args.input)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1 (or left out for every prompt), got {args.limit}")
    try:
        check_output_file(output, "--output")
        prompts, errors = read(args.input)
        for index, reason in errors:
            print(f"skipped record {index}: {reason}", file=sys.stderr)
        prompts = prompts[: args.limit]
        if not prompts:
            raise UserError(f"{args.input}: no usable prompts ({len(errors)} malformed record(s)); give a file with "
                            "at least one well-formed prompt")
        write_jsonl(prompts, output)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(prompts)} prompts to {output} ({len(errors)} malformed record(s) skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
