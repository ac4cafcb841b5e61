"""A feature head's prompt pass on this CPU: outputs of the last row only (what `FeatureDrafter._feed` computes
since 2026-12-05) against outputs of every row (what it computed before), side by side in one run.

    python benchmarks/head_prefill_cpu.py --head models/fh-l4-d512-2026-12-05 \\
        --output benchmarks/cpu_2026-12-05/head_prefill.json

Why: every row's full-vocabulary logits are a [T, 151,936] float32 tensor nobody reads. The figures are CPU
wall times (median of --repeats, fp32, 2 threads), measured here; they say nothing of a GPU's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfvg.checkpoint import load_model  # noqa: E402
from dfvg.errors import UserError  # noqa: E402
from dfvg.feature_head import load_feature_head  # noqa: E402
from dfvg.verifier import TorchVerifier  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(ROOT / "models/qwen2.5-coder-1.5b-instruct"))
    p.add_argument("--head", required=True)
    p.add_argument("--prompt-tokens", type=int, default=150)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    try:
        verifier = TorchVerifier(load_model(args.target))
        head = load_feature_head(args.head, target_hidden_size=verifier.model.config.hidden_size)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    verifier.keep_features = True
    prompt = list(range(1000, 1000 + args.prompt_tokens))
    fed = len(prompt) - 1
    ids, positions = torch.tensor([prompt[:-1]]), torch.arange(fed)[None]
    with torch.inference_mode():
        verifier.prefill(prompt, fed + 64)
        features = torch.cat([verifier.features[:1] * 0, verifier.features[: fed - 1]])[None]
        head.body.setup_cache(1, fed + 64)
        variants = {"every_row": lambda: head(ids, positions, features),
                    "last_row": lambda: head(ids, positions, features, rows=torch.tensor([fed - 1]))}
        times = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, run in variants.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    out = {name: {"median_ms": 1e3 * statistics.median(t), "all_ms": [1e3 * x for x in t]} for name, t in times.items()}
    out.update(command=" ".join(sys.argv), prompt_rows=fed, provenance="measured on this machine's CPU, fp32")
    for name in variants:
        print(f"{name:10} {out[name]['median_ms']:8.1f} ms (median of {args.repeats})")
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
