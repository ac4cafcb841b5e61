"""A feature head with the real target on this machine: the graph drafter against the eager one, beside a draft.

    python benchmarks/feature_head_check.py --head models/fh-l4-d512-2026-12-05 \
        --output benchmarks/cpu_2026-12-05/feature_head_check.json

On a CPU the graph drafter (`GraphFeatureDrafter`) replays its block graphs eagerly, and so does the fused
device step it drafts in on CUDA (`head_device_step`, through `Engine.decode` on a `GraphVerifier`), so this
checks their arithmetic on real weights, not their speed; `head_tree_*` is the head's token tree (eager tree
step; fp32 here, so lossless). Per held-out prompt (the first `--prompts` of
data/humaneval-heldout.jsonl, never trained on), greedy, fp32, the mean accepted length (bonus counted) of
the eager head, the graph head and a standalone draft, and whether each output equals plain decoding. Every
figure is measured on this machine; wall times are CPU times, not the product's GPU speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfvg.checkpoint import load_model  # noqa: E402
from dfvg.engine import Engine, make_drafter  # noqa: E402
from dfvg.feature_head import FeatureDrafter, load_feature_head  # noqa: E402
from dfvg.generate import generate  # noqa: E402
from dfvg.gpu.graph_head import GraphFeatureDrafter  # noqa: E402
from dfvg.gpu.graphs import GraphVerifier  # noqa: E402
from dfvg.tokenizer import load_tokenizer  # noqa: E402
from dfvg.tree import parse_tree_spec  # noqa: E402
from dfvg.verifier import TorchVerifier  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="models/qwen2.5-coder-1.5b-instruct")
    p.add_argument("--head", required=True, help="a feature head's folder (distill_draft.py --feature-head)")
    p.add_argument("--draft", default="drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768",
                   help="a standalone draft to compare with")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tree", default="dynamic:16", help="a tree shape for the head's tree row ('' for none)")
    p.add_argument("--output", required=True)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.target)
    lines = (ROOT / "data/humaneval-heldout.jsonl").read_text().splitlines()[: args.prompts]
    prompts = [json.loads(line) for line in lines]
    verifier = TorchVerifier(load_model(args.target))
    head = load_feature_head(args.head, torch.float32, "cpu", verifier.model.config.hidden_size)
    drafters = {"plain": None,
                "head_eager": FeatureDrafter(head, verifier, verifier.vocab_size),
                "head_graph": GraphFeatureDrafter(head, verifier, verifier.vocab_size, compile_blocks=False,
                                                  cache_len=512),
                "draft": make_drafter(args.draft, "cpu", torch.float32, verifier.vocab_size, fast=False)}
    n, k = args.max_new_tokens, args.k
    runs = {name: (lambda ids, d=d: generate(verifier, ids, n, drafter=d, draft_length=k))
            for name, d in drafters.items()}
    # the product's CUDA path on this CPU: the head inside the fused device step (its bodies replay eagerly)
    graph_verifier = GraphVerifier(verifier.model, compile_blocks=False, fused_layers=False, cache_len=512)
    device_head = GraphFeatureDrafter(load_feature_head(args.head, torch.float32, "cpu"), graph_verifier,
                                      verifier.vocab_size, compile_blocks=False, cache_len=512, fused_layers=False)
    runs["head_device_step"] = lambda ids: Engine(graph_verifier).decode(device_head, ids, n, k=k)
    if args.tree:
        tree = parse_tree_spec(args.tree)
        runs[f"head_tree_{args.tree}"] = lambda ids: Engine(verifier).decode(drafters["head_eager"], ids, n, k=k,
                                                                           tree=tree)
    rows = []
    for prompt in prompts:
        ids, plain = tokenizer.encode(prompt["prompt"]).ids, None
        for name, run in runs.items():
            start = time.perf_counter()
            result = run(list(ids))
            plain = result.tokens if name == "plain" else plain
            steps = result.steps
            tau = None if name == "plain" else sum(s.num_accepted + 1 for s in steps) / len(steps)
            rows.append({"prompt": prompt["id"], "drafter": name, "tau": tau, "equal_plain": result.tokens == plain,
                         "cpu_wall_s": time.perf_counter() - start})
            print(f"{prompt['id']:<14} {name:<16} tau {tau if tau is None else round(tau, 2)!s:<5} "
                  f"equal plain {result.tokens == plain}", flush=True)
    out = {"command": " ".join(sys.argv), "k": args.k, "max_new_tokens": args.max_new_tokens, "rows": rows,
           "provenance": "measured on this machine's CPU, fp32 (the graph drafter's graphs and the device step "
                         "replay eagerly here)", "tree": args.tree}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
