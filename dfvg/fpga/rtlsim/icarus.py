"""Icarus Verilog for the RTL run: compile each testbench of `fpga/sim/` once, run it on binary beat files.

Why files and not cocotb: cocotb drives the clock from Python (~8k cycles/s here); a testbench that
`$fread`s one binary record per cycle runs at the simulator's own speed, so the shipped draft's 32,768-row
LM head fits in one run. Records are written the way `$fread` fills a reg: the record's most significant
byte first, so `records` lays the fields out least significant first and reverses each row's bytes.
What this module does not own: what the beats mean (`ops.py`) or the RTL (`fpga/rtl/`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from dfvg.errors import UserError
from dfvg.fpga.datapath import fixed_point as fp

FPGA_DIR = Path(__file__).resolve().parents[3] / "fpga"
RTL, BENCHES_DIR = FPGA_DIR / "rtl", FPGA_DIR / "sim"
# bench -> (testbench file, the kernel it selects with -D, the RTL files it instantiates)
BENCHES = {
    "gemv": ("tb_gemv", None, ["gemv_tile.v", "gemv_int4.v", "requant.v", "requant32.v", "argmax_stream.v"]),
    "norm": ("tb_vector", "NORM", ["delay_ram.v", "rmsnorm.v", "norm_prescale.v", "rmsnorm_wide.v"]),
    "softmax": ("tb_vector", "SOFTMAX", ["delay_ram.v", "softmax_exp.v", "softmax_norm.v", "softmax_row.v"]),
    "rope": ("tb_vector", "ROPE", ["rope.v"]),
    "swiglu": ("tb_vector", "SWIGLU", ["silu_lut.v", "requant.v", "swiglu.v"]),
    "topk": ("tb_topk", None, ["topk_stream.v"]),
}


def write_hex(path: Path, values: torch.Tensor, bits: int) -> None:
    """A $readmemh file: one two's-complement hex word per line."""
    digits, mask = (bits + 3) // 4, (1 << bits) - 1
    path.write_text("".join(f"{int(v) & mask:0{digits}x}\n" for v in values.tolist()))


def write_tables(directory: Path) -> None:
    """The fixed tables every LUT kernel reads (exp2, rsqrt and reciprocal seeds), from fixed_point."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, table in (("exp2", fp.exp2_table()), ("rsqrt_seed", fp.rsqrt_seed_table()),
                        ("recip_seed", fp.recip_seed_table())):
        write_hex(directory / f"{name}.hex", table, 16)


def records(*fields: tuple[np.ndarray, str]) -> bytes:
    """Rows of fields [R, n] (numpy dtype strings, e.g. '<i4') -> R binary records for `$fread`.

    Example: fields (x [R, 2] '<i4', flag [R, 1] 'u1') give 9-byte records; a reg [71:0] read from one
    holds x[0] in bits 31:0, x[1] in 63:32 and the flag in 71:64.
    """
    rows = fields[0][0].shape[0]
    parts = [np.ascontiguousarray(np.asarray(a).astype(dt)).view(np.uint8).reshape(rows, -1) for a, dt in fields]
    return np.ascontiguousarray(np.hstack(parts)[:, ::-1]).tobytes()


def lanes(words: list[str], width: int, signed: bool = True) -> np.ndarray:
    """Hex words of equal length (a bus printed with %h) -> lanes int64 [len(words), bus / width]."""
    if not words:
        return np.zeros((0, 0), dtype=np.int64)
    raw = np.frombuffer(bytes.fromhex("".join(words)), dtype=np.uint8).reshape(len(words), -1)[:, ::-1]
    kind = {8: "i1", 16: "<i2", 32: "<i4"}[width] if signed else {8: "u1", 16: "<u2", 32: "<u4"}[width]
    return np.ascontiguousarray(raw).view(kind).astype(np.int64)


class Icarus:
    """Compiled testbenches (cached per parameter set) and the simulated cycles of every run, per op."""

    def __init__(self, build_dir: Path | None = None):
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            raise UserError("iverilog/vvp not found on PATH; install Icarus Verilog (apt-get install iverilog)")
        self.owns_build = build_dir is None  # a temporary folder is removed by close()
        self.build = Path(build_dir or tempfile.mkdtemp(prefix="dfvg_rtl_"))
        self.luts = self.build / "luts"
        write_tables(self.luts)
        self.compiled: dict[tuple, Path] = {}
        self.cycles: dict[str, int] = defaultdict(int)
        self.runs: dict[str, int] = defaultdict(int)
        self.macs: dict[str, int] = defaultdict(int)  # multiply-accumulates of the GEMV ops (unpadded)
        self.version = subprocess.run(["iverilog", "-V"], capture_output=True, text=True).stdout.split("\n")[0]

    def close(self) -> None:
        """Remove the temporary build folder (compiled testbenches, tables)."""
        if self.owns_build:
            shutil.rmtree(self.build, ignore_errors=True)

    def compile(self, bench: str, params: dict[str, int | str]) -> Path:
        """iverilog once per (testbench, parameters); string parameters are quoted file paths."""
        key = (bench, tuple(sorted(params.items())))
        if key not in self.compiled:
            top, define, rtl = BENCHES[bench]
            out = self.build / f"{bench}_{len(self.compiled)}.vvp"
            defs = [f"-P{top}.{k}={v if isinstance(v, int) else chr(34) + str(v) + chr(34)}"
                    for k, v in params.items()] + ([f"-D{define}"] if define else [])
            srcs = [str(BENCHES_DIR / f"{top}.v")] + [str(RTL / f) for f in rtl]
            proc = subprocess.run(["iverilog", "-g2012", "-o", str(out), *defs, *srcs], capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"iverilog failed for {bench} {params}: {proc.stderr[-2000:]}")
            self.compiled[key] = out
        return self.compiled[key]

    def run(self, op: str, bench: str, params: dict, plusargs: dict[str, int], beats: bytes,
            consts: bytes = b"", macs: int = 0) -> dict[str, list[str]]:
        """Simulate one op: beat records in, output lines grouped by tag ('B', 'C', ...); cycles added to `op`."""
        vvp = self.compile(bench, params)
        with tempfile.TemporaryDirectory(dir=self.build) as tmp:
            files = {"in": Path(tmp) / "in.bin", "consts": Path(tmp) / "consts.bin", "out": Path(tmp) / "out.txt"}
            files["in"].write_bytes(beats)
            files["consts"].write_bytes(consts)
            args = [f"+{k}={v}" for k, v in plusargs.items()] + [f"+{k}={v}" for k, v in files.items()]
            proc = subprocess.run(["vvp", "-n", str(vvp), *args], capture_output=True, text=True)
            text = files["out"].read_text() if files["out"].is_file() else ""
        if proc.returncode or "cycles" not in text:
            raise RuntimeError(f"{bench} ({op}) did not finish: {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
        out: dict[str, list[str]] = defaultdict(list)
        for line in text.splitlines():
            tag, _, rest = line.partition(" ")
            out[tag].append(rest)
        self.cycles[op] += int(out["cycles"][0])
        self.runs[op] += 1
        self.macs[op] += macs
        return out
