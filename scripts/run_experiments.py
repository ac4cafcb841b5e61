#!/usr/bin/env python
"""Run an experiment config end to end and write one report directory per run.

    python scripts/run_experiments.py --config configs/default.yaml [--output results/]

Same as `dfvg run --config ...`. The config names the target and draft checkpoints, the prompts, the
variants (baseline, speculative, fpga, overlap, adaptive, sweep) and the devices; see docs/experiments.md.
A progress bar goes to stderr; one line per variant and the report directory go to stdout. A mistake in
the config is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.errors import UserError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="experiment YAML, e.g. configs/default.yaml")
    parser.add_argument("--output", help="results root (default: output_dir from the config, else results/)")
    args = parser.parse_args(argv)
    try:
        from dfvg.host.experiments import run_experiments

        run_experiments(args.config, output=args.output)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
