"""Alveo board records: the fabric, memory and power facts the latency model and the resource report use.

This module owns the numbers only. Fabric counts and off-chip peaks are vendor data-sheet figures (as
quoted in UG1393 / the accelerator papers listed in docs/fpga_model.md); the measured bandwidth is the
Shuhai benchmark's; the shell overhead is the U280 XDMA platform's static region, reused (and marked
`assumed`) for the other cards. Board power is never measured here: each record says where its figure
comes from and marks it `assumed`, because a board draws what the design on it draws.

On-chip bytes are derived, not typed in: BRAM36 = 36 Kib = 4,608 B and URAM288 = 288 Kib = 36,864 B,
so U280's 2,016 BRAM36 + 960 URAM give 44,679,168 B (42.6 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass

from dfvg.errors import UserError

BRAM36_BYTES = 36 * 1024 // 8  # 4,608 B per RAMB36E2
URAM288_BYTES = 288 * 1024 // 8  # 36,864 B per URAM288


@dataclass(frozen=True)
class Board:
    """One accelerator card. Counts are the whole device; `shell_*` is what the platform takes first."""

    name: str
    lut: int
    ff: int  # 2 flip-flops per LUT in UltraScale+ and Versal CLBs
    dsp: int
    dsp_type: str  # "DSP48E2" (UltraScale+) or "DSP58" (Versal)
    bram36: int
    uram: int
    offchip_type: str
    offchip_bytes: int
    offchip_peak_gbps: float  # GB/s = 1e9 B/s, vendor peak
    offchip_measured_gbps: float | None  # best published measurement, None where none is known
    shell_lut: int
    shell_bram36: float
    shell_provenance: str  # "estimated" from a platform report, or "assumed" (reused from another card)
    power_w: float  # typical board power while running an LLM decoder
    power_provenance: str  # always "assumed" here: no board is measured in this project
    power_source: str
    source: str

    @property
    def on_chip_bytes(self) -> int:
        """BRAM36 + URAM288 capacity in bytes (distributed LUT RAM is left out: it is logic, not storage)."""
        return self.bram36 * BRAM36_BYTES + self.uram * URAM288_BYTES

    @property
    def shell_bytes(self) -> int:
        """On-chip bytes the shell's BRAM takes before the user kernel gets any."""
        return int(self.shell_bram36 * BRAM36_BYTES)


_U280_SHELL = dict(shell_lut=107_629, shell_bram36=195.5)
_U280_POWER_SOURCE = (
    "FlightLLM (FPGA'24) on-board measurement of an LLM decoder on U280 (~45 W); a different design "
    "draws a different power, so this is a swept assumption"
)

BOARDS: dict[str, Board] = {
    "u280": Board(
        name="u280", lut=1_303_680, ff=2_607_360, dsp=9_024, dsp_type="DSP48E2", bram36=2_016, uram=960,
        offchip_type="HBM2", offchip_bytes=8 * 2**30, offchip_peak_gbps=460.0, offchip_measured_gbps=425.0,
        **_U280_SHELL, shell_provenance="estimated", power_w=45.0, power_provenance="assumed",
        power_source=_U280_POWER_SOURCE,
        source="AMD DS963 / UG1393 (32 HBM pseudo-channels x 14.375 GB/s = 460 GB/s); 425 GB/s measured by "
        "Shuhai (FCCM'20); also 32 GB DDR4, not modeled; shell: xilinx_u280 XDMA platform static region",
    ),
    "u55c": Board(
        name="u55c", lut=1_303_680, ff=2_607_360, dsp=9_024, dsp_type="DSP48E2", bram36=2_016, uram=960,
        offchip_type="HBM2", offchip_bytes=16 * 2**30, offchip_peak_gbps=460.0, offchip_measured_gbps=None,
        **_U280_SHELL, shell_provenance="assumed", power_w=45.0, power_provenance="assumed",
        power_source="U280 figure reused: the U55C carries the same XCU55C/XCU280-class die and HBM2 stacks",
        source="AMD UG1393 (16 GB HBM2, 32 PCs x 512 MB, 460 GB/s); no DDR; shell overhead reused from U280",
    ),
    "u250": Board(
        name="u250", lut=1_728_000, ff=3_456_000, dsp=12_288, dsp_type="DSP48E2", bram36=2_688, uram=1_280,
        offchip_type="DDR4", offchip_bytes=64 * 2**30, offchip_peak_gbps=77.0, offchip_measured_gbps=None,
        **_U280_SHELL, shell_provenance="assumed", power_w=60.0, power_provenance="assumed",
        power_source="U280's 45 W scaled by LUT count (x1.33); no published LLM-decoder power on U250",
        source="AMD DS962 / UG1393 (4 x DDR4-2400 channels, 77 GB/s); shell overhead reused from U280",
    ),
    "v80": Board(
        name="v80", lut=2_574_208, ff=5_148_416, dsp=10_848, dsp_type="DSP58", bram36=3_741, uram=1_925,
        offchip_type="HBM2e", offchip_bytes=32 * 2**30, offchip_peak_gbps=820.0, offchip_measured_gbps=None,
        **_U280_SHELL, shell_provenance="assumed", power_w=90.0, power_provenance="assumed",
        power_source="U280's 45 W scaled by LUT count (x1.97); no published LLM-decoder power on V80",
        source="AMD Alveo V80 data-sheet figures (Versal HBM, 32 GB HBM2e, 820 GB/s); shell (AVED) overhead "
        "unknown here, U280's reused",
    ),
}


def get_board(name: str) -> Board:
    """Look a board up by name (case-insensitive, 'alveo-' prefix allowed)."""
    key = name.strip().lower().removeprefix("alveo-").removeprefix("alveo_").removeprefix("alveo ")
    if key not in BOARDS:
        raise UserError(f"unknown FPGA board {name!r}; known boards: {', '.join(sorted(BOARDS))}")
    return BOARDS[key]
