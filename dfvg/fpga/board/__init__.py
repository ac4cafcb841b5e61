"""The board model: Alveo card facts (`boards`), the analytical latency/energy model of a draft block
(`latency`) and the resource estimate (`resources`). Every number here is `modeled`, `estimated` or
`assumed`; none is measured.

Does not own: the arithmetic or the drafter (`dfvg.fpga.datapath`, which imports this package, never the
reverse) or talking to a card (`dfvg.fpga.xrt`).
"""
