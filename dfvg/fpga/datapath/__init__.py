"""The FPGA datapath: what the draft kernel computes, bit for bit, and the drafter that runs it.

Owns: the fixed-point primitives the RTL in `fpga/rtl/` matches (`fixed_point`), the quantizer from a float
draft to integer weights and multipliers (`quantize`), the versioned artifact on disk (`artifact`), the
integer forward pass with its int8 KV cache (`integer_model`) and `FpgaDrafter` (`drafter`), which drafts
on the emulated datapath or a real card; a feature head's quantizer (`head_quantize`), integer forward pass
(`head_model`) and drafter (`feature_drafter`); token trees of both (`tree_drafter`). Does not own: the
board's latency, energy and resources (`dfvg.fpga.board`; the drafters only read the modeled block time
from it) or the XRT protocol (`dfvg.fpga.xrt`).
"""
