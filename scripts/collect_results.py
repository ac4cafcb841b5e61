#!/usr/bin/env python
"""Gather every run under a results directory into summary tables and plots.

    python scripts/collect_results.py --output results/

Reads each `results/<run_id>/performance_summary.json` (runs still being written are skipped) and writes
`results/summary.json`, `summary.csv`, `summary.md` and `plots/summary_speedup.png`: every variant of every
run, and mean ± std over runs of the same experiment. A missing directory or no runs: one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.errors import OneLineParser, UserError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("results"),
                        help="the results directory holding one folder per run (default: results/)")
    args = parser.parse_args(argv)
    try:
        from dfvg.reports.collect import collect

        doc = collect(args.output)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"collected {len(doc['runs'])} run(s) into {args.output / 'summary.md'} (+ summary.json, summary.csv, "
          f"plots/summary_speedup.png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
