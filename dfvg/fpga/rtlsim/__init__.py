"""The draft datapath run on the simulated RTL: every integer op of a token through `fpga/rtl/` in Icarus.

Owns: compiling and running the file-driven testbenches of `fpga/sim/` (`icarus`), one function per
datapath op that packs its operands into beats, runs its kernel and unpacks the result (`ops`), and the
draft model whose arithmetic all comes out of those simulations (`model`). Does not own the arithmetic's
definition (`dfvg.fpga.datapath.fixed_point`) nor the forward pass's structure (`integer_model`, which
the RTL model subclasses). The command line is `python -m dfvg.fpga.rtl_run`.
"""
