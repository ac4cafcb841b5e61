"""Write the RTL lookup tables (.hex for $readmemh) from dfvg.fpga.datapath.fixed_point: one source of truth.

Usage: python scripts/gen_luts.py [OUT_DIR]   (default build/luts). Files: exp2.hex (256 x 16 bit),
rsqrt_seed.hex (128 x 16), recip_seed.hex (64 x 16), silu.hex (256 x 8, for SILU_SCALES).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dfvg.fpga.datapath import fixed_point as fp  # noqa: E402
from dfvg.fpga.rtlsim.icarus import write_hex  # noqa: E402  (the RTL run writes its tables the same way)

# The SiLU table depends on the gate/output scales of each layer; the RTL test and synthesis use this
# one (a real deployment writes one table per layer the same way).
SILU_SCALES = (0.05, 0.025)


def tables() -> dict[str, tuple[torch.Tensor, int]]:
    """name -> (values, bit width)."""
    return {
        "exp2": (fp.exp2_table(), 16),
        "rsqrt_seed": (fp.rsqrt_seed_table(), 16),
        "recip_seed": (fp.recip_seed_table(), 16),
        "silu": (fp.silu_table(*SILU_SCALES), 8),
    }


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, (vals, bits) in tables().items():
        write_hex(out / f"{name}.hex", vals, bits)
    print(f"[luts] wrote {', '.join(tables())} to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "build" / "luts")
