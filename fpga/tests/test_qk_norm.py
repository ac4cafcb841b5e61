"""Qwen3 qk-norm RTL (the rmsnorm kernel over head_dim int8 lanes) vs fixed_point.rmsnorm, bit for bit.

integer_model.py normalises each head of int8 q and k with fixed_point.rmsnorm; this runs test_rmsnorm's
checks (random vectors, edge cases, two constant sets) at the qk-norm sizes of rtl_kernels.py."""

from test_rmsnorm import rmsnorm_matches_python  # noqa: F401  (cocotb collects the imported test)
