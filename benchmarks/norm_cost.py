"""What RMSNorm's prologue costs the GEMV launches that carry it: each such launch alone, with its norm and without.

    python benchmarks/norm_cost.py --out $OUT                      # the shipped block sizes
    python benchmarks/norm_cost.py --tuned tuned.json --out $OUT   # a sweep's (gpu_rows.py --sweep)

Why: the gate/up and LM head launches start every program with a pass over its rows of x (1/RMS), and with the
swapped MMA (`block_sizes` SWAP_AB) each K step scales x by 1/RMS and g in registers and stores it to shared
memory for the wgmma behind a barrier, where a launch without the norm copies x straight to shared memory
(Nsight Compute's top stall on the swapped gate/up launch was the barrier). The same launch without its norm
is the most that normalizing x once, elsewhere, could save. Timed as `gpu_rows.py --sweep` times a launch (28
in one CUDA graph, rotating weight copies so that L2 never holds the matrix; median of CUDA events).
Random bf16 weights of the Qwen2.5-Coder-1.5B target's shapes. Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_decode import SHAPES  # noqa: E402
from benchmarks.gpu_rows import launch_of, shapes, time_launch  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.gpu import block_sizes  # noqa: E402

NORM_LAUNCHES = ("w13", "lm_head")  # the fused_linear launches with RMSNorm (QKV + RoPE always has it)
ROWS = (1, 5, 16)


def norm_costs(rows: tuple[int, ...] = ROWS) -> list[dict]:
    """µs per launch with and without its RMSNorm prologue, per launch and row count, at the table in use."""
    cfg = SHAPES["qwen2.5-coder-1.5b"]
    out = []
    for name in NORM_LAUNCHES:
        n, k, opts = shapes(cfg)[name]
        rows_n = 2 * n if opts.get("swiglu") else n
        copies = max(2, min(28, -(-240_000_000 // (rows_n * k * 2))))
        weights = [torch.randn(rows_n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        config = block_sizes.linear_config(n, k)
        for t in rows:
            with_norm = time_launch(launch_of(cfg, name, n, k, opts, t), weights, config)
            without = time_launch(launch_of(cfg, name, n, k, {**opts, "norm": False}, t), weights, config)
            if with_norm is None or without is None:  # time_launch printed why Triton could not build it
                sys.exit(f"error: the {name} launch does not build with {config} on this GPU (the line above says "
                         "why): time a table whose rows build, --tuned tuned.json of a gpu_rows.py sweep")
            out.append({"launch": name, "config": config, "T": t, "us_with_norm": with_norm,
                        "us_without_norm": without, "norm_share": 1 - without / with_norm})
            print(f"  {name:8s} T={t:2d}: {with_norm:6.1f} us with RMSNorm, {without:6.1f} without "
                  f"({out[-1]['norm_share']:.1%} of the launch)  {config}", flush=True)
        del weights
    return out


def main(argv: list[str] | None = None) -> None:
    """Time the norm launches with and without their RMSNorm at this GPU's table (or --tuned's); norm_cost.json."""
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--tuned", help="tuned.json of a sweep (gpu_rows.py --sweep) to time instead of the shipped table")
    args = p.parse_args(argv)
    try:
        tuned = block_sizes.read_tuned(args.tuned) if args.tuned else None
    except UserError as exc:
        p.error(str(exc))
    if not torch.cuda.is_available():
        sys.exit("norm_cost.py needs a CUDA GPU (this machine has none)")
    block_sizes.adopt_gpu_table(torch.cuda.get_device_name())  # the product's table on this GPU
    if tuned:
        block_sizes.apply_tuned(tuned)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": "random (timing only)",
              "provenance": "measured", "table": block_sizes.tuned_rows(), "launches": norm_costs()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "norm_cost.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
