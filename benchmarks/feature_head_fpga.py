"""The feature head on the FPGA datapath: greedy acceptance of the int8 / int4 head against the float head.

    python benchmarks/feature_head_fpga.py --head models/fh-l4-d512-2026-12-05 \
        --output benchmarks/cpu_2026-12-05/feature_head_fpga.json

Issue 15 asks that a shipped draft's integer datapath keep its mean accepted length (τ) within 3 % of the
float draft's. This measures it for a feature head, on the head's own held-out splits: the prompt sources
and --val-fraction / --test-fraction of its training recipe (dfvg.distill.data.split), the first
--val-per-source validation and --test-per-source test prompts of each source. Validation is what design
choices were made on; test is what the README quotes. The FPGA artifact's calibration prompts (the last four
HumanEval prompts, dfvg.fpga.datapath.artifact) are left out of both.

How: the target (fp32, on this CPU) continues each prompt greedily (cached under --cache with its recipe);
one teacher-forced target pass gives its final-norm features; then each variant's drafts are replayed block by
block as the drafter makes them (`dfvg.distill.feature.rollouts` for the float head,
`dfvg.fpga.datapath.head_model.integer_rollouts` for the integer one), which is exact for greedy decoding:
a test checks the replay step for step against real runs of both drafters. Every figure is measured on this
machine; nothing here is timed. The last line printed is one JSON object (also written to --output).

`--draft DIR` adds a standalone draft's float and integer τ on the same prompts (teacher forced, exact for
greedy: `dfvg.distill.evaluate`). The shipped 4 x 512 draft drew its prompts from the same humaneval and
sharegpt5k files with --heldout-fraction 0.25, which is this test split, and never saw pystdlib: the test
split is held out for it too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfvg.checkpoint import load_config, load_model  # noqa: E402
from dfvg.distill import data, evaluate, feature, teacher  # noqa: E402
from dfvg.engine import Engine, make_drafter  # noqa: E402
from dfvg.errors import UserError  # noqa: E402
from dfvg.feature_head import load_feature_head  # noqa: E402
from dfvg.fpga.board.boards import get_board  # noqa: E402
from dfvg.fpga.board.latency import DesignParams, model_block  # noqa: E402
from dfvg.fpga.board.workload import draft_workload  # noqa: E402
from dfvg.fpga.datapath.artifact import load_or_build, load_or_build_head  # noqa: E402
from dfvg.fpga.datapath.head_model import IntegerFeatureHead, integer_rollouts  # noqa: E402
from dfvg.fpga.datapath.head_quantize import quantize_features  # noqa: E402
from dfvg.fpga.datapath.integer_model import IntegerDraftModel, chain_layout  # noqa: E402
from dfvg.outputs import atomic_write, check_output_file  # noqa: E402
from dfvg.sampling import SamplingParams  # noqa: E402
from dfvg.tokenizer import eos_token_ids, load_tokenizer  # noqa: E402
from dfvg.tree import parse_tree_spec  # noqa: E402
from dfvg.verifier import TorchVerifier  # noqa: E402

CALIBRATION_KEYS = {f"humaneval/HumanEval/{i}" for i in range(160, 164)}  # artifact.calibration_set's prompts


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="models/qwen2.5-coder-1.5b-instruct")
    p.add_argument("--head", default="", help="a feature head's folder ('' = only build the teacher cache)")
    p.add_argument("--prompt-dir", default="results/distill_prompts",
                   help="folder with humaneval.jsonl, sharegpt5k.jsonl, pystdlib.jsonl (scripts/prepare_dataset.py)")
    p.add_argument("--sources", default="humaneval,sharegpt5k,pystdlib")
    p.add_argument("--val-fraction", type=float, default=0.1, help="the head's recipe's --val-fraction")
    p.add_argument("--test-fraction", type=float, default=0.25, help="the head's recipe's --test-fraction")
    p.add_argument("--val-per-source", type=int, default=8)
    p.add_argument("--test-per-source", type=int, default=16)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--variants", default="float,int8,int4", help="float, int8, int4 (comma-separated)")
    p.add_argument("--group-size", type=int, default=128, help="int4 group size")
    p.add_argument("--draft", default="", help="also a standalone draft's float / integer τ on the same prompts")
    p.add_argument("--draft-variants", default="float,int8,int4")
    p.add_argument("--ks", default="2,4,6,8")
    p.add_argument("--cache", default="results/fpga_head_eval", help="teacher continuations and features")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--e2e-prompts", type=int, default=0,
                   help="also decode N test prompts end to end (the first N / sources of each source; fp32 target "
                        "on this CPU): plain, the float and int8 heads as k-chains and as --e2e-trees")
    p.add_argument("--e2e-k", type=int, default=4)
    p.add_argument("--e2e-trees", default="3,2,2,1,1;dynamic:16", help="tree shapes, ';'-separated ('' = none)")
    p.add_argument("--e2e-int4", action="store_true", help="also the int4 head as a k-chain, end to end")
    p.add_argument("--write-prompts", default="",
                   help="only write the test split's prompts to this JSON file in gpu_speed.py's --prompts-file "
                        "format (source by source, the first --test-per-source of each), then stop")
    p.add_argument("--output", default="")
    return p.parse_args(argv)


def held_out_prompts(args, tokenizer) -> dict[str, list[data.Prompt]]:
    """{"validation": [...], "test": [...]}: the first N of each source in each split, calibration left out."""
    files = [str(Path(args.prompt_dir) / f"{name}.jsonl") for name in args.sources.split(",")]
    for f in files:
        if not Path(f).is_file():
            raise UserError(f"{f} is missing; write it with scripts/prepare_dataset.py or pass --prompt-dir")
    prompts = [p for p in data.load_prompt_ids(",".join(files), tokenizer, args.max_prompt_tokens)
               if p.key not in CALIBRATION_KEYS]
    _, val, test = data.split(prompts, args.val_fraction, args.test_fraction)
    out = {}
    for part, chosen, count in (("validation", val, args.val_per_source), ("test", test, args.test_per_source)):
        by_source: dict[str, list[data.Prompt]] = {}
        for p in chosen:
            by_source.setdefault(source_of(p), []).append(p)
        out[part] = [p for group in by_source.values() for p in group[:count]]
    return out


def source_of(prompt: data.Prompt) -> str:
    return prompt.key.split("/", 1)[0]


def continuations(args, part: str, prompts: list[data.Prompt], loaded: dict) -> list[teacher.TeacherSequence]:
    """The fp32 target's greedy continuations, from the cache when its recipe matches."""
    directory = Path(args.cache) / part
    recipe = {"target": data.target_fingerprint(args.target), "prompts_sha256": data.prompts_sha(prompts),
              "max_new_tokens": args.max_new_tokens, "dtype": "float32", "temperature": 0.0}
    cached = data.load_teacher(directory, recipe)
    if cached is not None:
        return cached
    model = target(args, loaded)
    start = time.perf_counter()
    seqs = teacher.generate_all(model, [p.ids for p in prompts], args.max_new_tokens,
                                set(eos_token_ids(args.target)), 1, SamplingParams(0.0), 0, 8,
                                log=lambda line: print(f"{part}: {line} ({time.perf_counter() - start:.0f} s)",
                                                       file=sys.stderr))
    data.save_teacher(directory, seqs, recipe)
    return data.load_teacher(directory, recipe)


