"""DFVG on the GPU against Hugging Face generate() and assisted generation, in one process per phase.

    python benchmarks/gpu_speed.py --phases check,dfvg,hf_eager,hf_assist,hf_static,fpga,report \
        --gguf-dir /root/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --results /root/res
    python benchmarks/gpu_speed.py --tiny --device cpu --phases check,dfvg,hf_eager,hf_assist,report  # smoke
    python benchmarks/gpu_speed.py --write-prompts .chunks/prompts.json   # tokenize HumanEval here (CPU)
    python benchmarks/gpu_speed.py --phases llama_cpp,report --gguf-dir /root/cache/gguf ...  # llama.cpp peer

Phase `llama_cpp` (benchmarks/llama_cpp_peer.py) builds llama.cpp from `--llama-src` (made here by
benchmarks/llama_cpp_source.sh, carried to the GPU machine), makes a BF16 GGUF of the target, runs llama-bench
tg (BF16 and Q4_K_M) and llama-speculative with the 0.5B draft over the same prompts (draft length chosen on
the first `--llama-validation` prompts, quoted on the rest); it loads no torch model, only the prompts.

Greedy, batch 1, bf16 on CUDA, fixed `--max-new-tokens` per prompt (EOS does not stop any variant, so every
variant produces the same number of tokens and token-match rates compare like with like). Each variant is
warmed up on the first prompt (compilation, graph capture), then timed per prompt with the device
synchronized around it; the JSON keeps every per-prompt wall time and token list. Phases write
`<results>/<phase>.json` so a long run can be split across processes; `report` merges them into
`gpu_speed.json` and prints the table. Every number is `measured` on the machine named in the JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import llama_cpp_peer  # noqa: E402
from benchmarks.gpu_report import report  # noqa: E402
from dfvg.checkpoint import config_from_dict, convert_state_dict  # noqa: E402
from dfvg.errors import UserError  # noqa: E402
from dfvg.gpu.block_sizes import tuned_rows  # noqa: E402
from dfvg.model import Transformer  # noqa: E402
from dfvg.tree import TreeSpec, parse_tree_spec  # noqa: E402

TARGET_GGUF, DRAFT_GGUF = "qwen2.5-coder-1.5b-instruct.gguf", "qwen2.5-coder-0.5b-instruct.gguf"
SHIPPED_DRAFT = ROOT / "drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768"
KERNELS = ("fused", "compiled", "eager")  # what DFVG's graphs replay: fused Triton layers, compiled blocks, eager


def draft_lengths(text: str) -> list[int]:
    """'2,4,6,8' -> [2, 4, 6, 8]; anything else is refused in one line by argparse."""
    try:
        values = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of draft lengths, e.g. 2,4,6,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: draft lengths must be integers >= 1, e.g. 2,4,6,8")
    return values


def tree_specs(text: str) -> list[TreeSpec]:
    """'2,2,1,1 dynamic:16' -> tree shapes (space-separated); a bad one is refused in one line by argparse."""
    try:
        return [parse_tree_spec(part) for part in text.split()]
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", default="check,dfvg,hf_eager,hf_assist,report")
    p.add_argument("--gguf-dir", default="/root/gguf")
    p.add_argument("--work-dir", default="/root/w", help="bf16 HF copies are cached here after conversion")
    p.add_argument("--prompts-file", default=str(ROOT / ".chunks/prompts.json"))
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--ks", default="2,4,6,8", type=draft_lengths)
    p.add_argument("--hf-validation", type=int, default=3,
                   help="hf_assist with several --ks: the first N prompts choose k, the rest quote it")
    p.add_argument("--results", default="/root/res")
    p.add_argument("--out", default=None, help="also copy the JSON files here (the device's $OUT)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="random tiny Qwen2 pair (smoke test of this script)")
    p.add_argument("--kernels", default="fused", choices=KERNELS,
                   help="what DFVG's graphs replay: fused Triton layers, compiled blocks, or eager kernels")
    p.add_argument("--distilled-draft", default=str(SHIPPED_DRAFT),
                   help="FPGA-sized distilled draft: extra GPU-draft rows, and the FPGA phase's draft ('' = none)")
    p.add_argument("--extra-drafts", default="",
                   help="more standalone drafts, comma-separated folders (a deeper chain, a block drafter): "
                        "dfvg_<folder name>_k* rows at each --ks a draft can make in one block")
    p.add_argument("--feature-head", default="",
                   help="a feature head's folder (distill_draft.py --feature-head): dfvg_feature_k* rows ('' = none)")
    p.add_argument("--extra-heads", default="",
                   help="more feature heads, comma-separated folders (a block feature head): dfvg_<folder name>_k* "
                        "rows at each --ks a head can make in one block")
    p.add_argument("--tuned", default=None, help="tuned.json of benchmarks/gpu_rows.py --sweep: fused block sizes")
    p.add_argument("--skip-draft", action="store_true",
                   help="no 0.5B draft (its GGUF is not on the machine): target, distilled and FPGA rows only")
    p.add_argument("--fpga-ks", default="4,8", type=draft_lengths, help="draft lengths of the FPGA-emulated phase")
    p.add_argument("--fpga-head", default="", help="the fpga phase drafts with this feature head's integer datapath "
                                                   "instead of --distilled-draft (sync schedule only)")
    p.add_argument("--one-kernel", action="store_true",
                   help="dfvg phase: only --kernels' rows (no compiled-block / eager-kernel / eager-model plain rows)")
    p.add_argument("--trees", default="2,2,1,1 4,2,1,1 dynamic:16", type=tree_specs,
                   help="token-tree shapes the dfvg phase times at --tree-depth with each GPU draft ('' = none)")
    p.add_argument("--tree-depth", default=4, type=int,
                   help="the trees' draft length: a dynamic tree's depth (rows are named ..._d<depth> unless 4)")
    p.add_argument("--lookahead", action="store_true",
                   help="dfvg phase: also DFVG plain and each chain with dfvg.gpu.fast.LOOKAHEAD flipped, each right "
                        "after its row (rows suffixed _lookahead or _no_lookahead)")
    p.add_argument("--write-prompts", default=None)
    llama_cpp_peer.add_arguments(p)
    return p.parse_args(argv)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def env_info(device: str) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "date_utc": time.strftime(
        "%Y-%m-%d %H:%M:%S", time.gmtime()), "device": device}
    import transformers

    info["transformers"] = transformers.__version__
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                              "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip()
    return info


HELD_OUT = ROOT / "data/humaneval-heldout.jsonl"  # the 46 HumanEval prompts the shipped distilled draft never saw


def held_out_first(tasks: list[dict], held_out: list[str]) -> list[dict]:
    """Tasks whose id is in held_out first, in held_out's order; the rest after, in their own order."""
    rank = {task_id: i for i, task_id in enumerate(held_out)}
    return sorted(tasks, key=lambda t: rank.get(t["id"], len(held_out)))


