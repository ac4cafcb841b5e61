"""The `dfvg` command line (also `python -m dfvg`).

`dfvg generate` loads a target and (optionally) a draft checkpoint and prints the generated text on stdout
and one line of statistics on stderr (so `> file` keeps only the text), or one JSON object with `--json`.
A `--prompt` goes through the target's chat template when it has one (`--raw-prompt`: plain text).
`dfvg run --config FILE` runs an experiment config (the host runtime). A user mistake (`UserError`) is
printed as one line on stderr with exit status 2, never as a traceback. Under torchrun
(`torchrun --nproc-per-node N -m dfvg generate --tensor-parallel N ...`, or `tensor_parallel: N` in a run
config) every rank runs the same command and rank 0 alone prints (`dfvg.parallel`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from dfvg.errors import OneLineParser, UserError, report_interrupt
from dfvg.parallel import group

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
    gen.add_argument("--raw-prompt", action="store_true",
                     help="encode --prompt as plain text, not as the user message of the target's chat template")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--draft-length", type=int, default=4, help="k: draft tokens per verify step")
    gen.add_argument("--tree", help="token-tree speculation: branching per depth (e.g. 2,2,1) or dynamic:N (a "
                                    "budget of N nodes, --draft-length deep); a greedy tree on CUDA graphs is one "
                                    "captured device step, others run eagerly")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: float32 on cpu, bfloat16 on cuda")
    gen.add_argument("--device", default="cpu", help="where the target verifies: cpu, cuda or cuda:N")
    gen.add_argument("--draft-device", help=DRAFT_DEVICE_HELP + " (default: --device)")
    gen.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                     help="split the target over N ranks started by torchrun --nproc-per-node N (NCCL, one GPU "
                          "each, with --device cuda; gloo with --device cpu); the draft runs on rank 0")
    gen.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding of the target")
    gen.add_argument("--json", action="store_true", help="print one JSON object (default: text, then a stats line)")
    gen.add_argument("--eager", action="store_true",
                     help="CUDA: run the eager torch step instead of CUDA graphs + fused layers (for debugging)")
    add_fpga_options(gen)
    add_fault_options(gen)


def add_fault_options(gen) -> None:
    """What happens when the draft device fails (`dfvg.fallback.FaultPolicy`; YAML: a device config's `faults`)."""
    faults = gen.add_argument_group("draft device faults (the output never changes; see dfvg/fallback.py)")
    faults.add_argument("--draft-fallback", default="",
                        help="comma-separated draft devices that take over, in order, when the draft device fails "
                             "(same draft model; default: none, the target decodes alone)")
    faults.add_argument("--draft-deadline", default="auto",
                        help="watchdog per draft call: auto (20x the slowest recent block, >= 1 s), off, or seconds")
    faults.add_argument("--draft-retry-after", type=float, default=None,
                        help="seconds before a failed draft device is tried again (doubling); default: never")


def fault_policy(args: argparse.Namespace):
    """The FaultPolicy of the --draft-* flags."""
    from dfvg.fallback import FaultPolicy, parse_deadline

    fallback = tuple(d.strip() for d in args.draft_fallback.split(",") if d.strip())
    return FaultPolicy(fallback=fallback, deadline=parse_deadline(args.draft_deadline),
                       retry_after_s=args.draft_retry_after)


def add_fpga_options(gen) -> None:
    """Options of --draft-device fpga (the fields of `FpgaOptions`); checked by FpgaDrafter in one line each."""
    from dfvg.fpga.datapath.drafter import FpgaOptions

    default = FpgaOptions()
    fpga = gen.add_argument_group("FPGA drafter (--draft-device fpga)")
    fpga.add_argument("--fpga-bits", type=int, default=default.bits, help="weight bits of the decoder layers: 8 or 4")
    fpga.add_argument("--fpga-group-size", type=int, default=default.group_size,
                      help="int4 group size (columns per scale)")
    fpga.add_argument("--fpga-board", default=default.board, help="board of the latency model: u280, u55c, u250, v80")
    fpga.add_argument("--fpga-mode", default=default.mode, help="emulate (bit-exact datapath here) or xrt (a board)")
    fpga.add_argument("--fpga-emulate-device", default=default.emulate_device,
                      help="where the emulation runs: cpu, cuda, cuda:N")
    fpga.add_argument("--xclbin", default=default.xclbin, help="dfvg_draft bitstream for --fpga-mode xrt")


def fpga_options(args: argparse.Namespace) -> dict:
    """The FpgaDrafter keyword arguments of the --fpga-* flags (the fields of `FpgaOptions`)."""
    from dfvg.fpga.datapath.drafter import FpgaOptions

    chosen = FpgaOptions(board=args.fpga_board, mode=args.fpga_mode, xclbin=args.xclbin, bits=args.fpga_bits,
                         emulate_device=args.fpga_emulate_device, group_size=args.fpga_group_size)
    return dataclasses.asdict(chosen)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dfvg", description="Draft-on-FPGA, Verify-on-GPU speculative decoding")
    commands = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(commands)
    run = commands.add_parser("run", help="run an experiment config (same as scripts/run_experiments.py)")
    run.add_argument("--config", required=True, help="experiment YAML, e.g. configs/default.yaml")
    run.add_argument("--output", help="results root (default: output_dir from the config, else results/)")
    return parser


def run_generate(args: argparse.Namespace) -> dict:
    """Load the models, warm up, generate, and return the --json payload."""
    from dfvg.checkpoint import resolve_dtype
    from dfvg.devices import resolve_device
    from dfvg.sampling import SamplingParams
    from dfvg.tokenizer import decode, encode_prompt, eos_token_ids, load_tokenizer
    from dfvg.tree import parse_tree_spec

    if not args.no_draft and not args.draft:
        raise UserError("--draft DIR is required (or pass --no-draft for plain decoding)")
    if args.draft_length < 1 and not args.no_draft:
        raise UserError(f"--draft-length must be >= 1, got {args.draft_length}")
    tree = parse_tree_spec(args.tree) if args.tree is not None else None
    if tree is not None and args.no_draft:
        raise UserError("--tree needs a draft (--draft DIR), not --no-draft")
    if tree is not None and args.tensor_parallel > 1:
        raise UserError("--tree with --tensor-parallel is not supported yet; drop one of them")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
    tensor_parallel = group.start(args.tensor_parallel, args.device, args.target)
    device = tensor_parallel.device if tensor_parallel else resolve_device(args.device)
    dtype = resolve_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    tokenizer = load_tokenizer(args.target)
    chat = False
    if args.prompt is not None:  # before loading weights: a broken chat template fails in a second, not minutes
        prompt_ids, chat = encode_prompt(tokenizer, args.target, args.prompt, chat=not args.raw_prompt)
    engine, drafter = load_engine(args, device, dtype, tokenizer, tensor_parallel)
    if args.prompt is None:
        prompt_ids = parse_prompt_ids(args.prompt_ids, engine.verifier.vocab_size)
    k = 0 if drafter is None else args.draft_length
    warmup_s = engine.warm_up([drafter], prompt_ids, [k], args.max_new_tokens, tree=tree) if engine.captures \
        else 0.0
    result = engine.decode(drafter, prompt_ids, args.max_new_tokens, k=k, eos_ids=eos_token_ids(args.target),
                           sampling=sampling, seed=args.seed, tree=tree)
    result.warmup_s = warmup_s
    return {"tokens": result.tokens, "text": decode(tokenizer, result.tokens), "prompt_tokens": prompt_ids,
            "chat_template": chat, "stats": result.stats()}


def stats_line(stats: dict) -> str:
    """The one human-readable line printed after the text (the full set is in --json's `stats`)."""
    acceptance = f"{stats['acceptance_rate']:.3f}" if stats["num_draft_tokens"] else "n/a (no draft)"
    faults = stats["draft_faults"]
    return (f"[dfvg] {stats['num_new_tokens']} new tokens | {stats['tokens_per_second']:.2f} tok/s | "
            f"acceptance rate {acceptance} | mean accepted length {stats['mean_accepted_length']:.2f} "
            f"(bonus counted) | {stats['num_verify_steps']} verify steps"
            + (f" | warm-up {stats['warmup_s']:.1f} s (graph capture, not in tok/s)" if stats["warmup_s"] else "")
            + (f" | {faults} draft fault(s) survived, {stats['tokens_without_draft']} tokens without the draft"
               if faults else ""))


def print_generation(payload: dict, as_json: bool) -> None:
    """--json: one JSON object on stdout. Otherwise the text on stdout, then the stats line on stderr."""
    if as_json:
        print(json.dumps(payload))
        return
    print(payload["text"], flush=True)  # flushed first, so a terminal shows the text before the stats
    print(stats_line(payload["stats"]), file=sys.stderr, flush=True)


def load_engine(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, tokenizer,
                tensor_parallel: group.TensorParallel | None = None):
    """The engine on the target (this rank's shard under tensor parallelism) and the drafter (None with
    --no-draft); CUDA graphs unless --eager."""
    from dfvg.engine import Engine, load_verifier, make_drafter
    from dfvg.tokenizer import check_compatible, load_tokenizer

    fast = not args.eager
    policy = fault_policy(args)
    verifier = load_verifier(args.target, device, dtype, fast, tensor_parallel)
    if args.no_draft:
        return Engine(verifier, policy), None
    check_compatible(tokenizer, load_tokenizer(args.draft), args.draft)

    def drafter_on(draft_device: str):
        options = fpga_options(args) if draft_device == "fpga" else {}
        return make_drafter(args.draft, draft_device, dtype, verifier.vocab_size, fast, verifier, **options)

    drafter = drafter_on(args.draft_device or args.device)
    return Engine(verifier, policy, [drafter_on(d) for d in policy.fallback]), drafter


def run_config(args: argparse.Namespace) -> None:
    from dfvg.host.experiments import run_experiments

    run_experiments(args.config, output=args.output)


def main(argv: list[str] | None = None) -> int:
    """Run one command; under torchrun every rank runs it and rank 0 alone prints (the others exit alike),
    and each rank then ends at once (`group.leave_process`)."""
    code = run_command(build_parser().parse_args(argv))
    group.leave_process(code)
    return code


def run_command(args: argparse.Namespace) -> int:
    """The command's exit status: 0, 2 after a one-line error, 130 when interrupted."""
    completed = False
    try:
        with torch.inference_mode():
            if args.command == "generate":
                payload = run_generate(args)
                if group.leads():
                    print_generation(payload, args.json)
            else:
                run_config(args)
        completed = True
    except UserError as err:
        if group.leads():
            print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return report_interrupt(resumable=args.command == "run") if group.leads() else 130
    finally:
        group.stop(completed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
