"""Compile the fused GEMV launches of the 1.5B target for sm_90 on any machine (no GPU) and print what the
compiler made of them: the tensor-core instruction, cp.async copies and shared memory, per row-tile height.

Why: a device lease is scarce, and a tile height or block size that needs more shared memory than an SM has
for two programs is visible here before any timing. The JIT's specialisation is imitated: pointers and the
ints that are multiples of 16 at run time (x_stride, N, k_len) get the 16-divisibility hint.

    python gpu/compile_sm90.py 16 32 64          # heights (default: 16)
    python gpu/compile_sm90.py --stream-ahead 16 # with a 512-column weight prefetch and the early trigger
                                                 # (fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.gpu import fused  # noqa: E402
from dfvg.gpu.block_sizes import TUNED  # noqa: E402
from dfvg.gpu.kernels import HAVE_TRITON  # noqa: E402

LINEAR = {"x_ptr": "*bf16", "x_stride": "i32", "g_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16",
          "res_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "rows": "i32",
          "N": "i32", "k_len": "i32", "eps": "fp32"}
QKV = {"x_ptr": "*bf16", "g_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "pos_ptr": "*i64",
       "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "q_ptr": "*bf16", "kc_ptr": "*bf16",
       "vc_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "rows": "i32", "k_len": "i32", "eps": "fp32"}
DIVISIBLE = ("x_stride", "N", "k_len")
# The 1.5B target's launches: (N, K) -> what runs on that weight
LAUNCHES = {(2048, 1536): "qkv + rope", (1536, 1536): "o proj + residual", (8960, 1536): "norm + gate/up",
            (1536, 8960): "down + residual", (151936, 1536): "norm + lm head"}


def compiled(fn, types: dict, consts: dict, cfg: dict):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(fn.fn).parameters)
    signature = {n: "constexpr" if n in consts else types[n] for n in names}
    hints = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n].startswith("*") or n in DIVISIBLE}
    return triton.compile(ASTSource(fn, signature, consts, attrs=hints), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})


def compiled_launch(height: int, shape: tuple[int, int], ahead: bool = False):
    """The target's launch on weight `shape` with `height`-row tiles, compiled for sm_90; `ahead`: with the weight
    prefetch of 512 columns and the early trigger (fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER)."""
    cfg, what = TUNED[shape], LAUNCHES[shape]
    common = {"K": shape[1], "F32": False, "BT": height, "BK": cfg["BK"], "SPLIT_K": cfg["SPLIT_K"], "PDL": True,
              "PREFETCH": 512 if ahead else 0, "TRIGGER": ahead, "THREADS": 32 * cfg["num_warps"]}
    if what.startswith("qkv"):
        consts = {**common, "HEADS": 12, "KV_HEADS": 2, "HD": 128, "HAS_BIAS": True, "BN": min(cfg["BN"], 64)}
        return compiled(fused._qkv_rope_kernel, QKV, consts, cfg)
    consts = {**common, "NORM": "norm" in what, "SWIGLU": "gate" in what, "HAS_BIAS": False,
              "HAS_RES": "residual" in what, "BN": cfg["BN"]}
    return compiled(fused._linear_kernel, LINEAR, consts, cfg)


def describe(height: int, shape: tuple[int, int], ahead: bool = False) -> str:
    what = LAUNCHES[shape]
    kernel = compiled_launch(height, shape, ahead)
    ptx = kernel.asm["ptx"]
    instruction = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync"
    ahead_part = (f"  L2 prefetch {ptx.count('cp.async.bulk.prefetch.L2'):2d}  "
                  f"trigger {ptx.count('griddepcontrol.launch_dependents'):2d}") if ahead else ""
    copies = ptx.count("cp.async") - ptx.count("cp.async.bulk.prefetch")
    return (f"{height:3d} rows  {what:18s} {shape[0]:6d}x{shape[1]:<5d} {instruction:8s} "
            f"cp.async {copies:3d}  shared {kernel.metadata.shared / 1024:6.1f} KiB{ahead_part}")


def main(argv: list[str]) -> None:
    if not HAVE_TRITON:
        sys.exit("error: Triton is not installed (pip install triton; CUDA builds of torch ship it)")
    ahead = "--stream-ahead" in argv
    argv = [a for a in argv if a != "--stream-ahead"]
    try:
        heights = [int(a) for a in argv] or [16]
    except ValueError:
        sys.exit(f"error: row-tile heights must be integers such as 16 32 64, got {' '.join(argv)}")
    if any(h < 16 or h & (h - 1) for h in heights):
        sys.exit(f"error: a row-tile height is a power of two >= 16, got {' '.join(argv)}")
    for height in heights:
        for shape in LAUNCHES:
            print(describe(height, shape, ahead), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