def write_prompts(path: str, count: int = 164) -> None:
    """Tokenize HumanEval prompts with the target's tokenizer (raw prompt text, as benchmarks/cpu_pair.py).

    The distilled draft's held-out prompts come first, so `--prompts 20` times 20 prompts it never trained on
    (HumanEval/0-19 held 18 of its training prompts: the 2026-12-04 lease's distilled row is not held out)."""
    from dfvg.datasets import load_humaneval
    from dfvg.tokenizer import encode, load_tokenizer

    tokenizer = load_tokenizer(ROOT / "models/qwen2.5-coder-1.5b-instruct")
    held_out = [json.loads(line)["id"] for line in HELD_OUT.read_text().splitlines() if line.strip()]
    tasks = held_out_first(load_humaneval(limit=count), held_out)
    rows = [{"id": t["id"], "ids": encode(tokenizer, t["prompt"]), "held_out": t["id"] in held_out} for t in tasks]
    Path(path).write_text(json.dumps(rows))
    print(f"wrote {len(rows)} prompts to {path}; lengths {min(len(r['ids']) for r in rows)}.."
          f"{max(len(r['ids']) for r in rows)}")


def save_dequantized(model, folder: Path) -> None:
    """save_pretrained of a GGUF-loaded model, whose weights are already plain bf16 tensors: transformers marks
    such a model as GGUF-quantized and refuses to serialize it, but the FPGA head phase calibrates on the
    saved checkpoint, so the mark is dropped first (the tensors saved are the ones the run uses). A model that
    kept packed GGUF modules (transformers does where a dequantizing kernel package is installed) is refused:
    its weights are not plain tensors."""
    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    if packed:
        raise ValueError(f"the model keeps packed GGUF modules ({', '.join(packed)})")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)


