"""Merge the phase files of benchmarks/gpu_speed.py into one result and print the table and the goals.

Reference for token match: HF eager generate() (plain greedy decoding of the same bf16 weights); a second
column compares with DFVG plain decoding. Both are prefix matches: the share of the 128 tokens before the
first difference, averaged over prompts (bf16 near-ties can flip a token; everything after it differs).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

COPY_TB_S = 4.3  # measured device-to-device copy rate of an H200 here (KINDS.md, 2026-10-28 / 11-04)


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def match_rate(run: dict, ref: dict | None) -> float | None:
    if ref is None or len(ref["tokens"]) != len(run["tokens"]):
        return None
    return statistics.mean(_prefix(a, b) / max(1, len(b)) for a, b in zip(run["tokens"], ref["tokens"], strict=True))


def acceptance(run: dict) -> tuple[float | None, float | None]:
    stats = [s for s in run["stats"] if s]
    drafted = sum(s["num_draft_tokens"] for s in stats)
    if not drafted:
        return None, None
    accepted = sum(s["num_accepted_tokens"] for s in stats)
    steps = sum(s["num_verify_steps"] for s in stats)
    return accepted / drafted, (accepted + steps) / steps


def projected_tok_s(run: dict) -> float | None:
    """Tokens per second with the draft on the modeled board (`modeled`): each prompt's `projected_s`, the
    host pipeline's replay of its schedule (benchmarks/gpu_phases.fpga_runner). Files written before that
    existed carry no timeline: a sync run is then projected as its wall time with the measured draft time
    replaced by the modeled one (exact for back-to-back stages); an overlap run is not projected (None)."""
    stats = [s for s in run["stats"] if s]
    if not stats or len(stats) != len(run["walls_s"]):
        return None
    if all(s.get("projected_s") is not None for s in stats):
        return run["new_tokens"] / sum(s["projected_s"] for s in stats)
    if "overlap" in run.get("name", "") or any(s.get("modeled_draft_s") is None for s in stats):
        return None
    wall = sum(w - s["draft_s"] + s["modeled_draft_s"] for w, s in zip(run["walls_s"], stats, strict=True))
    return run["new_tokens"] / wall


def collect(results: Path) -> tuple[dict, dict]:
    runs, meta = {}, {}
    for file in sorted(results.glob("*.json")):
        if file.name == "gpu_speed.json":
            continue
        payload = json.loads(file.read_text())
        meta[file.stem] = {k: v for k, v in payload.items() if not isinstance(v, dict) or "walls_s" not in v}
        runs.update({k: v for k, v in payload.items() if isinstance(v, dict) and "walls_s" in v})
    return runs, meta


def decode_ms_per_token(run: dict) -> float:
    """Median over prompts of decode time per generated token (prefill excluded)."""
    return statistics.median(1000 * s["decode_s"] / s["num_new_tokens"] for s in run["stats"] if s)


def rows_of(runs: dict) -> list[dict]:
    plain, hf = runs.get("dfvg_plain"), runs.get("hf_eager")
    assists = [r for name, r in runs.items() if name.startswith("hf_assist")]
    best_assist = max(assists, key=lambda r: r["tokens_per_s"]) if assists else None
    rows = []
    for name, run in runs.items():
        rate, mal = acceptance(run)
        rows.append({"variant": name, "tok_s": run["tokens_per_s"], "ms_tok": run["median_ms_per_token"],
                     "x_dfvg_plain": run["tokens_per_s"] / plain["tokens_per_s"] if plain else None,
                     "x_hf_eager": run["tokens_per_s"] / hf["tokens_per_s"] if hf else None,
                     "x_hf_assist_best": run["tokens_per_s"] / best_assist["tokens_per_s"] if best_assist else None,
                     "acceptance_rate": rate, "mean_accepted_length": mal,
                     "match_vs_hf": match_rate(run, hf), "match_vs_dfvg_plain": match_rate(run, plain),
                     "projected_tok_s": projected_tok_s(run), "prompts": len(run["walls_s"])})
    return rows


def goals(runs: dict, meta: dict) -> dict:
    out = {}
    plain, hf = runs.get("dfvg_plain"), runs.get("hf_eager")
    weights = next((m["weight_bytes"]["target"] for m in meta.values() if "weight_bytes" in m), None)
    if plain and weights:
        ms = decode_ms_per_token(plain)
        floor_ms = weights / (COPY_TB_S * 1e12) * 1e3
        out["plain_decode_ms_per_token"] = ms
        out["bandwidth_floor_ms"] = floor_ms
        out["achieved_TB_s"] = weights / (ms * 1e-3) / 1e12
        out["fraction_of_floor"] = floor_ms / ms
        out["goal_plain_70pct_floor_met"] = floor_ms / ms >= 0.7
        out["goal_plain_le_1.2ms_met"] = ms <= 1.2
    if plain and hf:
        out["plain_over_hf_eager"] = plain["tokens_per_s"] / hf["tokens_per_s"]
        out["goal_plain_25x_hf_met"] = out["plain_over_hf_eager"] >= 25
    specs = {n: r for n, r in runs.items() if n.startswith("dfvg_spec")}
    assists = {n: r for n, r in runs.items() if n.startswith("hf_assist")}
    if specs and assists:
        best_spec = max(specs, key=lambda n: specs[n]["tokens_per_s"])
        best_assist = max(assists, key=lambda n: assists[n]["tokens_per_s"])
        ratio = specs[best_spec]["tokens_per_s"] / assists[best_assist]["tokens_per_s"]
        out["best_spec"], out["best_hf_assist"], out["spec_over_hf_assist_best"] = best_spec, best_assist, ratio
        out["goal_spec_1.5x_hf_assist_met"] = ratio >= 1.5
        if plain:
            out["best_spec_over_dfvg_plain"] = specs[best_spec]["tokens_per_s"] / plain["tokens_per_s"]
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    head = ("| variant | prompts | tok/s | ms/token (median) | x DFVG plain | x HF eager | x HF assisted best "
            "| acceptance | mean acc. len | match vs HF | match vs DFVG plain | projected tok/s |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['prompts']} | {r['tok_s']:.1f} | {r['ms_tok']:.3f} | "
                     f"{_fmt(r['x_dfvg_plain'], '.2f')} | {_fmt(r['x_hf_eager'], '.2f')} | "
                     f"{_fmt(r['x_hf_assist_best'], '.2f')} | {_fmt(r['acceptance_rate'], '.3f')} | "
                     f"{_fmt(r['mean_accepted_length'], '.2f')} | {_fmt(r['match_vs_hf'], '.3f')} | "
                     f"{_fmt(r['match_vs_dfvg_plain'], '.3f')} | {_fmt(r['projected_tok_s'], '.1f')} |")
    return "\n".join(lines)


def report(results: Path) -> dict:
    runs, meta = collect(results)
    rows = rows_of(runs)
    merged = {"rows": rows, "goals": goals(runs, meta), "meta": meta, "provenance": "measured"}
    (results / "gpu_speed.json").write_text(json.dumps(merged, indent=1))
    print(table(rows))
    print(json.dumps(merged["goals"], indent=1))
    return merged
