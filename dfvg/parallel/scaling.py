"""The modeled step time of a tensor-parallel target (7B, 70B) from the bandwidth floor and an all-reduce cost.

A decode step (or a k+1-token verify step) of a bandwidth-bound target streams every weight once. Split over
N GPUs each streams 1/N of them, and every layer adds its two all-reduces of the step's activations:

    step(N) = weight_bytes / (N * bandwidth) + 2 * layers * allreduce(N)        speedup(N) = step(1) / step(N)

- weight_bytes: the layers and the LM head in bf16 (the embedding is a one-row lookup), from the shapes;
- bandwidth: 4.3 TB/s, the H200 copy rate measured here, the same figure as the README's bandwidth floor;
- allreduce(N): one all-reduce of a [T, hidden] bf16 tensor among N GPUs. It is an INPUT: measure it with
  `torchrun --nproc-per-node N benchmarks/tensor_parallel.py` on a multi-GPU machine; until then a figure
  passed here is an assumption and its rows say so (provenance `assumed` for it, `modeled` for the rest).
The model leaves out launch overheads (it assumes CUDA graphs), KV-cache reads and the LM head's gather, so
it is a floor: a measured step can only be slower. `allreduce_budget` inverts it: the largest all-reduce that
still meets a target ratio step(N) / step(1), e.g. the issue's goal of 0.6 at N = 2.
"""

from __future__ import annotations

from dfvg.fpga.board.latency import DraftWorkload
from dfvg.model import ModelConfig
from dfvg.stats import Metric

H200_COPY_B_S = 4.3e12  # measured device-to-device copy rate of an H200 (benchmarks/gpu_report.py)
H200_MEMORY_B = 141e9  # HBM3e capacity
BF16_BITS = 16

TARGETS = {  # config.json shapes of public checkpoints (random weights wherever a benchmark needs weights)
    "llama-2-7b": ModelConfig(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                              num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128),
    "llama-3-70b": ModelConfig(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                               num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128),
}


def weight_bytes(cfg: ModelConfig) -> int:
    """bf16 bytes one step streams: every layer and the LM head (the same count as the FPGA board model's)."""
    return DraftWorkload.from_model_config(cfg, weight_bits=BF16_BITS).streamed_weight_bytes()


def step_seconds(cfg: ModelConfig, size: int, allreduce_s: float, bandwidth_b_s: float = H200_COPY_B_S) -> float:
    """step(N): the weights' share of one GPU at the bandwidth floor, plus 2 all-reduces per layer (N > 1)."""
    collectives = 2 * cfg.num_layers * allreduce_s if size > 1 else 0.0
    return weight_bytes(cfg) / (size * bandwidth_b_s) + collectives


def allreduce_budget(cfg: ModelConfig, size: int, ratio: float, bandwidth_b_s: float = H200_COPY_B_S) -> float:
    """The largest all-reduce (s) with step(N) <= ratio * step(1): (ratio - 1/N) * step(1) / (2 * layers).
    Example: Llama-2-7B (13.2 GB), N = 2, ratio 0.6: (0.6 - 0.5) * 3.07 ms / 64 = 4.8 us per all-reduce."""
    return max(0.0, (ratio - 1 / size) * step_seconds(cfg, 1, 0.0, bandwidth_b_s) / (2 * cfg.num_layers))


def scaling_rows(allreduce_s: dict[int, float], provenance: str, source: str,
                 targets: dict[str, ModelConfig] = TARGETS) -> list[dict]:
    """One row per target and N in `allreduce_s` (N -> seconds per all-reduce; N = 1 needs none), each number
    a Metric. `provenance` is the all-reduce figure's: `measured` from the benchmark, else `assumed`."""
    rows = []
    for name, cfg in targets.items():
        single = step_seconds(cfg, 1, 0.0)
        for size, seconds in sorted(allreduce_s.items()):
            step = step_seconds(cfg, size, seconds)
            model = f"dfvg.parallel.scaling: bf16 weights / ({size} x 4.3 TB/s) + 2 x {cfg.num_layers} all-reduces"
            rows.append({
                "target": name, "tensor_parallel": size,
                "fits": weight_bytes(cfg) / size <= 0.9 * H200_MEMORY_B,
                "allreduce_us": Metric(seconds * 1e6, "us", provenance if size > 1 else "modeled", source),
                "step_ms": Metric(step * 1e3, "ms", "modeled", model),
                "speedup": Metric(single / step, "x vs TP 1", "modeled", model),
                "allreduce_budget_us_at_0.6": Metric(allreduce_budget(cfg, size, 0.6) * 1e6, "us", "modeled", model),
            })
    return rows


def format_rows(rows: list[dict]) -> str:
    """The scaling table as text, one line per target and N."""
    lines = [f"{'target':<12} {'TP':>3} {'fits':>5} {'all-reduce us':>24} {'step ms':>8} {'speedup':>8} "
             f"{'budget us (0.6x)':>17}"]
    for r in rows:
        lines.append(f"{r['target']:<12} {r['tensor_parallel']:>3} {str(r['fits']):>5} "
                     f"{r['allreduce_us'].value:>13.1f} ({r['allreduce_us'].provenance:<8}) "
                     f"{r['step_ms'].value:>8.3f} {r['speedup'].value:>7.2f}x "
                     f"{r['allreduce_budget_us_at_0.6'].value:>17.1f}")
    return "\n".join(lines)
