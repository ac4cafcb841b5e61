"""Board I/O: the XRT host driver for the draft kernel (`driver`), with a contract-checking simulator.

Does not own: the kernel's arithmetic (injected by `dfvg.fpga.datapath.drafter`, which uses this package;
this package never imports the datapath) or the board's modeled latency (`dfvg.fpga.board`).
"""
