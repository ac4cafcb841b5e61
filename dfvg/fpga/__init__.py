"""The FPGA draft engine: fixed-point datapath, board model, resource estimate and XRT driver."""
