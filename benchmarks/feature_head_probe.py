"""Where a feature head's request spends its time beyond draft and verify: per prompt, the target's prefill
and the head's prefill (the host step's timeline), the graphs captured while prompts run (none should be),
then a torch profile of one request (top operators by device and by host time). Same models and pair as
`gpu_speed.py --phases dfvg --feature-head` (`gpu_phases.feature_pair`), same arguments:

    python3 benchmarks/feature_head_probe.py --gguf-dir /root/gguf --work-dir /root/w --skip-draft \\
        --feature-head /root/head --prompts-file .chunks/prompts.json --prompts 6 --out /root/out

Why: on the H200 (2026-12-05) the head's chain decodes at 934 tok/s, as fast as the standalone draft, but
its requests spend 80-88 ms in prefill against plain's 8 ms, which takes it to 1.02x plain end to end.
Every figure here is measured; on a CPU (--tiny --device cpu) it runs as a smoke test of itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_phases import feature_pair  # noqa: E402
from benchmarks.gpu_speed import load_models, parse_args  # noqa: E402
from dfvg.engine import Engine  # noqa: E402
from dfvg.errors import UserError  # noqa: E402
from dfvg.gpu.graphs import GraphModel  # noqa: E402
from dfvg.host.timeline import Timeline  # noqa: E402


def counting_captures() -> list:
    """Record the key of every graph captured from now on (GraphModel.capture wrapped)."""
    captured, capture = [], GraphModel.capture

    def counted(self, key, *args, **kwargs):
        captured.append(str(key))
        return capture(self, key, *args, **kwargs)

    GraphModel.capture = counted
    return captured


def prefill_parts(timeline: Timeline) -> dict:
    """ms of the target's and the head's prefill events of one request."""
    parts = {}
    for event in timeline.events:
        if event.stage == "prefill":
            parts["target_ms" if not parts else "head_ms"] = 1e3 * event.duration
    return parts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.feature_head:
        print("error: give --feature-head DIR (the head to probe)", file=sys.stderr)
        return 2
    try:
        models = load_models(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    prompts = models["prompts"]
    verifier, head = feature_pair(args, models, prompts[0]["ids"])
    engine = Engine(verifier)
    captured = counting_captures()
    rows = []
    for prompt in prompts:
        timeline = Timeline()
        result = engine.decode(head, prompt["ids"], args.max_new_tokens, k=4, timeline=timeline)
        rows.append({"prompt_tokens": len(prompt["ids"]), "prefill_s": result.prefill_s, **prefill_parts(timeline),
                     "captures_so_far": len(captured)})
        print(json.dumps(rows[-1]), flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        engine.decode(head, prompts[-1]["ids"], args.max_new_tokens, k=4)
    sort = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    table = profile.key_averages().table(sort_by=sort, row_limit=25)
    host = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(table, host, sep="\n")
    out = {"rows": rows, "captured_while_timed": captured, "provenance": "measured",
           "profile_by_device": table, "profile_by_host": host, "command": " ".join(sys.argv)}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "feature_head_probe.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
