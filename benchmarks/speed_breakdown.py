"""Where a gpu_speed run's time went, per row: tok/s, its ratio to plain, tau, outputs equal to plain, and
the per-prompt parts (prefill ms, draft and verify ms per step, decode-only tok/s). Reads the dfvg phase's
JSON (`gpu_speed.py --out` writes dfvg.json); prints a table and writes it as JSON beside the input.

    python benchmarks/speed_breakdown.py benchmarks/h200_2026-12-05_feature_head_graph/gpu_speed_fh.json

Why: a row's tok/s folds prefill into the time, and a head that decodes fast can still lose on a prefill
that costs ten times plain's; the parts say which. All figures are the run's own measurements (the JSON's
per-prompt `stats`); nothing is modeled here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def breakdown(row: dict, plain: dict) -> dict:
    """The table's columns for one row of the dfvg phase (`plain` is the run's dfvg_plain row)."""
    stats = row["stats"]
    steps = sum(s["num_verify_steps"] for s in stats)
    accepted = sum(s["num_accepted_tokens"] for s in stats)
    decode = sum(s["decode_s"] for s in stats)
    return {
        "tokens_per_s": row["tokens_per_s"],
        "vs_plain": row["tokens_per_s"] / plain["tokens_per_s"],
        "tau": (accepted + steps) / steps,
        "identical_to_plain": sum(a == b for a, b in zip(row["tokens"], plain["tokens"], strict=True)),
        "prompts": len(stats),
        "decode_only_tokens_per_s": row["new_tokens"] / decode,
        "prefill_ms_per_prompt": 1e3 * sum(s["prefill_s"] for s in stats) / len(stats),
        "draft_ms_per_step": 1e3 * sum(s["draft_s"] for s in stats) / steps,
        "verify_ms_per_step": 1e3 * sum(s["verify_s"] for s in stats) / steps,
        "other_ms_per_step": 1e3 * (decode - sum(s["draft_s"] + s["verify_s"] for s in stats)) / steps,
        "provenance": "measured",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="the dfvg phase's JSON of a gpu_speed.py run")
    args = parser.parse_args(argv)
    path = Path(args.json)
    if not path.is_file():
        print(f"error: {path}: no such file (gpu_speed.py --out DIR writes DIR/dfvg.json)", file=sys.stderr)
        return 2
    data = json.loads(path.read_text())
    if "dfvg_plain" not in data:
        print(f"error: {path} has no dfvg_plain row; give the dfvg phase's JSON", file=sys.stderr)
        return 2
    rows = {name: breakdown(row, data["dfvg_plain"]) for name, row in data.items()
            if isinstance(row, dict) and "stats" in row and "tokens" in row}
    print(f"{'row':34} {'tok/s':>7} {'x plain':>7} {'tau':>5} {'same':>5} {'decode tok/s':>12} "
          f"{'prefill ms':>10} {'draft ms':>8} {'verify ms':>9} {'other ms':>8}")
    for name, r in rows.items():
        print(f"{name:34} {r['tokens_per_s']:7.1f} {r['vs_plain']:7.2f} {r['tau']:5.2f} "
              f"{r['identical_to_plain']:>2}/{r['prompts']:<2} {r['decode_only_tokens_per_s']:12.0f} "
              f"{r['prefill_ms_per_prompt']:10.1f} {r['draft_ms_per_step']:8.2f} {r['verify_ms_per_step']:9.2f} "
              f"{r['other_ms_per_step']:8.2f}")
    out = path.with_name(path.stem + "_breakdown.json")
    out.write_text(json.dumps({"source": str(path), "gpu": data.get("env", {}).get("gpu"), "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
