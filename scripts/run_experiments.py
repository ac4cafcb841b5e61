#!/usr/bin/env python
"""Run an experiment config end to end and write one report directory per run.

    python scripts/run_experiments.py --config configs/default.yaml [--output results/]

Same as `dfvg run --config ...`. The config names the target and draft checkpoints, the prompts, the
variants (baseline, speculative, fpga, overlap, adaptive, sweep) and the devices; see docs/experiments.md.
A progress bar goes to stderr; one line per variant and the report directory go to stdout. A mistake in
the config is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.cli import main as dfvg_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """`dfvg run` with these arguments: one parser and one error path for both entry points."""
    return dfvg_main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
