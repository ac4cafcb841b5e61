"""The kernel list shared by simulation (tests/run_sim.py) and synthesis (scripts/synth_oss.py).

Each kernel: its top module, the RTL files it needs, the parameters it is simulated with (small tiles,
so cocotb can push 10k vectors through in seconds, or the shipped draft's real sizes with fewer vectors:
`vectors`), and the parameters it is synthesized with (sizes a draft model would use). LUT-based kernels
read their tables from build/luts (written by gen_luts.py).
"""

from pathlib import Path

FPGA_DIR = Path(__file__).resolve().parents[1]
RTL = FPGA_DIR / "rtl"
LUTS = FPGA_DIR / "build" / "luts"

KERNELS = {
    "gemv_tile": {
        "top": "gemv_tile", "rtl": ["requant.v", "gemv_tile.v"],
        "sim": {"P": 4, "W": 8}, "synth": {"P": 8, "W": 16},
    },
    "argmax_stream": {
        "top": "argmax_stream", "rtl": ["argmax_stream.v"],
        "sim": {"W": 4, "VAL_W": 32, "IDX_W": 16}, "synth": {"W": 16, "VAL_W": 32, "IDX_W": 18},
    },
    "silu_lut": {
        "top": "silu_lut", "rtl": ["silu_lut.v"], "files": {"LUT_FILE": "silu.hex"},
        "sim": {"W": 8}, "synth": {"W": 16},
    },
    "softmax_exp": {
        "top": "softmax_exp", "rtl": ["softmax_exp.v"], "files": {"LUT_FILE": "exp2.hex"},
        "sim": {"W": 8, "D_W": 32}, "synth": {"W": 16, "D_W": 32},
    },
    "softmax_norm": {
        "top": "softmax_norm", "rtl": ["delay_ram.v", "softmax_norm.v"], "files": {"SEED_FILE": "recip_seed.hex"},
        "sim": {"L": 16, "W": 4}, "synth": {"L": 1024, "W": 16},
    },
    "rmsnorm": {
        "top": "rmsnorm", "rtl": ["delay_ram.v", "rmsnorm.v"], "files": {"SEED_FILE": "rsqrt_seed.hex"},
        "sim": {"D": 512, "W": 16, "IN_W": 16}, "synth": {"D": 896, "W": 16, "IN_W": 16}, "vectors": 500,
    },
    "qk_norm": {  # Qwen3's per-head q/k RMSNorm: the same kernel over head_dim int8 lanes
        "top": "rmsnorm", "rtl": ["delay_ram.v", "rmsnorm.v"], "files": {"SEED_FILE": "rsqrt_seed.hex"},
        "sim": {"D": 64, "W": 8, "IN_W": 8}, "synth": {"D": 128, "W": 16, "IN_W": 8}, "vectors": 2000,
    },
    "rope": {
        "top": "rope", "rtl": ["rope.v"],
        "sim": {"W": 8}, "synth": {"W": 32},
    },
}


def sources(name: str) -> list[Path]:
    """Absolute RTL paths of one kernel."""
    return [RTL / f for f in KERNELS[name]["rtl"]]


def vivado_tcl() -> str:
    """The kernel list as a Tcl dict for vivado/synth.tcl and impl.tcl (synthesis sizes)."""
    lines = ["set kernels [dict create]"]
    for name, spec in KERNELS.items():
        generics = " ".join(f"{k} {v}" for k, v in spec["synth"].items())
        lines.append(f"dict set kernels {name} [dict create top {spec['top']} "
                     f"files {{{' '.join(spec['rtl'])}}} generics {{{generics}}}]")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    Path(sys.argv[1]).write_text(vivado_tcl())
