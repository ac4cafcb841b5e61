"""Compile the fused GEMV launches of the 1.5B target for sm_90 on any machine (no GPU) and print what the
compiler made of them: the tensor-core instruction, cp.async copies, shared memory, registers per thread and
the programs an SM can then hold at once, per row-tile height.

Why: a device lease is scarce, and a tile height or block size that needs more shared memory or registers than
an SM has for two programs is visible here before any timing. Nsight Compute on an H100 (benchmarks/RESULTS.md,
2026-12-06 04:03 UTC) found the gate/up launch at 250 registers, so 2 programs (8 warps) per SM, its warps
waiting most of the time; the registers here are the same count (the compiled cubin's, read with the
cuobjdump that Triton ships). The JIT's specialisation is imitated: pointers and the ints that are multiples
of 16 at run time (x_stride, N, k_len) get the 16-divisibility hint.

    python gpu/compile_sm90.py 16 32 64          # heights (default: 16)
    python gpu/compile_sm90.py --stream-ahead 16 # with a 512-column weight prefetch and the early trigger at any
                                                 # height (fused.PREFETCH_COLUMNS; decode_attention.EARLY_TRIGGER
                                                 # ships on for launches of up to 16 rows)
    python gpu/compile_sm90.py --shape 8960x1536 --space "BK=128,256 num_warps=4,8"
                                                 # one launch over block sizes (gpu_rows.py --sweep-space's words)
    python gpu/compile_sm90.py --gpu H100 16      # the table an H100 or H200 runs (GPU_TABLES), not TUNED
    python gpu/compile_sm90.py --epilogue-first --unstacked 16  # fused.EPILOGUE_FIRST on / fused.STACKED_PAIR off
    python gpu/compile_sm90.py --unfactored-norm --over-16-rows 16  # a launch over 16 rows: O normalizes for gate/up
    python gpu/compile_sm90.py --rms-loads-in-turn 16  # fused.RMS_LOADS_FIRST off
    python gpu/compile_sm90.py --unfactored-norm 16    # fused.FACTORED_NORM off: gate/up normalizes its own x
    python gpu/compile_sm90.py --unfactored-qkv-norm 16  # fused.FACTORED_QKV_NORM off: QKV and the LM head
                                                         # normalize their own x (on: down stores out * g and sums)
    python gpu/compile_sm90.py --attention       # the attention split launch at 64, 128 and 256 cache slots a split,
                                                 # and the merge by columns and a head at once
    python gpu/compile_sm90.py --gpu H100 --tma 16  # fused.TMA_WEIGHTS on: swapped launches copy weights by TMA
    python gpu/compile_sm90.py --gpu H100 --weights-ahead 3 16  # fused.WEIGHTS_AHEAD: a split of <= 3 K steps
                                                                # loads its weight tiles before the wait
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.gpu import fused  # noqa: E402
from dfvg.gpu.block_sizes import GPU_TABLES, TUNED, adopt_gpu_table  # noqa: E402
from dfvg.gpu.kernels import HAVE_TRITON  # noqa: E402

LINEAR = {"x_ptr": "*bf16", "x_stride": "i32", "g_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16",
          "res_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "rows": "i32",
          "N": "i32", "k_len": "i32", "eps": "fp32", "xn_ptr": "*bf16", "gn_ptr": "*bf16", "row_count_ptr": "*i32",
          "sq_ptr": "*fp32"}
QKV = {"x_ptr": "*bf16", "g_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "pos_ptr": "*i64",
       "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "q_ptr": "*bf16", "kc_ptr": "*bf16",
       "vc_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "rows": "i32", "k_len": "i32", "eps": "fp32",
       "sq_ptr": "*fp32"}
DIVISIBLE = ("x_stride", "N", "k_len")
# The 1.5B target's launches: (N, K) -> what runs on that weight
LAUNCHES = {(2048, 1536): "qkv + rope", (1536, 1536): "o proj + residual", (8960, 1536): "norm + gate/up",
            (1536, 8960): "down + residual", (151936, 1536): "norm + lm head"}
# An sm_90 SM: its register file, shared memory (less 1 KiB the driver keeps per program), programs and warps
SM_REGISTERS, SM_SHARED, PROGRAM_RESERVED, SM_PROGRAMS, SM_WARPS = 65536, 228 * 1024, 1024, 32, 64
SMS = 132  # an H100 SXM's and an H200's SMs


def compiled(fn, types: dict, consts: dict, cfg: dict):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(fn.fn).parameters)
    if "w_desc" in names:  # a fused GEMV launch
        types = {**types, "w_desc": _descriptor_type(consts, cfg)}
        if not consts.get("TMA"):
            consts = {**consts, "w_desc": None}  # (the launch passes None: a constexpr)
    signature = {n: "constexpr" if n in consts else types[n] for n in names}
    hints = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n].startswith("*") or n in DIVISIBLE}
    return triton.compile(ASTSource(fn, signature, consts, attrs=hints), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})


def _descriptor_type(consts: dict, cfg: dict) -> str:
    """The weight descriptor's type as `fused._weight_tiles` builds it: [1, 2 or 1, BN, BK] blocks of bf16."""
    halves = 2 if consts.get("SWIGLU", True) else 1  # QKV + RoPE (no SWIGLU key) takes a head's two halves
    return f"tensordesc<bf16[1,{halves},{consts['BN']},{cfg['BK']}]>"