def hf_from_gguf(args, name: str, tag: str):
    """HF model in bf16 on the device: from the work-dir copy, else converted from the GGUF (then saved)."""
    from transformers import AutoModelForCausalLM

    saved = Path(args.work_dir) / tag
    if (saved / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.bfloat16)
    else:
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(args.gguf_dir, gguf_file=name, dtype=torch.float32)
        model = model.to(torch.bfloat16)
        try:
            save_dequantized(model, saved)
        except ValueError as exc:
            print(f"[{tag}] not cached ({str(exc).splitlines()[0][:120]})", flush=True)
        print(f"[{tag}] converted {name} in {time.perf_counter() - start:.1f} s", flush=True)
    return model.to(args.device).eval().requires_grad_(False)


def hf_tiny(seed: int, device: str, **overrides):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.05,
               tie_word_embeddings=True)
    cfg.update(overrides)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg), dtype=torch.bfloat16)
    return model.to(device).eval().requires_grad_(False)


def dfvg_from_hf(hf) -> Transformer:
    """DFVG's Transformer sharing the HF model's tensors (fused q/k/v and gate/up are new tensors)."""
    from dfvg.download import _hf_config

    cfg = config_from_dict(_hf_config(hf))
    state = convert_state_dict(dict(hf.state_dict()), cfg)
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    return model.eval().requires_grad_(False)


def load_prompts(args) -> list[dict]:
    """The timed prompts, [{"id", "ids"}], the first `--prompts` of the file (random ids for --tiny)."""
    if args.tiny:
        prompts = [{"id": f"tiny/{i}", "ids": torch.randint(0, 512, (20 + 7 * i,)).tolist()} for i in range(6)]
        return prompts[: args.prompts]
    return json.loads(Path(args.prompts_file).read_text())[: args.prompts]


def load_models(args) -> dict:
    if args.tiny:
        target = hf_tiny(1, args.device)
        draft = hf_tiny(2, args.device, hidden_size=64, num_hidden_layers=1, intermediate_size=128)
    else:
        draft = None if args.skip_draft else hf_from_gguf(args, DRAFT_GGUF, "draft")
        target = hf_from_gguf(args, TARGET_GGUF, "target")
    prompts = load_prompts(args)
    models = {"hf_target": target, "hf_draft": draft, "target": dfvg_from_hf(target).to(args.device),
              "draft": None if draft is None else dfvg_from_hf(draft).to(args.device), "prompts": prompts}
    if args.distilled_draft and not args.tiny:
        from dfvg.checkpoint import load_model

        models["distilled"] = load_model(args.distilled_draft, torch.bfloat16, args.device).eval()
    for folder in filter(None, args.extra_drafts.split(",")):
        from dfvg.checkpoint import load_model

        models[f"extra:{Path(folder).name}"] = load_model(folder, torch.bfloat16, args.device).eval()
    heads = [("feature_head", args.feature_head)] if args.feature_head else []
    heads += [(f"extra-head:{Path(f).name}", f) for f in filter(None, args.extra_heads.split(","))]
    for key, folder in heads:
        from dfvg.feature_head import load_feature_head

        target_cfg = models["target"].config
        models[key] = load_feature_head(folder, models["target"].norm.weight.dtype, args.device, target_cfg.hidden_size)
    return models


