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
    # the ops of the whole-draft RTL run (dfvg/fpga/rtlsim), at the shipped draft's sizes
    "requant32": {  # int32 residual requantization + residual add; ACC_W 48 covers the int4 path
        "top": "requant32", "rtl": ["requant32.v"], "sim": {"ACC_W": 48}, "synth": {"ACC_W": 48},
    },
    "gemv_int4": {  # int4 weights, uint8 group scales; K = 512, G = 128 in the test
        "top": "gemv_int4", "rtl": ["gemv_int4.v"],
        "sim": {"P": 16, "W": 16}, "synth": {"P": 8, "W": 16}, "vectors": 200,
    },
    "rmsnorm_wide": {  # int32 residual rows: per-row shift into 15 bits, then rmsnorm
        "top": "rmsnorm_wide", "rtl": ["delay_ram.v", "rmsnorm.v", "norm_prescale.v", "rmsnorm_wide.v"],
        "files": {"SEED_FILE": "rsqrt_seed.hex"},
        "sim": {"D": 512, "W": 16}, "synth": {"D": 512, "W": 16}, "vectors": 300,
    },
    "softmax_row": {  # max-subtract + prefix mask + softmax_exp + softmax_norm over a 256-position context
        "top": "softmax_row", "rtl": ["delay_ram.v", "softmax_exp.v", "softmax_norm.v", "softmax_row.v"],
        "files": {"EXP_FILE": "exp2.hex", "SEED_FILE": "recip_seed.hex"},
        "sim": {"L": 256, "W": 16}, "synth": {"L": 1024, "W": 16}, "vectors": 300,
    },
    "swiglu": {  # SiLU table, silu * up, requantize
        "top": "swiglu", "rtl": ["silu_lut.v", "requant.v", "swiglu.v"], "files": {"LUT_FILE": "silu.hex"},
        "sim": {"W": 16}, "synth": {"W": 16},
    },
    "topk_stream": {  # a token tree node's children: the K best logits, lower index first on ties
        "top": "topk_stream", "rtl": ["topk_stream.v"],
        "sim": {"K": 4, "VAL_W": 32, "IDX_W": 16}, "synth": {"K": 8, "VAL_W": 32, "IDX_W": 18}, "vectors": 1000,
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