def target(args, loaded: dict):
    if "target" not in loaded:
        loaded["target"] = load_model(args.target, dtype=torch.float32, device="cpu")
    return loaded["target"]


def features_of(args, part: str, seqs: list[teacher.TeacherSequence], loaded: dict) -> list[torch.Tensor]:
    """The target's final-norm features [L + n - 1, H] of each sequence, cached next to its continuations."""
    path = Path(args.cache) / part / "features.safetensors"
    key = data.prompts_sha([data.Prompt(str(i), s.prompt + s.continuation) for i, s in enumerate(seqs)] +
                           [data.Prompt(json.dumps(data.target_fingerprint(args.target)), [])])
    if path.is_file():
        stored = load_file(str(path))
        if stored.get("key") is not None and bytes(stored["key"].tolist()).decode() == key:
            return [stored[f"f{i}"] for i in range(len(seqs))]
    model = target(args, loaded)
    out = []
    for seq in seqs:
        ids = torch.tensor([seq.prompt + seq.continuation[:-1]])
        out.append(feature.target_features(model, ids, torch.arange(ids.shape[1])[None])[0])
    tensors = {f"f{i}": f.contiguous() for i, f in enumerate(out)} | {"key": torch.tensor(list(key.encode()))}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    for flag, path in (("--write-prompts", args.write_prompts), ("--output", args.output)):
        if path:  # refused in one line now, not after the target's continuations
            check_output_file(path, flag)
    if args.head and not args.write_prompts and args.variants and load_config(args.head).block_size:
        raise UserError(f"{args.head} drafts blocks (dfvg_block_size), and the replayed variants draft chains: pass "
                        "--variants '' and measure it end to end (--e2e-prompts N --e2e-trees '' --e2e-int4)")
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.target)
    parts, loaded = held_out_prompts(args, tokenizer), {}
    if args.write_prompts:  # the GPU benchmark's end-to-end runs on exactly these held-out prompts
        rows = [{"id": p.key, "ids": p.ids, "held_out": True} for p in parts["test"]]
        atomic_write(Path(args.write_prompts), json.dumps(rows))
        print(f"{len(rows)} test prompts -> {args.write_prompts}", file=sys.stderr)
        result = {"prompts": {"test": [row["id"] for row in rows]}, "written": args.write_prompts}
        print(json.dumps(result))
        return result
    seqs = {part: continuations(args, part, prompts, loaded) for part, prompts in parts.items()}
    feats = {part: features_of(args, part, seqs[part], loaded) for part in parts} if args.head else {}
    loaded.clear()
    result = {"prompts": {part: [p.key for p in prompts] for part, prompts in parts.items()},
              "max_new_tokens": args.max_new_tokens, "variants": {}}
    if args.head:
        result["variants"] = evaluate_variants(args, parts, seqs, feats)
    if args.draft:
        result["draft"] = {"path": args.draft, "variants": evaluate_draft(args, parts, seqs)}
    if args.head and args.e2e_prompts:
        result["end_to_end"] = end_to_end(args, parts["test"])
    text = json.dumps(result)
    if args.output:
        atomic_write(Path(args.output), json.dumps(result, indent=1))
    print(text)
    return result


