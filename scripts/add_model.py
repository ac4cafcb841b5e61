#!/usr/bin/env python
"""Register a target/draft pair by name in configs/models.yaml, after checking that the pair can run.

    python scripts/add_model.py --target new_model --draft new_draft [--name NAME]

--target / --draft take a checkpoint directory or a folder name under models/. Both must have a
config.json DFVG supports and readable safetensors weights, and the draft's tokenizer must be the target's
(same token -> id map). No code changes: experiment configs then say `pair: NAME`, and
scripts/run_all.py uses the registered draft when --draft-path is left out. The registry is written to a
temp file and renamed. A failed check is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.checkpoint import check_weights, load_config  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.host import experiment_config as ec  # noqa: E402
from dfvg.tokenizer import check_compatible, load_tokenizer  # noqa: E402


def validate(target: Path, draft: Path) -> str:
    """Check both checkpoints and their tokenizers; returns a one-line description of the pair."""
    configs = {}
    for role, path in (("target", target), ("draft", draft)):
        configs[role] = load_config(path)
        check_weights(path)
    check_compatible(load_tokenizer(target), load_tokenizer(draft), draft)
    t, d = configs["target"], configs["draft"]
    return (f"target {t.model_type} {t.num_layers} layers d={t.hidden_size}, draft {d.model_type} "
            f"{d.num_layers} layers d={d.hidden_size}, shared vocabulary")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="target checkpoint directory or name under models/")
    parser.add_argument("--draft", required=True, help="draft checkpoint directory or name under models/")
    parser.add_argument("--name", help="pair name (default: the target folder's name)")
    parser.add_argument("--registry", type=Path, default=ec.REGISTRY, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        target = ec.resolve_model(args.target, "target", args.registry)
        draft = ec.resolve_model(args.draft, "draft", args.registry)
        description = validate(target, draft)
        name = args.name or target.name
        ec.register_pair(name, target, draft, args.registry)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"registered pair {name!r} in {args.registry}: {description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
