"""Acceptance of distilled FPGA-sized drafts vs the real 0.5B draft on held-out HumanEval (docs/distill.md).

    python benchmarks/distill_eval.py --target models/qwen2.5-coder-1.5b-instruct \
        --distilled results/distill/l4-d512-v32k [more dirs] --device cuda --output results/distill/eval.json

Two measurements, both on the test-split HumanEval prompts of the first distilled draft's recipe (never
trained on, nor chosen by, any draft made with the same prompt set and --test-fraction):
1. teacher-forced, exact for greedy (dfvg/distill/evaluate.py): every k in --ks from one pass per draft
   over the target's cached greedy continuations: acceptance rate and mean accepted length (bonus counted).
2. end to end with `dfvg.generate` for --e2e-prompts prompts at --e2e-k: measured acceptance, verify and
   draft seconds per step, and the share of outputs equal to plain greedy (bf16 on a GPU: reported, not
   asserted). FPGA rows run the integer datapath emulated on the GPU (`FpgaDrafter`, mode emulate); when
   the FPGA quantizer cannot take a head-vocabulary draft the row says why instead. Prompts are the
   held-out ids exactly as the teacher saw them (same --max-prompt-tokens truncation).
Every number is `measured` on this machine, except the FPGA block times and the projections built on them
(`modeled`: dfvg.fpga.board.latency over dfvg.fpga.board.workload, replayed by dfvg.host.projection).
The last line printed is one JSON object (also written to --output).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_speed import draft_lengths  # noqa: E402
from dfvg.checkpoint import load_config, load_model, read_json, resolve_dtype  # noqa: E402
from dfvg.distill import data, evaluate, sizing  # noqa: E402
from dfvg.drafter import TorchDrafter  # noqa: E402
from dfvg.engine import make_drafter  # noqa: E402
from dfvg.errors import UserError  # noqa: E402
from dfvg.generate import generate  # noqa: E402
from dfvg.gpu.graph_drafter import GraphDrafter  # noqa: E402
from dfvg.gpu.graphs import GraphVerifier  # noqa: E402
from dfvg.stats import Metric  # noqa: E402
from dfvg.tokenizer import eos_token_ids  # noqa: E402
from dfvg.verifier import TorchVerifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(ROOT / "models/qwen2.5-coder-1.5b-instruct"))
    p.add_argument("--baseline-draft", default=str(ROOT / "models/qwen2.5-coder-0.5b-instruct"),
                   help="the real 0.5B draft to compare with; '' = leave it out")
    p.add_argument("--distilled", nargs="+", required=True, help="draft folders written by distill_draft.py")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="", help="target/baseline dtype (default bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--ks", default="2,4,6,8", type=draft_lengths)
    p.add_argument("--e2e-prompts", type=int, default=8)
    p.add_argument("--e2e-tokens", type=int, default=128)
    p.add_argument("--e2e-k", default="4", type=draft_lengths)
    p.add_argument("--fpga-bits", default="8,4", help="FPGA datapath widths for the first distilled draft; '' = none")
    p.add_argument("--output", default=str(ROOT / "results/distill/eval.json"))
    return p.parse_args()


def held_out_humaneval(distilled_dir: Path) -> tuple[list, list[str]]:
    """The cached greedy continuations of the test-split HumanEval prompts, and their keys (a recipe of
    the two-way split names them `heldout`: at 0.25 the same prompts, data.split_of says why)."""
    recipe = read_json(distilled_dir / "distill_recipe.json", "distill recipe")
    part = "test" if "test_prompts" in recipe else "heldout"
    cache = Path(recipe["options"]["teacher_cache"] or distilled_dir / "teacher") / part
    seqs = data.load_teacher(cache, read_json(cache / data.TEACHER_META, "teacher cache meta").get("recipe"))
    if seqs is None:
        raise UserError(f"no {part} teacher data in {cache}; run scripts/distill_draft.py first")
    keys = recipe[f"{part}_prompts"]
    keep = [i for i, key in enumerate(keys) if key.startswith("humaneval/")]
    return [seqs[i] for i in keep], [keys[i] for i in keep]


def teacher_forced(drafts: dict[str, Path], seqs: list, ks: list[int], device: torch.device, dtype) -> dict:
    """acceptance_table of each float draft over the held-out continuations (one pass per draft)."""
    table = {}
    for name, directory in drafts.items():
        model = load_model(directory, dtype=dtype if name == "0.5b" else torch.float32, device=device)
        table[name] = evaluate.acceptance_table(evaluate.greedy_matches(model, seqs, batch_size=4), ks)
        del model
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return table


def e2e_row(verifier, drafter, prompts: list[list[int]], plain: list[list[int]], k: int, tokens: int, eos) -> dict:
    steps, same, draft_s, verify_s = [], 0, [], []
    for prompt, reference in zip(prompts, plain, strict=True):
        result = generate(verifier, prompt, tokens, eos_ids=eos, drafter=drafter, draft_length=k)
        steps += result.steps
        same += result.tokens == reference
        draft_s += [s.draft_s for s in result.steps]
        verify_s += [s.verify_s for s in result.steps]
    accepted, drafted = sum(s.num_accepted for s in steps), sum(s.num_drafted for s in steps)
    return {"k": k, "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_accepted_length": sum(s.num_accepted + 1 for s in steps) / len(steps),
            "median_draft_s_per_step": statistics.median(draft_s),
            "median_verify_s_per_step": statistics.median(verify_s),
            "outputs_equal_to_plain_greedy": same / len(prompts), "provenance": "measured"}


def drafters(args, drafts: dict[str, Path], device, dtype, vocab: int):
    """(name, factory) of every end-to-end drafter: float drafts, then the FPGA datapath rows."""
    rows = [(name, lambda d=d, n=name: TorchDrafter(load_model(d, dtype=dtype if n == "0.5b" else torch.float32,
                                                                device=device), vocab)) for name, d in drafts.items()]
    first = Path(args.distilled[0])
    for bits in [int(b) for b in args.fpga_bits.split(",") if b.strip()]:
        rows.append((f"{first.name}-fpga-int{bits}", lambda b=bits: make_drafter(
            first, "fpga", torch.float32, vocab, bits=b, emulate_device=str(device))))
    return rows


def end_to_end(args, verifier, drafts: dict[str, Path], seqs: list, device, dtype) -> dict:
    """Real speculative runs on the held-out prompts exactly as the teacher saw them (same truncation).

    On CUDA the verifier is DFVG's CUDA-graph one (what `dfvg generate --graphs` runs); elsewhere eager."""
    eos = eos_token_ids(args.target)
    prompts = [s.prompt for s in seqs[: args.e2e_prompts]]
    generate(verifier, prompts[0], 4)  # warm-up
    plain = [generate(verifier, p, args.e2e_tokens, eos_ids=eos).tokens for p in prompts]
    out = {"_verifier": type(verifier).__name__}
    for name, factory in drafters(args, drafts, device, dtype, verifier.vocab_size):
        try:
            drafter = factory()
        except (UserError, RuntimeError, TypeError) as err:  # an FPGA row that cannot be built says why
            out[name] = {"unsupported": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
            print(f"e2e {name}: {out[name]}", flush=True)
            continue
        out[name] = [e2e_row(verifier, drafter, prompts, plain, k, args.e2e_tokens, eos) for k in args.e2e_k]
        print(f"e2e {name}: {json.dumps(out[name])}", flush=True)
    return out


def timed_fast(name: str, fast: tuple, prompts: list[list[int]], tokens: int, device: str) -> dict:
    """gpu_speed.timed_runs (warm-up, device-synchronized timing, tok/s, ms/token) plus the median decode
    step and the acceptance over all steps."""
    from benchmarks.gpu_speed import timed_runs

    engine, drafter, k = fast  # the product's path: Engine.decode (the device step for a graph pair)

    def run_one(ids: list[int]):
        result = engine.decode(drafter, ids, tokens, k=k)
        return result.tokens, {"steps": result.steps, "step_s": result.decode_s / max(1, len(result.steps))}

    run = timed_runs(name, [{"ids": p} for p in prompts], run_one, device)
    steps = [s for st in run["stats"] for s in st["steps"]]
    drafted = sum(s.num_drafted for s in steps)
    return {"tokens_per_s": run["tokens_per_s"], "tokens": run["tokens"],
            "median_ms_per_token": run["median_ms_per_token"],
            "median_step_ms": 1e3 * statistics.median(st["step_s"] for st in run["stats"]),
            "acceptance_rate": sum(s.num_accepted for s in steps) / drafted if drafted else None,
            "mean_accepted_length": sum(s.num_accepted + 1 for s in steps) / len(steps), "provenance": "measured"}


def gpu_speed(args, verifier: GraphVerifier, drafts: dict[str, Path], seqs: list, ks: list[int]) -> dict:
    """Same run, CUDA graphs: DFVG plain vs each distilled draft on the GPU (the engine's device step), replay
    times, and the FPGA projection of both schedules against that plain decode (`fpga_projection`)."""
    from benchmarks.gpu_phases import step_times

    device = torch.device("cuda")
    prompts = [s.prompt for s in seqs[: args.e2e_prompts]]
    from benchmarks.gpu_phases import engine_for

    engine = engine_for(verifier)
    plain = timed_fast("dfvg plain", (engine, None, 0), prompts, args.e2e_tokens, "cuda")
    out = {"dfvg_plain": {k: v for k, v in plain.items() if k != "tokens"}}
    print(f"gpu plain: {plain['tokens_per_s']:.1f} tok/s, step {plain['median_step_ms']:.3f} ms", flush=True)
    for name, directory in drafts.items():
        if name == "0.5b":
            continue
        drafter = GraphDrafter(load_model(directory, device=device), verifier.vocab_size, cache_len=1024)
        rows = {}
        for k in ks:
            run = timed_fast(f"{name} k={k}", (engine, drafter, k), prompts, args.e2e_tokens, "cuda")
            run["outputs_equal_to_plain"] = sum(a == b for a, b in zip(run.pop("tokens"), plain["tokens"],
                                                                       strict=True)) / len(prompts)
            run["speedup_vs_plain"] = run["tokens_per_s"] / plain["tokens_per_s"]
            rows[f"k{k}"] = run
            print(f"gpu {name} k={k}: {run['tokens_per_s']:.1f} tok/s ({run['speedup_vs_plain']:.2f}x plain), "
                  f"alpha {run['acceptance_rate']:.3f} tau {run['mean_accepted_length']:.2f}", flush=True)
        rows["replay_ms"] = step_times(verifier, drafter, ks)
        out[name] = rows
    first = next(n for n in drafts if n != "0.5b")
    out["fpga_projection"] = fpga_projection(args, verifier, drafts[first], prompts, plain)
    return out


def fpga_projection(args, verifier, draft_dir: Path, prompts: list[list[int]], plain: dict) -> dict:
    """The FPGA draft on the modeled board, in both schedules, against the plain decode measured above in
    this same process: each prompt decoded through the engine with the datapath emulated on the GPU, then
    its schedule replayed with every draft block at its modeled board time (`gpu_phases.fpga_runner`:
    dfvg.host.projection, measured verify steps, the pipeline's own rule for using a block drafted ahead)."""
    from benchmarks.gpu_phases import fpga_runner
    from benchmarks.gpu_report import projected_tok_s
    from benchmarks.gpu_speed import timed_runs

    projection = {}
    for bits in [int(b) for b in args.fpga_bits.split(",") if b.strip()]:
        drafter = make_drafter(draft_dir, "fpga", torch.float32, verifier.vocab_size, bits=bits, emulate_device="cuda")
        for k in args.e2e_k:
            for mode in ("sync", "overlap"):
                run = timed_runs(f"fpga int{bits} {mode} k={k}", [{"ids": p} for p in prompts],
                                 fpga_runner(verifier, drafter, k, args.e2e_tokens, mode), "cuda")
                tok_s = projected_tok_s(run)
                projection[f"int{bits}_k{k}_{mode}"] = {
                    "projected_tok_s": tok_s, "plain_tok_s_measured": plain["tokens_per_s"],
                    "projected_speedup_vs_plain": tok_s / plain["tokens_per_s"],
                    "outputs_equal_to_plain": sum(a == b for a, b in zip(run["tokens"], plain["tokens"],
                                                                         strict=True)) / len(prompts),
                    "provenance": "modeled", "source": "dfvg.host.projection replay of this run's schedule: "
                    "draft blocks at their modeled U280 time, verify steps and prefill as measured here"}
                print(f"projected fpga int{bits} k={k} {mode}: {tok_s:.1f} tok/s = "
                      f"{tok_s / plain['tokens_per_s']:.2f}x plain measured in this run", flush=True)
    return projection


def modeled_fpga(drafts: dict[str, Path], e2e: dict, ks: list[int]) -> dict:
    """Modeled U280 fit and block time of each distilled draft vs the measured verify time per step."""
    verify = [r["median_verify_s_per_step"] for rows in e2e.values() if isinstance(rows, list) for r in rows]
    measured = None
    if verify:
        measured = Metric(statistics.median(verify), "s", "measured", "median verify_s per step, e2e runs")
    out = {}
    for name, directory in drafts.items():
        if name == "0.5b":
            continue
        for bits in (8, 4):
            s = sizing.size_draft(load_config(directory), bits, k=max(ks), verify=measured)
            out[f"{name}-int{bits}"] = {"fits_on_chip": s.fits_on_chip, "block_ms_modeled": s.block_time.value * 1e3,
                                        "hides_behind_measured_verify": s.hides_behind_verify, "lines": s.lines()}
    return out


def main() -> int:
    args = parse_args()
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    ks = args.ks
    baseline = {"0.5b": Path(args.baseline_draft)} if args.baseline_draft else {}
    drafts = baseline | {Path(d).name: Path(d) for d in args.distilled}
    seqs, keys = held_out_humaneval(Path(args.distilled[0]))
    print(f"held-out HumanEval prompts: {len(keys)}", flush=True)
    result = {"heldout_keys": keys, "teacher_forced": teacher_forced(drafts, seqs, ks, device, dtype)}
    for name, table in result["teacher_forced"].items():
        cells = [f"k={k} alpha={r['acceptance_rate']:.3f} tau={r['mean_accepted_length']:.2f}"
                 for k, r in table.items()]
        print(f"teacher-forced {name}: " + ", ".join(cells), flush=True)
    verifier = None
    if args.e2e_prompts > 0:  # one target for both end-to-end sections; CUDA graphs on a GPU
        target = load_model(args.target, dtype=dtype, device=device)
        verifier = GraphVerifier(target, cache_len=1024) if device.type == "cuda" else TorchVerifier(target)
    result["end_to_end"] = end_to_end(args, verifier, drafts, seqs, device, dtype) if verifier else {}
    result["fpga_modeled"] = modeled_fpga(drafts, result["end_to_end"], ks)
    if isinstance(verifier, GraphVerifier):
        try:  # recorded, not fatal: the acceptance tables above are already measured
            result["gpu_speed"] = gpu_speed(args, verifier, drafts, seqs, ks)
        except Exception as exc:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            result["gpu_speed"] = {"failed": f"{type(exc).__name__}: {exc}"}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
