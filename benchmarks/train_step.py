"""A feature head's training step as `distill_h200.sh` runs it (`dfvg.distill.feature.feature_loss`: 32 sequences,
unroll 2, the target's features kept after the first epoch), with the loss on the head's own 32k rows of the loss
positions (`Transformer.head_logits`, shipped 2026-12-06) against full-vocabulary logits of every position
(`FeatureHead.forward`, as before), in one run:

    python benchmarks/train_step.py --out $OUT            # on the GPU; writes train_step.json

Why: on the 2026-12-06 H100 lease a step took 0.104 s once the features were kept, and two training runs side by
side ran out of memory (one held 43.6 GB; the next asked for 6.94 GiB, the logits of 32 x 383 positions over
151,936 ids in float32, before their softmax and gradient), where the loss reads 32 x 128 positions over the head's
32,768 rows.
Random weights of the shipped head's shapes (4 x 512, 32k head, tied rows) and a 2-layer target of the 1.5B
target's width (its features are kept after the warm-up step, so its depth does not enter the timing). Rounds
alternate the two, in turns of which goes first; medians of steps (forward, backward, AdamW), and each one's peak
allocated memory (both keep their own features of the batches). Both losses must agree on the first batch
(relative 1e-4), or the run stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_decode import SHAPES, random_model  # noqa: E402
from dfvg.devices import tf32_matmuls  # noqa: E402
from dfvg.distill.feature import TargetFeatures, feature_loss, shifted  # noqa: E402
from dfvg.distill.train import distill_loss  # noqa: E402
from dfvg.distill.vocab import head_rows  # noqa: E402
from dfvg.feature_head import FeatureHead  # noqa: E402
from dfvg.model import ModelConfig, Transformer  # noqa: E402

BATCH, PROMPT, CONTINUATION, TOP_K, UNROLL = 32, (64, 257), 128, 32, 2  # distill_h200.sh: --max-prompt-tokens 256


def shipped_head() -> FeatureHead:
    """The shipped head's shapes (drafts/...-fh/config.json), random float32 weights, as training holds them."""
    body = Transformer(ModelConfig("qwen2", vocab_size=151936, hidden_size=512, intermediate_size=1536, num_layers=4,
                                   num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=1e6, attention_bias=True,
                                   tie_word_embeddings=True, head_vocab_size=32768, embed_rows=True))
    generator = torch.Generator().manual_seed(0)
    body.head_token_ids.copy_(torch.randperm(151936, generator=generator)[:32768].sort().values)
    body.token_rows.copy_(torch.randint(0, 32768, (151936,), generator=generator))
    return FeatureHead(body, SHAPES["qwen2.5-coder-1.5b"].hidden_size).cuda()


def one_batch(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """ids, positions, mask, top-k ids and probabilities of 32 sequences (`train.make_batch`'s layout)."""
    lengths = torch.randint(*PROMPT, (BATCH,), generator=generator) + CONTINUATION - 1
    width = int(lengths.max())
    ids = torch.randint(0, 151936, (BATCH, width), generator=generator)
    mask = torch.zeros(BATCH, width, dtype=torch.bool)
    for row, length in enumerate(lengths.tolist()):
        mask[row, length - CONTINUATION: length] = True
    probs = torch.softmax(torch.randn(int(mask.sum()), TOP_K, generator=generator) * 3, -1).sort(-1, True).values
    topk = torch.randint(0, 151936, probs.shape, generator=generator)
    positions = torch.arange(width)[None].expand(BATCH, width)
    return tuple(t.cuda() for t in (ids, positions, mask, topk, probs))


def full_vocabulary_loss(target: Transformer, rows: torch.Tensor):
    """The loss as it ran before 2026-12-06: `FeatureHead.forward`'s full-vocabulary logits of every position
    (-inf outside the head), the loss positions picked afterwards."""
    features_of = TargetFeatures(target, 16 << 30)
    full_rows = torch.where(rows >= 0, torch.arange(rows.numel(), device=rows.device), -1)  # a row = its id

    def loss(head, ids, positions, mask, topk_ids, topk_probs):
        features = features_of.batch(ids, mask)
        scale = features[mask].pow(2).mean().sqrt().clamp_min(1e-6)
        inputs, total, regression = shifted(features), 0.0, 0.0
        for unrolled in range(UNROLL):
            head.body.max_batch = head.body.max_seq_len = 0
            head.body.setup_cache(*ids.shape)
            logits, predicted = head(ids, positions, inputs)
            total = total + distill_loss(logits[mask], topk_ids, topk_probs, full_rows)
            if unrolled == 0:
                regression = torch.nn.functional.smooth_l1_loss(predicted[mask] / scale, features[mask] / scale)
            inputs = shifted(predicted)
        return total / UNROLL + regression
    return loss


def step_seconds(head, loss, batch, optimizer) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    value = loss(head, *batch)
    value.backward()
    optimizer.step()
    torch.cuda.synchronize()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="timed steps of each loss per round")
    p.add_argument("--out", default="", help="folder for train_step.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("train_step.py needs a CUDA GPU (this machine has none)")
    target = random_model(dataclasses.replace(SHAPES["qwen2.5-coder-1.5b"], num_layers=2))
    head = shipped_head()
    rows = head_rows(head.body.head_token_ids, 151936, "cuda")
    losses = {"head rows (shipped)": feature_loss(target, rows, UNROLL, cache_bytes=16 << 30),
              "full vocabulary (before)": full_vocabulary_loss(target, rows)}
    batches = [one_batch(torch.Generator().manual_seed(i)) for i in range(args.steps)]
    optimizer = torch.optim.AdamW(head.parameters(), lr=0.0)  # lr 0: every round trains the same weights
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": BATCH,
              "loss_positions": BATCH * CONTINUATION, "unroll": UNROLL, "weights": "random (timing only)"}
    with tf32_matmuls(True):
        with torch.no_grad():
            result["loss_values_first_batch"] = {name: float(fn(head, *batches[0])) for name, fn in losses.items()}
        shipped_value, before_value = result["loss_values_first_batch"].values()
        if abs(shipped_value - before_value) > 1e-4 * abs(before_value):
            sys.exit(f"the two losses differ on the first batch: {result['loss_values_first_batch']}")
        for fn in losses.values():  # warm-up: the target's features of every batch kept
            for batch in batches:
                step_seconds(head, fn, batch, optimizer)
        times, peaks = {name: [] for name in losses}, {}
        for round_ in range(args.rounds):
            for name, fn in list(losses.items())[:: 1 if round_ % 2 == 0 else -1]:
                torch.cuda.reset_peak_memory_stats()
                times[name] += [step_seconds(head, fn, batch, optimizer) for batch in batches]
                peaks[name] = torch.cuda.max_memory_allocated() / 2**30
    result["rows"] = {name: {"median_step_s": statistics.median(t), "steps": len(t), "peak_gib": peaks[name]}
                      for name, t in times.items()}
    shipped, before = (result["rows"][n]["median_step_s"] for n in losses)
    result["speedup"] = before / shipped
    for name, row in result["rows"].items():
        print(f"{name:26s} {row['median_step_s'] * 1e3:8.1f} ms/step  peak {row['peak_gib']:6.1f} GiB")
    print(f"speedup {result['speedup']:.2f}x; loss values on the first batch {result['loss_values_first_batch']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "train_step.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
