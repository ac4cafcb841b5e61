"""Block sizes of the fused GEMV launches per weight shape: measured tables (Hopper's, and TUNED for other GPUs), or a
default.

Why a table and not an autotuner: a row of a verify step must be computed exactly as a one-row decode step
computes it (`dfvg.gpu.fused`, batch-invariant rows), so the block sizes and split-K of a launch may depend
on the weight's shape only, never on the row count; an autotuner keyed on T would change the summation order.
`benchmarks/gpu_rows.py --sweep` measures the candidates and writes the winners in `tuned_rows` form.
"""

from __future__ import annotations

import json
from pathlib import Path

from dfvg.errors import UserError

# Block sizes per weight shape (N, K) on GPUs without a table of their own (`GPU_TABLES`: the H100 and H200 take
# HOPPER's rows for the target). Measured best on the H200 before HOPPER: by benchmarks/gpu_rows.py --sweep for the
# Qwen2.5-Coder-1.5B target's shapes with programmatic dependent launch (2026-12-04 evening,
# benchmarks/h200_2026-12-04_pdl/rows: each launch alone, then the whole step: 1.589 against 1.667 ms at T = 1
# for the table before, both with PDL, in alternating rounds); other shapes take `linear_config`.
# Keyed by shape only: block sizes that changed with the row count would change the summation order.
TUNED: dict[tuple[int, int], dict] = {
    (2048, 1536): {"BN": 32, "BK": 128, "SPLIT_K": 4, "num_warps": 8, "num_stages": 3},
    (1536, 1536): {"BN": 16, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    (8960, 1536): {"BN": 32, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
    (1536, 8960): {"BN": 32, "BK": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 4},
    (151936, 1536): {"BN": 64, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
    # The shipped distilled draft (4 layers of 512, a 32k head): no split-K. Its matrices are 0.5-3 MB, so a
    # launch is a chain of dependent memory round trips, not a bandwidth stream, and split-K's partial sums
    # add a store, an atomic and a reload to it: its 4-token block took 0.583 against 0.629 ms with
    # `linear_config`'s split-K (H200, alternating rounds: benchmarks/h200_2026-12-04_draft_block/
    # draft_block_control.json, measured by benchmarks/draft_block.py of commit da5bcaf).
    (768, 512): {"BN": 16, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
    (512, 512): {"BN": 16, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
    (1536, 512): {"BN": 16, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
    (512, 1536): {"BN": 16, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
    (32768, 512): {"BN": 32, "BK": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
}


# Rows measured on other GPUs, which replace TUNED's on those GPUs (`adopt_gpu_table`, by a part of the device's
# name). Hopper (H100 and H200): every launch with SWAP_AB (weights as the wgmma's M side), swept on an H100 80GB HBM3
# for T = 1, 5, 17 and 64 rows together (benchmarks/gpu_rows.py --sweep, 2026-12-06 06:40-07:00 UTC,
# benchmarks/h100_2026-12-06c). Against TUNED on the same card, in alternating rounds, the step took (context 512): on
# that H100 0.986x at T = 1, 0.985x at T = 5, 0.87x at T = 33 and 0.86x at T = 64; on an H200, with
# `fused.STACKED_PAIR`, 0.972x at T = 1, 0.971x at T = 5, 0.817x at T = 33 and 0.828x at T = 64 (2026-12-06 09:58 UTC,
# benchmarks/h200_2026-12-06). Every row stays bit-identical to its one-row step on both. The LM head joined on
# 2026-12-07 (H100, 21:17 UTC, benchmarks/h100_2026-12-07_tables): swapped, it takes one tall tile over 48 rows (it
# scales by the last down launch's block sums, `fused.FACTORED_QKV_NORM`), and the step with TUNED's head took 1.036x
# at T = 64 at 512 tokens, 1.022x at 2k, 1.009x at 8k, 1.007x at 32k, 0.995-1.003x at T <= 48 (the same logits bits at
# every T and context). Split-K other than shipped lost at T = 64: down 5, 7, 11 ways; QKV and O 2, 6 and 12 ways.
HOPPER = {
    (2048, 1536): {"BN": 64, "BK": 128, "SPLIT_K": 4, "num_warps": 8, "num_stages": 3, "SWAP_AB": 1},
    (1536, 1536): {"BN": 64, "BK": 128, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3, "SWAP_AB": 1},
    (8960, 1536): {"BN": 64, "BK": 128, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3, "SWAP_AB": 1},
    (1536, 8960): {"BN": 64, "BK": 64, "SPLIT_K": 4, "num_warps": 4, "num_stages": 6, "SWAP_AB": 1},
    (151936, 1536): {"BN": 64, "BK": 128, "SPLIT_K": 1, "num_warps": 8, "num_stages": 4, "SWAP_AB": 1},
}
GPU_TABLES: dict[str, dict[tuple[int, int], dict]] = {"H100": HOPPER, "H200": HOPPER}
_GIVEN: set[tuple[int, int]] = set()  # shapes `apply_tuned` set (a sweep, --tuned): a GPU's table leaves them
_ADOPTED: set[str] = set()  # GPU names whose table is in TUNED

# A table entry's keys. SWAP_AB (0 or 1; absent means 0): the MMA takes weight rows as its M side
# (`gemv_stream._stream`), a wgmma from shared memory on sm_90 where BN >= 64.
BLOCK_KEYS = ("BN", "BK", "SPLIT_K", "num_warps", "num_stages", "SWAP_AB")


def block_value_rule(key: str, value) -> str | None:
    """Why `value` cannot be a launch's `key` (None when it can), for the tools that take block sizes from a user
    (benchmarks/gpu_rows.py --sweep-space, ncu_step.py --config): a value Triton cannot build or that no table
    would hold is refused in one line before a device is asked for. BN and BK: powers of two from 16 (the MMA
    tile) to 1024; split-K: whole numbers to 64 (any count of K pieces: 24 output blocks split 11 ways fill two
    programs on each of 132 SMs); warps: powers of two to 32 (1,024 threads); stages: >= 1; SWAP_AB: 0 or 1."""
    whole = isinstance(value, int) and not isinstance(value, bool)  # JSON's true is not a block size
    if key == "SWAP_AB":
        return None if whole and value in (0, 1) else "0 or 1"
    if key == "num_stages":
        return None if whole and value >= 1 else "whole numbers >= 1"
    if key == "SPLIT_K":
        return None if whole and 1 <= value <= 64 else "whole numbers from 1 to 64"
    low, high = (16, 1024) if key in ("BN", "BK") else (1, 32 if key == "num_warps" else 64)
    return None if whole and low <= value <= high and not value & (value - 1) else f"powers of two from {low} to {high}"


def tuned_rows() -> list[list]:
    """`TUNED` as JSON-able rows [N, K, config] (gpu_rows.py --sweep writes them)."""
    return [[n, k, config] for (n, k), config in TUNED.items()]


def apply_tuned(rows: list[list]) -> None:
    """Put rows of `tuned_rows` (e.g. a sweep made on this machine) into `TUNED`; they outrank a GPU's table."""
    for n, k, config in rows:
        TUNED[(n, k)] = config
        _GIVEN.add((n, k))


def read_tuned(path: str) -> list[list]:
    """The rows of a tuned.json (`tuned_rows`' form, as benchmarks/gpu_rows.py --sweep writes it): [N, K, config]
    each, with every key but SWAP_AB and values a launch can take (`block_value_rule`). Why one reader: three
    benchmarks take --tuned, and a bad file must be one line before any GPU time, not a traceback mid-run."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--tuned {path}: not a sweep's tuned.json ({exc})") from None
    needed = set(BLOCK_KEYS) - {"SWAP_AB"}
    whole = [isinstance(row, list) and len(row) == 3 and all(isinstance(v, int) for v in row[:2])
             and isinstance(row[2], dict) and needed <= set(row[2]) <= set(BLOCK_KEYS)
             and not any(block_value_rule(key, value) for key, value in row[2].items()) for row in rows] \
        if isinstance(rows, list) else [False]
    if not rows or not all(whole):
        raise UserError(f"--tuned {path}: not a sweep's tuned.json (not [N, K, config] rows with "
                        "BN, BK, SPLIT_K, num_warps and num_stages; benchmarks/gpu_rows.py --sweep writes one)")
    return rows


def adopt_gpu_table(gpu_name: str) -> None:
    """Once per GPU name: the rows of `GPU_TABLES` measured on this GPU (matched by a part of its name) into
    `TUNED`, except the shapes a sweep or a --tuned file gave. Why per GPU: the best blocks differ between cards
    and architectures (Hopper gains from the swapped MMA, which an sm_80 card has no wgmma for), and a table is
    keyed by weight shape only, never by T, so a verify row still computes what a one-row step computes."""
    if gpu_name in _ADOPTED:
        return
    _ADOPTED.add(gpu_name)
    for family, rows in GPU_TABLES.items():
        if family in gpu_name:
            TUNED.update({shape: config for shape, config in rows.items() if shape not in _GIVEN})


def linear_config(n: int, k: int) -> dict:
    """Block sizes of a weight shape: the tuned entry, else a default. BN weight rows per program (>= 16,
    the MMA width), BK columns per step, SPLIT_K programs sharing K (enough programs for a small N)."""
    tuned = TUNED.get((n, k))
    if tuned is not None:
        return tuned
    block_n = 32 if n >= 4096 else 16
    blocks = -(-n // block_n)
    split = 1
    while blocks * split < 264 and k // (split * 2) >= 256:  # ~2 programs per SM on a 132-SM H200
        split *= 2
    return {"BN": block_n, "BK": 128, "SPLIT_K": split, "num_warps": 4, "num_stages": 3}
