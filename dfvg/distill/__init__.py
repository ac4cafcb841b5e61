"""Distilling a small, FPGA-sized draft from a target: teacher data, head vocabulary, training, sizing."""
