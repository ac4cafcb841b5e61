"""The `dfvg` command line (also `python -m dfvg`).

`dfvg generate` loads a target and (optionally) a draft checkpoint and prints the generated text, or one
JSON object with `--json`. `dfvg run --config FILE` runs an experiment config (the host runtime). A user
mistake (`UserError`) is printed as one line on stderr with exit status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dfvg.errors import OneLineParser, UserError, report_interrupt

DRAFT_DEVICE_HELP = "where the draft runs: cpu, cuda, cuda:N or fpga (bit-exact integer emulation)"


def parse_prompt_ids(text: str, vocab_size: int) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if not ids or bad:
        raise UserError(f"--prompt-ids needs token ids in [0, {vocab_size}); bad: {bad or 'none given'}")
    return ids


def add_generate_parser(commands) -> None:
    gen = commands.add_parser("generate", help="generate text with (speculative) decoding")
    gen.add_argument("--target", required=True, help="target checkpoint directory (HF format)")
    gen.add_argument("--draft", help="draft checkpoint directory (HF format)")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-ids", help="prompt as comma-separated token ids, e.g. 1,2,3")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--draft-length", type=int, default=4, help="k: draft tokens per verify step")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: float32 on cpu, bfloat16 on cuda")
    gen.add_argument("--device", default="cpu", help="where the target verifies: cpu, cuda or cuda:N")
    gen.add_argument("--draft-device", help=DRAFT_DEVICE_HELP + " (default: --device)")
    gen.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding of the target")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--graphs", action="store_true",
                     help="CUDA only: replay CUDA graphs for decode/verify/draft (the fast path, docs/gpu.md)")
    add_fpga_options(gen)


def add_fpga_options(gen) -> None:
    """Options of --draft-device fpga; checked by FpgaDrafter (one-line errors), ignored for other devices."""
    fpga = gen.add_argument_group("FPGA drafter (--draft-device fpga)")
    fpga.add_argument("--fpga-bits", type=int, default=8, help="weight bits of the decoder layers: 8 or 4")
    fpga.add_argument("--fpga-group-size", type=int, default=128, help="int4 group size (columns per scale)")
    fpga.add_argument("--fpga-board", default="u280", help="board of the latency model: u280, u55c, u250, v80")
    fpga.add_argument("--fpga-mode", default="emulate", help="emulate (bit-exact datapath here) or xrt (a board)")
    fpga.add_argument("--fpga-emulate-device", default="cpu", help="where the emulation runs: cpu, cuda, cuda:N")
    fpga.add_argument("--xclbin", help="dfvg_draft bitstream for --fpga-mode xrt")


def fpga_options(args: argparse.Namespace) -> dict:
    return {"bits": args.fpga_bits, "group_size": args.fpga_group_size, "board": args.fpga_board,
            "mode": args.fpga_mode, "emulate_device": args.fpga_emulate_device, "xclbin": args.xclbin}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dfvg", description="Draft-on-FPGA, Verify-on-GPU speculative decoding")
    commands = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(commands)
    run = commands.add_parser("run", help="run an experiment config (same as scripts/run_experiments.py)")
    run.add_argument("--config", required=True, help="experiment YAML, e.g. configs/default.yaml")
    run.add_argument("--output", help="results root (default: output_dir from the config, else results/)")
    return parser


def run_generate(args: argparse.Namespace) -> dict:
    """Load the models, generate, and return the --json payload."""
    from dfvg.checkpoint import resolve_dtype
    from dfvg.devices import resolve_device
    from dfvg.generate import generate
    from dfvg.sampling import SamplingParams
    from dfvg.tokenizer import decode, encode, eos_token_ids, load_tokenizer

    if not args.no_draft and not args.draft:
        raise UserError("--draft DIR is required (or pass --no-draft for plain decoding)")
    if args.draft_length < 1 and not args.no_draft:
        raise UserError(f"--draft-length must be >= 1, got {args.draft_length}")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
    device = resolve_device(args.device)
    if args.graphs and device.type != "cuda":
        raise UserError("--graphs needs --device cuda (CUDA graphs do not exist on the CPU)")
    dtype = resolve_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    tokenizer = load_tokenizer(args.target)
    target, drafter = load_engine(args, device, dtype, tokenizer)
    if args.prompt is not None:
        prompt_ids = encode(tokenizer, args.prompt)
    else:
        prompt_ids = parse_prompt_ids(args.prompt_ids, target.vocab_size)
    eos = eos_token_ids(args.target)
    if args.graphs and sampling.greedy and uses_graph_drafter(drafter):
        from dfvg.gpu.fast import FastGreedy

        result = FastGreedy(target, drafter, args.draft_length).generate(prompt_ids, args.max_new_tokens, eos)
    else:
        result = generate(target, prompt_ids, args.max_new_tokens, eos_ids=eos, sampling=sampling,
                          seed=args.seed, drafter=drafter, draft_length=args.draft_length)
    return {"tokens": result.tokens, "text": decode(tokenizer, result.tokens), "prompt_tokens": prompt_ids,
            "stats": result.stats()}


def uses_graph_drafter(drafter) -> bool:
    """Whether the whole greedy step can run as one captured graph (no drafter, or a graph drafter)."""
    from dfvg.gpu.graphs import GraphDrafter

    return drafter is None or isinstance(drafter, GraphDrafter)


def load_engine(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, tokenizer):
    """The target's verifier and the drafter (None with --no-draft); CUDA-graph versions with --graphs."""
    from dfvg.checkpoint import load_model
    from dfvg.devices import resolve_device
    from dfvg.drafter import make_drafter
    from dfvg.tokenizer import check_compatible, load_tokenizer
    from dfvg.verifier import TorchVerifier

    model = load_model(args.target, dtype=dtype, device=device)
    if args.graphs:
        from dfvg.gpu.graphs import GraphDrafter, GraphVerifier

        target = GraphVerifier(model)
    else:
        target = TorchVerifier(model)
    if args.no_draft:
        return target, None
    check_compatible(tokenizer, load_tokenizer(args.draft), args.draft)
    draft_device = args.draft_device or args.device
    if args.graphs and draft_device.startswith("cuda"):
        draft_model = load_model(args.draft, dtype=dtype, device=resolve_device(draft_device))
        return target, GraphDrafter(draft_model, target.vocab_size)
    options = fpga_options(args) if draft_device == "fpga" else {}
    return target, make_drafter(args.draft, draft_device, dtype, target.vocab_size, **options)


def run_config(args: argparse.Namespace) -> None:
    from dfvg.host.experiments import run_experiments

    run_experiments(args.config, output=args.output)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with torch.inference_mode():
            if args.command == "generate":
                payload = run_generate(args)
                print(json.dumps(payload) if args.json else payload["text"])
            else:
                run_config(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return report_interrupt(resumable=args.command == "run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
