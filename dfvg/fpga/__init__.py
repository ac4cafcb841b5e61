"""The FPGA draft engine, in three parts: `datapath/` (what the FPGA computes, bit-exactly, and the
`FpgaDrafter` that drafts with it), `board/` (the analytical model of an Alveo card: board facts, latency
and energy, resource estimate) and `xrt/` (the host driver that talks to a real card through XRT).

Dependencies point one way: `datapath.drafter` uses `board` for the modeled time of each block and `xrt`
for the real card; `board` and `xrt` import nothing from `datapath`. The RTL itself lives in the
top-level `fpga/` folder, checked bit for bit against `datapath.fixed_point`.
"""