# Compile the launches of a step over 16 rows (`fused.NORM_IN_PRODUCER_ABOVE`): the O launch normalizes gate/up's
# input, and gate/up has no norm of its own. Off: the launches of a step of up to 16 rows, as T = 1 runs them.
OVER_ONE_TILE = False


def compiled_launch(height: int, shape: tuple[int, int], ahead: bool = False, cfg: dict | None = None,
                    over_one_tile: bool | None = None, table: dict | None = None):
    """The target's launch on weight `shape` with `height`-row tiles, compiled for sm_90 (its block sizes in `table`,
    default TUNED, or `cfg`; `--gpu` puts that GPU's table in TUNED first; a factored norm's consumer counts its
    producer's blocks in the same table); `over_one_tile`: as a launch over 16 rows runs it (None: `OVER_ONE_TILE`);
    `ahead`: with the weight prefetch of 512 columns and the early trigger at any height (fused.PREFETCH_COLUMNS,
    decode_attention.EARLY_TRIGGER; without it, the trigger as shipped: `_triggers`)."""
    table = table or TUNED
    cfg, what = cfg or table[shape], LAUNCHES[shape]
    common = {"K": shape[1], "F32": False, "BT": height, "BK": cfg["BK"], "SPLIT_K": cfg["SPLIT_K"],
              "SWAP_AB": bool(cfg.get("SWAP_AB", 0)), "STACK": fused.STACKED_PAIR, "PDL": True,
              "PREFETCH": 512 if ahead else 0, "TRIGGER": ahead or _triggers(height, what),
              "THREADS": 32 * cfg["num_warps"], "EARLY": fused.EPILOGUE_FIRST, "LOADS_FIRST": fused.RMS_LOADS_FIRST,
              "TMA": fused.TMA_WEIGHTS and bool(cfg.get("SWAP_AB", 0)) and fused.STACKED_PAIR,
              "AHEAD": 0 if fused.TMA_WEIGHTS else fused.steps_ahead(shape[1], cfg)}
    down_blocks = -(-1536 // table[(1536, 8960)]["BN"])  # the down launch's output blocks: QKV's / the head's sums
    qkv_factored = fused.FACTORED_QKV_NORM  # down stores out * g and its sums, QKV (past layer 0) and the head scale
    if what.startswith("qkv"):
        consts = {**common, "HEADS": 12, "KV_HEADS": 2, "HD": 128, "HAS_BIAS": True, "BN": min(cfg["BN"], 64),
                  "ROW_SCALE": down_blocks if qkv_factored else 0}
        return compiled(fused._qkv_rope_kernel, QKV, consts, cfg)
    normalized = OVER_ONE_TILE if over_one_tile is None else over_one_tile  # the O launch normalizes for gate/up
    factored = fused.FACTORED_NORM  # at every row count: O stores out * g and its sums, gate/up scales by 1/RMS
    produces = (normalized or factored) and what.startswith("o proj")
    o_blocks = -(-1536 // table[(1536, 1536)]["BN"])  # the O launch's output blocks: gate/up's sums a row
    head = qkv_factored and "lm head" in what
    consts = {**common, "NORM": "norm" in what and not ((normalized or factored) and "gate" in what) and not head,
              "SWIGLU": "gate" in what, "HAS_BIAS": False, "HAS_RES": "residual" in what, "BN": cfg["BN"],
              "NORM_OUT": shape[0] if produces and not factored else 0,
              "SCALE_OUT": (produces and factored) or (qkv_factored and what.startswith("down")),
              "ROW_SCALE": o_blocks if factored and "gate" in what else down_blocks if head else 0}
    return compiled(fused._linear_kernel, LINEAR, consts, cfg)


def _triggers(height: int, what: str) -> bool:
    """Whether the shipped launch `what` of `height`-row tiles triggers the next launch early, as a launch of up to 16
    rows runs it (`decode_attention.EARLY_TRIGGER` up to `GEMV_TRIGGER_ROWS` rows, QKV up to the attention's
    `EARLY_TRIGGER_ROWS`: the attention split follows it; a taller tile runs more rows)."""
    from dfvg.gpu import decode_attention

    return decode_attention.triggers_early(height, gemv=not what.startswith("qkv"))


def registers(cubin: bytes) -> int | None:
    """Registers per thread of the cubin's kernel (Triton's bundled cuobjdump -res-usage); None without the tool."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        report = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+)", report)
    return int(found.group(1)) if found else None


def programs_per_sm(regs: int, warps: int, shared: int) -> int:
    """Programs an sm_90 SM can hold at once: registers are given out per warp in units of 256, shared memory per
    program with the driver's 1 KiB on top; at most 32 programs and 64 warps. An upper bound: the driver may carve
    out less than the whole 228 KiB for shared memory (ncu's "Block Limit Shared Mem")."""
    per_warp = -(-regs * 32 // 256) * 256
    return min(SM_REGISTERS // (per_warp * warps), SM_SHARED // (shared + PROGRAM_RESERVED), SM_PROGRAMS,
               SM_WARPS // warps)


def one_row_programs(shape: tuple[int, int], cfg: dict) -> int:
    """Programs of the launch at T = 1 (one row tile): output blocks x K splits (`fused._linear`'s grid); QKV + RoPE's
    blocks are BN-column pieces of both halves of each of the 16 q/k/v heads of 128."""
    n = shape[0]
    blocks = n // 128 * (64 // min(cfg["BN"], 64)) if LAUNCHES[shape].startswith("qkv") else -(-n // cfg["BN"])
    return blocks * cfg["SPLIT_K"]


def describe(height: int, shape: tuple[int, int], ahead: bool = False, cfg: dict | None = None) -> str:
    """One line: the launch, its instruction, cp.async copies, shared memory, registers, programs per SM and the
    waves its one-row launch takes on 132 SMs (a launch of 1.06 waves runs a tail of programs on a few SMs)."""
    what = LAUNCHES[shape]
    kernel = compiled_launch(height, shape, ahead, cfg)
    cfg = cfg or TUNED[shape]
    regs = registers(kernel.asm["cubin"])
    fit = "regs   ?"
    if regs:
        per_sm = programs_per_sm(regs, cfg["num_warps"], kernel.metadata.shared)
        waves = f"waves at T = 1 {one_row_programs(shape, cfg) / (per_sm * SMS):5.2f}" if per_sm else \
            "(does not fit an SM)"
        fit = f"regs {regs:3d}  programs/SM {per_sm:2d}  {waves}"
    ptx = kernel.asm["ptx"]
    instruction = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync"
    ahead_part = (f"  L2 prefetch {ptx.count('cp.async.bulk.prefetch.L2'):2d}  "
                  f"trigger {ptx.count('griddepcontrol.launch_dependents'):2d}") if ahead else ""
    copies = ptx.count("cp.async") - ptx.count("cp.async.bulk.prefetch")
    return (f"{height:3d} rows  {what:18s} {shape[0]:6d}x{shape[1]:<5d} {instruction:8s} "
            f"cp.async {copies:3d}  shared {kernel.metadata.shared / 1024:6.1f} KiB  {fit}{ahead_part}")


ATTENTION = {"q_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16", "pos_ptr": "*i64", "root_ptr": "*i64",
             "anc_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "rows": "i32", "wanted": "i32",
             "scale": "fp32"}


def describe_attention(slots: int) -> str:
    """One line: the attention split launch of the 1.5B target (12 heads, 2 kv heads of 128) with `slots` cache slots
    a split (`decode_attention.ATTENTION_SPLIT`), as `attention` launches it (4 warps, a chain): shared memory,
    registers, programs per SM, and the items of a one-row step at a 32k context against the programs that fit."""
    from dfvg.gpu import decode_attention

    consts = {"HEADS": 12, "KV_HEADS": 2, "HD": 128, "F32": False, "BM": decode_attention.TILE, "BS": slots,
              "TREE": False, "DEPTH": 1, "PDL": True, "TRIGGER": decode_attention.SPLIT_TRIGGER_SPLITS}
    cfg = {"num_warps": 4, "num_stages": 3}  # `attention`'s launch (Triton's default stages)
    kernel = compiled(decode_attention._attention_split_kernel, ATTENTION, consts, cfg)
    regs, shared = registers(kernel.asm["cubin"]), kernel.metadata.shared
    per_sm = programs_per_sm(regs, cfg["num_warps"], shared) if regs else 0
    items = consts["KV_HEADS"] * -(-32704 // slots)  # (kv head, split) items of a one-row step at 32,704 tokens
    fit = f"regs {regs:3d}  programs/SM {per_sm:2d}  32k items / resident programs {items / (per_sm * SMS):5.2f}" \
        if per_sm else "regs   ?"
    return f"attention split  {slots:3d} slots  shared {shared / 1024:6.1f} KiB  {fit}"


MERGE = {"pos_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "out_ptr": "*bf16", "rows": "i32"}


def describe_merge(at_once: bool) -> str:
    """One line: the attention merge launch of the 1.5B target as `attention` launches it, with a head merged at once
    where a row's splits fit one step (`decode_attention.MERGE_HEAD_AT_ONCE`) or not: shared memory and registers."""
    from dfvg.gpu import decode_attention

    consts = {"HEADS": 12, "KV_HEADS": 2, "HD": 128, "BM": decode_attention.TILE,
              "BS": decode_attention.ATTENTION_SPLIT, "NS": decode_attention.COMBINE_SPLITS,
              "SHORT": decode_attention.COMBINE_SHORT,
              "BD": decode_attention.COMBINE_COLUMNS, "PDL": True, "TRIGGER": True, "AT_ONCE": at_once}
    kernel = compiled(decode_attention._attention_combine_kernel, MERGE, consts, {"num_warps": 4, "num_stages": 3})
    regs = registers(kernel.asm["cubin"])
    return f"attention merge  {'head at once' if at_once else 'by columns  '}  shared " \
           f"{kernel.metadata.shared / 1024:6.1f} KiB  regs {regs if regs else '  ?'}"


def describe_or_why_not(height: int, shape: tuple[int, int], ahead: bool, cfg: dict) -> str:
    """`describe`, or one line where Triton cannot build the launch with these block sizes (a sweep's result,
    as `gpu_rows.time_launch` counts it, not a crash)."""
    try:
        return describe(height, shape, ahead, cfg)
    except Exception as exc:  # Triton's CompilationError and out-of-resource errors alike
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return f"{height:3d} rows  {LAUNCHES[shape]:18s} does not compile: {first[:100]}"


def _option(argv: list[str], name: str, example: str) -> str | None:
    """The value after `name` in argv (both removed), or None."""
    if name not in argv:
        return None
    at = argv.index(name)
    if at + 1 >= len(argv):
        sys.exit(f"error: {name} needs a value, e.g. {name} {example}")
    value = argv[at + 1]
    del argv[at:at + 2]
    return value


def launch_space(shape_text: str, space_text: str) -> tuple[tuple[int, int], list[dict]]:
    """--shape NxK (one of LAUNCHES; default the gate/up launch's 8960x1536) and --space words -> (shape, the
    block sizes `gpu_rows.py --sweep --sweep-space` would try on that launch); a bad value is one line."""
    import argparse

    from benchmarks.gpu_decode import SHAPES
    from benchmarks.gpu_rows import shape_grid, shapes, sweep_launches, sweep_space
    from dfvg.errors import UserError

    cfg = SHAPES["qwen2.5-coder-1.5b"]
    shape = tuple(int(v) for v in shape_text.split("x")) if re.fullmatch(r"\d+x\d+", shape_text) else None
    if shape not in LAUNCHES:
        sys.exit(f"error: --shape is one of {', '.join(f'{n}x{k}' for n, k in LAUNCHES)}, got {shape_text}")
    try:
        space = sweep_space(space_text)
    except argparse.ArgumentTypeError as exc:
        sys.exit(f"error: --space {exc}")
    name = next(name for name, (n, k, _) in shapes(cfg).items() if (n, k) == shape)
    try:
        sweep_launches(cfg, name, space)  # gpu_rows.py's own refusal of a space that leaves the launch nothing
    except UserError as exc:
        sys.exit(f"error: {exc}")
    return shape, shape_grid(cfg, name, space)


def main(argv: list[str]) -> None:
    """Print one line per launch (or per block size of --shape's launch over --space) and row-tile height."""
    if not HAVE_TRITON:
        sys.exit("error: Triton is not installed (pip install triton; CUDA builds of torch ship it)")
    if "--attention" in argv:
        print("\n".join([*(describe_attention(slots) for slots in (64, 128, 256)),
                         *(describe_merge(at_once) for at_once in (False, True))]), flush=True)
        return
    ahead = "--stream-ahead" in argv
    fused.EPILOGUE_FIRST = fused.EPILOGUE_FIRST or "--epilogue-first" in argv
    fused.STACKED_PAIR = fused.STACKED_PAIR and "--unstacked" not in argv
    fused.RMS_LOADS_FIRST = fused.RMS_LOADS_FIRST and "--rms-loads-in-turn" not in argv
    fused.FACTORED_NORM = fused.FACTORED_NORM and "--unfactored-norm" not in argv
    fused.FACTORED_QKV_NORM = fused.FACTORED_QKV_NORM and "--unfactored-qkv-norm" not in argv
    fused.TMA_WEIGHTS = fused.TMA_WEIGHTS or "--tma" in argv
    global OVER_ONE_TILE
    OVER_ONE_TILE = "--over-16-rows" in argv
    ahead_steps = _option(argv, "--weights-ahead", "3")
    if ahead_steps is not None:
        if not ahead_steps.isdigit():
            sys.exit(f"error: --weights-ahead takes a count of K steps such as 3, got {ahead_steps}")
        fused.WEIGHTS_AHEAD = int(ahead_steps)
    switches = ("--stream-ahead", "--epilogue-first", "--unstacked", "--over-16-rows", "--rms-loads-in-turn",
                "--unfactored-norm", "--unfactored-qkv-norm", "--tma")
    argv = [a for a in argv if a not in switches]
    shape_text, space_text = _option(argv, "--shape", "8960x1536"), _option(argv, "--space", "'BK=128,256'")
    gpu = _option(argv, "--gpu", "H100")
    if gpu is not None:
        if gpu not in GPU_TABLES:
            sys.exit(f"error: --gpu is one of {', '.join(GPU_TABLES)} (the GPUs with a table of their own), got {gpu}")
        adopt_gpu_table(gpu)
    try:
        heights = [int(a) for a in argv] or [16]
    except ValueError:
        sys.exit(f"error: row-tile heights must be integers such as 16 32 64, got {' '.join(argv)}")
    if any(h < 16 or h & (h - 1) for h in heights):
        sys.exit(f"error: a row-tile height is a power of two >= 16, got {' '.join(argv)}")
    if shape_text or space_text:
        shape, grid = launch_space(shape_text or "8960x1536", space_text or "")
        for height in heights:
            for cfg in grid:
                print(f"{describe_or_why_not(height, shape, ahead, cfg)}  {cfg}", flush=True)
        return
    for height in heights:
        for shape in LAUNCHES:
            print(describe(height, shape, ahead), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