def parse_variant(name: str) -> tuple[str, int, int]:
    """"float" | "int8" | "int4" | "int8/p8" (predict reads 8-bit rows) -> (kind, bits, predict_bits)."""
    kind, _, predict = name.partition("/p")
    if kind not in ("float", "int8", "int4") or predict not in ("", "8", "16") or (kind == "float" and predict):
        raise UserError(f"--variants entry {name!r}: use float, int8, int4, or int8/p8, int4/p16 (predict's width)")
    return kind, 8 if kind == "int8" else 4, int(predict or 16)


def board_figures(model: IntegerFeatureHead, tensors: dict, hidden: int, group_size: int) -> dict:
    """The artifact's bytes (measured: its tensors) and the modeled U280 block of k = 4 after a 256-token
    context with 3 new positions (their int8 features in), as `FpgaFeatureDrafter.modeled_block_s` gives it."""
    workload = draft_workload(model.config, model.bits, group_size, feature_size=hidden, feature_bits=8)
    block = model_block(workload, get_board("u280"), DesignParams(), 4, 256, 3)
    return {"artifact_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "streamed_bytes_per_token_modeled": workload.streamed_weight_bytes(),
            "u280_block_ms_k4_modeled": 1e3 * block.block_time.value, "bound": block.bound}


def drafts_of(args, name: str, head, sequences, features, board: dict) -> list[torch.Tensor]:
    """Each sequence's replayed drafts [n, max k] for one variant (`board`: its artifact's figures)."""
    kind, bits, predict_bits = parse_variant(name)
    depth = max(int(k) for k in args.ks.split(","))
    if kind == "float":
        return [feature.rollouts(head, f, seq, depth) for seq, f in zip(sequences, features, strict=True)]
    tensors, meta = load_or_build_head(args.head, args.target, bits, args.group_size, predict_bits)
    model = IntegerFeatureHead(tensors, head.body.config, bits, "cpu")
    board[name] = board_figures(model, tensors, head.target_hidden_size, args.group_size)
    scales = torch.tensor(meta["feature_head"]["feature_scales"], dtype=torch.float64)
    vocab_limit = load_config(args.target).vocab_size  # as the drafter limits its picks to the target's ids
    return [integer_rollouts(model, quantize_features(f, scales), seq, depth, vocab_limit)
            for seq, f in zip(sequences, features, strict=True)]


