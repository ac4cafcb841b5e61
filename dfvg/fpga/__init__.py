"""The FPGA draft engine: fixed-point datapath, board model, resource estimate and XRT driver.

`fixed_point` holds the bit-exact integer primitives (formats, rounding, LUTs) that the RTL in the
top-level `fpga/` folder is simulated against; the integer draft model is built from them.
"""