def weight_bytes(model: Transformer) -> int:
    """Bytes a decode step must read: every weight once; an untied embedding table only by one row."""
    seen, total = set(), 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if name == "tok_embeddings.weight" and not model.config.tie_word_embeddings:
            continue
        total += p.numel() * p.element_size()
    return total


def timed_runs(name: str, prompts: list[dict], run_one, device: str, warm: bool = True) -> dict:
    """Warm up on prompt 0, then time each prompt; run_one(ids) -> (tokens, stats dict or None)."""
    if warm:
        run_one(prompts[0]["ids"])
    walls, tokens, stats = [], [], []
    for prompt in prompts:
        sync(device)
        start = time.perf_counter()
        out, st = run_one(prompt["ids"])
        sync(device)
        walls.append(time.perf_counter() - start)
        tokens.append(out)
        stats.append(st)
    n = sum(len(t) for t in tokens)
    ms_tok = [1000 * w / max(1, len(t)) for w, t in zip(walls, tokens, strict=True)]
    print(f"  {name:<28} {n / sum(walls):9.1f} tok/s  median {statistics.median(ms_tok):7.3f} ms/token",
          flush=True)
    return {"name": name, "walls_s": walls, "tokens": tokens, "stats": stats, "new_tokens": n,
            "tokens_per_s": n / sum(walls), "median_ms_per_token": statistics.median(ms_tok),
            "provenance": "measured"}


def cuda_median_ms(fn, reps: int = 50) -> float:
    """Median CUDA-event time of fn() (a graph replay, say), each call timed on its own."""
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def save(args, phase: str, payload: dict) -> None:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload)
    (results / f"{phase}.json").write_text(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{phase}.json").write_text(text)


def run_phase(args, phase: str, models: dict | None) -> dict:
    """One phase's payload; a failing phase is recorded with its first error line, and the others still run."""
    from benchmarks import gpu_phases

    try:
        if phase == "llama_cpp":
            return llama_cpp_peer.phase_llama_cpp(args, load_prompts(args), lambda part: save(args, phase, part))
        return getattr(gpu_phases, f"phase_{phase}")(args, models)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        return {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                "failed_detail": str(exc)[-4000:]}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.write_prompts:
        write_prompts(args.write_prompts)
        return 0
    if args.tuned:
        from dfvg.gpu import block_sizes

        try:
            block_sizes.apply_tuned(block_sizes.read_tuned(args.tuned))
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"fused block sizes from {args.tuned}: {len(block_sizes.TUNED)} shapes", flush=True)
    phases = args.phases.split(",")
    if args.fpga_head and "fpga" not in phases:
        print("error: --fpga-head drafts in the fpga phase; add fpga to --phases", file=sys.stderr)
        return 2
    if "llama_cpp" in phases and (why := llama_cpp_peer.refusal(args)):
        print(why, file=sys.stderr)
        return 2
    if "hf_assist" in phases and (args.tiny or Path(args.prompts_file).is_file()):
        from benchmarks.gpu_phases import assist_split

        assist_split(args, len(load_prompts(args)))  # before any model loads: a bad split is one line now
    models = None
    for phase in phases:
        if phase == "report":
            continue
        if models is None and phase != "llama_cpp":  # the llama.cpp peer needs only the prompts
            models = load_models(args)
        start = time.perf_counter()
        print(f"== phase {phase}", flush=True)
        payload = run_phase(args, phase, models)
        payload.update(env=env_info(args.device), phase_s=time.perf_counter() - start,
                       command=" ".join(sys.argv), fused_tuned=tuned_rows())
        if models is not None:
            payload["weight_bytes"] = {name: weight_bytes(models[name]) for name in ("target", "draft", "distilled")
                                       if models.get(name) is not None}
        save(args, phase, payload)
    if "report" in phases:
        merged = report(Path(args.results))
        if args.out:
            (Path(args.out) / "gpu_speed.json").write_text(json.dumps(merged, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