def tables(args, prompts, sequences, drafted) -> dict:
    """τ and acceptance at every k over all prompts of a split, and per source, from replayed drafts."""
    ks = [int(k) for k in args.ks.split(",")]
    return steps_tables(args, prompts, [{k: feature.feature_steps(d, seq, k, args.max_new_tokens) for k in ks}
                                        for seq, d in zip(sequences, drafted, strict=True)])


def steps_tables(args, prompts, steps: list[dict]) -> dict:
    """τ and acceptance at every k over all prompts of a split, and per source, from each sequence's steps."""
    ks = [int(k) for k in args.ks.split(",")]

    def table(rows: list[int]) -> dict:
        return evaluate.steps_table({k: [s for i in rows for s in steps[i][k]] for k in ks})

    sources = sorted({source_of(p) for p in prompts})
    return {"all": table(list(range(len(prompts)))),
            **{name: table([i for i, p in enumerate(prompts) if source_of(p) == name]) for name in sources}}


def draft_matches(args, name: str, sequences) -> list[torch.Tensor]:
    """A standalone draft's teacher-forced greedy matches per sequence (exact for greedy, dfvg.distill.evaluate):
    the float draft, or its integer datapath (every position's integer logits from one chain pass, which
    integer sums make equal to the drafter's incremental ones)."""
    kind, bits, _ = parse_variant(name)
    if kind == "float":
        return evaluate.greedy_matches(load_model(args.draft, dtype=torch.float32, device="cpu"), sequences)
    tensors, _ = load_or_build(args.draft, bits, args.group_size)
    model = IntegerDraftModel(tensors, load_config(args.draft), bits, "cpu")
    vocab_limit = load_config(args.target).vocab_size
    out = []
    for seq in sequences:
        ids = torch.tensor(seq.prompt + seq.continuation[:-1])
        model.setup_cache(ids.shape[0])
        logits = model.tree_logits(ids, chain_layout(0, ids.shape[0], model.device))[len(seq.prompt) - 1:]
        out.append(model.tokens(logits, vocab_limit) == torch.tensor(seq.continuation))
    return out


def evaluate_draft(args, parts, seqs) -> dict:
    """The standalone draft's float and integer τ on the same splits (its own held-out set: module docstring)."""
    ks = [int(k) for k in args.ks.split(",")]
    out = {}
    for name in args.draft_variants.split(","):
        out[name] = {}
        for part in parts:
            matches = draft_matches(args, name, seqs[part])
            out[name][part] = steps_tables(args, parts[part], [
                {k: evaluate.block_steps(m, k, args.max_new_tokens) for k in ks} for m in matches])
        k = 4 if 4 in ks else ks[0]
        print(f"draft {name}: test τ(k={k}) {out[name]['test']['all'][k]['mean_accepted_length']:.3f}", file=sys.stderr)
    return out


