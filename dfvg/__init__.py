"""DFVG: Draft-on-FPGA, Verify-on-GPU lossless speculative decoding."""

__version__ = "0.1.0"