def evaluate_variants(args, parts, seqs, feats) -> dict:
    head = load_feature_head(args.head, torch.float32, "cpu")
    out, board = {}, {}
    for name in filter(None, args.variants.split(",")):
        start = time.perf_counter()
        out[name] = {part: tables(args, parts[part], seqs[part],
                                  drafts_of(args, name, head, seqs[part], feats[part], board)) for part in parts}
        out[name]["board"] = board.get(name)
        k = 4 if 4 in out[name]["test"]["all"] else next(iter(out[name]["test"]["all"]))
        line = " ".join(f"{part} τ(k={k}) {out[name][part]['all'][k]['mean_accepted_length']:.3f}" for part in parts)
        print(f"{name}: {line} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return out


def end_to_end(args, prompts: list[data.Prompt]) -> dict:
    """Real decoding (`Engine.decode`, greedy, the eager fp32 target): per row, pooled τ, the prompts whose
    output equals plain, and wall time on this CPU (not the product's speed: the target is the cost here)."""
    verifier = TorchVerifier(load_model(args.target, dtype=torch.float32, device="cpu"))
    engine = Engine(verifier)
    per_source = -(-args.e2e_prompts // len({source_of(p) for p in prompts}))
    chosen = [p for name in sorted({source_of(p) for p in prompts})
              for p in [q for q in prompts if source_of(q) == name][:per_source]]
    head_fpga = make_drafter(args.head, "fpga", torch.float32, verifier.vocab_size, verifier=verifier)
    head_cpu = make_drafter(args.head, "cpu", torch.float32, verifier.vocab_size, fast=False, verifier=verifier)
    rows = [("plain", None, 0, None), (f"float_k{args.e2e_k}", head_cpu, args.e2e_k, None),
            (f"int8_k{args.e2e_k}", head_fpga, args.e2e_k, None)]
    if args.e2e_int4:  # the int4 datapath (FpgaFeatureDrafter bits=4), beside int8
        head_int4 = make_drafter(args.head, "fpga", torch.float32, verifier.vocab_size, verifier=verifier, bits=4,
                                 group_size=args.group_size)
        rows.append((f"int4_k{args.e2e_k}", head_int4, args.e2e_k, None))
    for shape in filter(None, args.e2e_trees.split(";")):
        spec = parse_tree_spec(shape)
        rows += [(f"int8_tree_{shape}", head_fpga, spec.depth(args.e2e_k), spec),
                 (f"float_tree_{shape}", head_cpu, spec.depth(args.e2e_k), spec)]
    out, plain_tokens = {}, []
    for name, drafter, k, tree in rows:
        runs = []
        for i, prompt in enumerate(chosen):
            run = engine.decode(drafter, prompt.ids, args.max_new_tokens, k=k, tree=tree)
            if drafter is None:
                plain_tokens.append(run.tokens)
            runs.append({"key": prompt.key, "equal_to_plain": run.tokens == plain_tokens[i], **{
                n: run.stats()[n] for n in ("num_verify_steps", "num_draft_tokens", "num_accepted_tokens",
                                            "num_new_tokens", "decode_s", "draft_s", "verify_s", "modeled_draft_s")}})
        steps = sum(r["num_verify_steps"] for r in runs)
        out[name] = {"tau_pooled": sum(r["num_accepted_tokens"] + r["num_verify_steps"] for r in runs) / steps,
                     "equal_to_plain": sum(r["equal_to_plain"] for r in runs), "prompts": len(runs),
                     "nodes_per_step": sum(r["num_draft_tokens"] for r in runs) / steps, "runs": runs}
        print(f"{name}: τ {out[name]['tau_pooled']:.3f}, {out[name]['equal_to_plain']}/{len(runs)} equal plain",
              file=sys.stderr)
    return out


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
