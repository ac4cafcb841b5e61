"""Code variants of the target step timed side by side (gpu_rows.py's part 5): module switches of the fused layers
and block-size tables, each captured per (context, T) and replayed in alternating rounds, so drift hits every
variant alike; and whether each variant's logits equal the first one's bit for bit.

Why its own module: the variants are how a kernel change earns its place (a lease times it beside the shipped
step, then the default flips); gpu_rows.py keeps the step's cost, invariance and the cuBLAS physics.
"""

from __future__ import annotations

import torch

from benchmarks.gpu_speed import cuda_median_ms
from dfvg.gpu import block_sizes, decode_attention, fused
from dfvg.gpu.graphs import GraphModel, capture_graph

MODE_ROWS = (1, 5, 16, 17, 33, 48, 64)
ITEMS = (2, 4, 8)  # attention work items per SM timed beside the shipped count (`decode_attention.ITEMS_PER_SM`)
# the merge launch's (splits a step at a short context, else, columns a program) timed beside the shipped pieces
# (`decode_attention.COMBINE_*`)
# (8 and 16 columns: 2-4x the merge programs, for a long context, where 48 programs at T = 1 each merge 512 splits;
# 64, 128 and 256 splits a step: 8, 4 and 2 dependent steps of that merge, which ncu found latency bound; 256 ships)
MERGES = ((64, 64, 32), (16, 16, 32), (16, 64, 32), (16, 128, 32), (16, 256, 32), (16, 256, 128), (16, 256, 16),
          (16, 256, 8))
# cache slots a split of the attention's split launch timed beside the shipped 64 (`decode_attention.ATTENTION_SPLIT`):
# half the partial states to write and merge (3.3 MB a layer at a 32k context, T = 1); `gpu/compile_sm90.py
# --attention` fits 2 of its programs a SM against 4 at 64 slots, so the same K/V bytes in flight
SPLIT_SLOTS = (128,)
# programs a SM of the split launch timed beside the shipped 4 (`decode_attention.SPLIT_PROGRAMS_PER_SM`): 4 of the
# split's programs fit a SM (48 KiB of shared memory and 128 registers each, `compile_sm90.py --attention`), so 8
# dispatches twice those, the rest each waiting for a slot (8 was shipped until 2026-12-07); items are taken in
# turn, so the bits are the same
SPLIT_PROGRAMS = (8,)
TALL_TILES = (32, 64)  # row-tile heights timed beside the shipped one (`fused.TILE_ROWS`)
MODE_CONTEXTS = (512, 32704)  # (gpu_rows.py --mode-contexts replaces them)
# weight columns per row a GEMV program prefetches to L2 in the streaming-ahead modes: a third of a 1536-wide row,
# and all of every row (8960 covers the down projection's too)
PREFETCHES = (512, 8960)
# K steps a split `fused.WEIGHTS_AHEAD` covers in its modes: the H100/H200 table's QKV and O (split-K 4: 3 steps of 128)
AHEAD_STEPS = 3
# row counts up to which launches trigger early (`decode_attention.EARLY_TRIGGER_ROWS`), and live splits up to which the
# attention's split launch does (`decode_attention.SPLIT_TRIGGER_SPLITS`; 2 ** 20: at every context), in their modes
TRIGGER_ROWS, SPLIT_TRIGGER = 16, 128


def current_mode() -> dict:
    """The module switches as they are now (as shipped, outside `launch_modes`), with the shipped table."""
    return {"pdl": decode_attention.PDL, "table": "shipped", "share_kv": decode_attention.SHARE_KV,
            "split_programs": decode_attention.SPLIT_PROGRAMS_PER_SM, "tile_rows": fused.TILE_ROWS,
            "prefetch": fused.PREFETCH_COLUMNS, "trigger": decode_attention.EARLY_TRIGGER, "stack": fused.STACKED_PAIR,
            "early": fused.EPILOGUE_FIRST, "norm_in_producer": fused.NORM_IN_PRODUCER_ABOVE,
            "tall_above": fused.TALL_TILES_ABOVE, "items": decode_attention.ITEMS_PER_SM,
            "merge": (decode_attention.COMBINE_SHORT, decode_attention.COMBINE_SPLITS,
                      decode_attention.COMBINE_COLUMNS), "slots": decode_attention.ATTENTION_SPLIT,
            "loads_first": fused.RMS_LOADS_FIRST,
            "factored": fused.FACTORED_NORM, "factored_qkv": fused.FACTORED_QKV_NORM, "tma": fused.TMA_WEIGHTS,
            "ahead": fused.WEIGHTS_AHEAD, "trigger_rows": decode_attention.EARLY_TRIGGER_ROWS,
            "split_trigger": decode_attention.SPLIT_TRIGGER_SPLITS,
            "gemv_trigger_rows": decode_attention.GEMV_TRIGGER_ROWS,
            "merge_at_once": decode_attention.MERGE_HEAD_AT_ONCE}


def modes_of(tables: dict[str, list]) -> dict[str, dict]:
    """Code variants timed side by side: the module switches (PDL, shared K/V, the attention grid, the GEMVs'
    tile height) and a block-size table each. The first is the attention before the 2026-12-04 change; then
    the shipped code, other tables, taller row tiles (32 or 64 rows, with the shipped table and with each other
    table: with SWAP_AB the rows are the MMA's N side, though taller tiles measured slower there too), each table
    with a SWAP_AB entry with `fused.STACKED_PAIR` flipped (a swapped pair's two blocks as one MMA operand), the
    shipped step with `fused.EPILOGUE_FIRST` flipped (residual, bias, RoPE's tables loaded before the weight loop),
    with gate/up's RMSNorm its own, or done once by the O launch at every row count or over one row tile
    (`fused.NORM_IN_PRODUCER_ABOVE`: the two other than shipped, with `fused.FACTORED_NORM` off), with 16-row tiles
    for every launch or one tall tile for unnormalized swapped launches over 16 rows (`fused.TALL_TILES_ABOVE`,
    flipped), the attention's split launch aiming at other work items per SM (`decode_attention.ITEMS_PER_SM`:
    ITEMS), its merge launch in other pieces (`decode_attention.COMBINE_*`: MERGES; other bits, the same for every
    T), its splits over other cache slots (`decode_attention.ATTENTION_SPLIT`: SPLIT_SLOTS; other bits, alike), its
    programs a SM (`decode_attention.SPLIT_PROGRAMS_PER_SM`: SPLIT_PROGRAMS; the same bits),
    gate/up's RMSNorm factored across the O launch and gate/up (`fused.FACTORED_NORM`, flipped) and QKV's and
    the head's across the down launch and them (`fused.FACTORED_QKV_NORM`, flipped), RMSNorm's row loads issued
    together or one 512-column step after another (`fused.RMS_LOADS_FIRST`, flipped), and the GEMVs streaming ahead
    (`fused.PREFETCH_COLUMNS` of PREFETCHES, `decode_attention.EARLY_TRIGGER`: each, and together), and the swapped
    launches' weight tiles by TMA copies or per-thread loads (`fused.TMA_WEIGHTS`, flipped; the same bits)."""
    shipped = current_mode()
    modes = {"K/V per token, a split program per (kv, split, token)": {**shipped, "share_kv": False,
                                                                      "split_programs": None},
             "K/V shared, a split program per (kv, split, token)": {**shipped, "split_programs": None},
             f"K/V shared, {shipped['split_programs']} split programs per SM (shipped)": shipped}
    modes |= {f"shipped with the {name} block sizes": {**shipped, "table": name}
              for name in tables if name != "shipped"}
    modes |= {f"shipped with {rows}-row tiles": {**shipped, "tile_rows": rows} for rows in TALL_TILES}
    modes |= {f"{name} block sizes with {rows}-row tiles": {**shipped, "table": name, "tile_rows": rows}
              for name in tables if name != "shipped" for rows in TALL_TILES}
    stacked = "unstacked" if shipped["stack"] else "stacked"  # `fused.STACKED_PAIR` flipped, for SWAP_AB launches
    modes |= {f"{name} block sizes, swapped pairs {stacked}": {**shipped, "table": name, "stack": not shipped["stack"]}
              for name, rows in tables.items() if any(config.get("SWAP_AB") for _n, _k, config in rows)}
    first = "after its weight loop" if shipped["early"] else "before its weight loop"  # fused.EPILOGUE_FIRST flipped
    modes[f"shipped, each launch's epilogue inputs loaded {first}"] = {**shipped, "early": not shipped["early"]}
    norms = {None: "its own at every row count", 0: "done once by the O launch",  # fused.NORM_IN_PRODUCER_ABOVE
             16: "done once by the O launch over 16 rows"}
    modes |= {f"shipped, gate/up's RMSNorm {which}": {**shipped, "norm_in_producer": above, "factored": False}
              for above, which in norms.items() if above != shipped["norm_in_producer"]}  # (read with it unfactored)
    tall = {None: "16-row tiles at every row count", 16: "one tall tile over 16 rows",  # fused.TALL_TILES_ABOVE
            32: "one tall tile over 32 rows", 48: "one tall tile over 48 rows"}
    modes |= {f"shipped, unnormalized swapped launches in {which}": {**shipped, "tall_above": above}
              for above, which in tall.items() if above != shipped["tall_above"]}
    factored = "ffn norm not factored" if shipped["factored"] else \
        "ffn norm factored: O stores out * g and row sums, gate/up scales by 1/RMS"  # fused.FACTORED_NORM flipped
    modes[f"shipped, {factored}"] = {**shipped, "factored": not shipped["factored"]}
    qkv = "qkv norm not factored" if shipped["factored_qkv"] else \
        "qkv norm factored: down stores out * g and row sums, QKV and the head scale by 1/RMS"  # FACTORED_QKV_NORM
    modes[f"shipped, {qkv}"] = {**shipped, "factored_qkv": not shipped["factored_qkv"]}
    order = "one after another" if shipped["loads_first"] else "together"  # fused.RMS_LOADS_FIRST flipped
    modes[f"shipped, RMSNorm's row loads issued {order}"] = {**shipped, "loads_first": not shipped["loads_first"]}
    tiles = "per-thread loads" if shipped["tma"] else "TMA"  # fused.TMA_WEIGHTS flipped (with each other table too)
    modes[f"shipped, weights through {tiles}"] = {**shipped, "tma": not shipped["tma"]}
    modes |= {f"{name} block sizes, weights through {tiles}": {**shipped, "table": name, "tma": not shipped["tma"]}
              for name in tables if name != "shipped"}
    return modes | _attention_modes(shipped) | _ahead_modes(shipped)


def _attention_modes(shipped: dict) -> dict[str, dict]:
    """`modes_of`' attention switches, each other value beside the shipped one: work items per SM, the merge's
    pieces, the split's cache slots, a head merged at once (`decode_attention.MERGE_HEAD_AT_ONCE`, flipped) and the
    split launch's programs a SM."""
    modes = {f"shipped, attention aiming at {items} work items per SM": {**shipped, "items": items}
             for items in ITEMS if items != shipped["items"]}
    for short, splits, columns in (pieces for pieces in MERGES if pieces != shipped["merge"]):
        up_to = f" ({short} where a row's positions fill up to {short})" if short != splits else ""
        modes[f"shipped, attention merging {splits} splits a step{up_to}, {columns} columns a program"] = {
            **shipped, "merge": (short, splits, columns)}
    modes |= {f"shipped, attention splits of {slots} cache slots": {**shipped, "slots": slots}
              for slots in SPLIT_SLOTS if slots != shipped["slots"]}
    at_once = "its column pieces apart" if shipped["merge_at_once"] else "a head at once"  # MERGE_HEAD_AT_ONCE flipped
    modes[f"shipped, attention merge taking {at_once} where a row's splits fit one step"] = {
        **shipped, "merge_at_once": not shipped["merge_at_once"]}
    return modes | {f"shipped, {programs} split programs per SM": {**shipped, "split_programs": programs}
                    for programs in SPLIT_PROGRAMS if programs != shipped["split_programs"]}


def _ahead_modes(shipped: dict) -> dict[str, dict]:
    """`modes_of`' streaming-ahead modes: the early trigger flipped, the weight prefetch of each PREFETCHES width, and
    with the trigger;
    the early trigger with the attention's split launch triggering too (`decode_attention.SPLIT_TRIGGER_SPLITS`),
    the early trigger for launches of up to TRIGGER_ROWS rows (`decode_attention.EARLY_TRIGGER_ROWS`) alone and with
    the split's at contexts of up to SPLIT_TRIGGER splits; and QKV's and O's weights loaded before the wait
    (`fused.WEIGHTS_AHEAD` of AHEAD_STEPS), alone, with the early trigger, with the split's too, and with both
    bounded (the GEMVs' bound, `decode_attention.GEMV_TRIGGER_ROWS`, set alike); and the bound of the GEMVs but QKV (O,
    gate/up, down, the LM head) flipped alone."""
    ahead = {(0, True): "next launch triggered after the weight loop",
             (0, False): "each launch triggering the next at its exit"}
    for columns in PREFETCHES:
        ahead |= {(columns, False): f"first {columns} weight columns prefetched to L2 before the wait",
                  (columns, True): f"{columns}-column prefetch and early trigger"}
    modes = {f"shipped, {name}": {**shipped, "prefetch": prefetch, "trigger": trigger}
             for (prefetch, trigger), name in ahead.items()
             if (prefetch, trigger) != (shipped["prefetch"], shipped["trigger"])}
    later = {  # (fused.WEIGHTS_AHEAD, EARLY_TRIGGER, EARLY_TRIGGER_ROWS, SPLIT_TRIGGER_SPLITS): the name
        (0, True, None, 2 ** 20): "next launch triggered after the weight loop, the attention split's too",
        (0, True, TRIGGER_ROWS, 0): f"early trigger up to {TRIGGER_ROWS} rows",
        (0, True, TRIGGER_ROWS, SPLIT_TRIGGER): f"early trigger up to {TRIGGER_ROWS} rows, the split's up to "
                                                f"{SPLIT_TRIGGER} splits",
        (AHEAD_STEPS, False, None, 0): "QKV and O weights loaded before the wait",
        (AHEAD_STEPS, True, None, 0): "QKV and O weights before the wait, early trigger",
        (AHEAD_STEPS, True, None, 2 ** 20): "QKV and O weights before the wait, early trigger, the split's too",
        (AHEAD_STEPS, True, TRIGGER_ROWS, SPLIT_TRIGGER):
            f"QKV and O weights before the wait, early trigger up to {TRIGGER_ROWS} rows, the split's up to "
            f"{SPLIT_TRIGGER} splits"}
    keys = ("ahead", "trigger", "trigger_rows", "split_trigger")
    modes |= {f"shipped, {name}": {**shipped, **dict(zip(keys, switches, strict=True)),
                                   "gemv_trigger_rows": switches[2]}
              for switches, name in later.items() if switches != tuple(shipped[key] for key in keys)}
    if shipped["gemv_trigger_rows"] is None:  # O, gate/up and down over 16 rows at their exit, as QKV and attention
        modes["shipped, O, gate/up and down over 16 rows letting the next launch start only at their exit"] = {
            **shipped, "gemv_trigger_rows": TRIGGER_ROWS}
    else:
        modes["shipped, O, gate/up and down of any row count letting the next launch start after their weight loop"] = {
            **shipped, "gemv_trigger_rows": None}
    return modes


def _set_mode(mode: dict, tables: dict[str, list]) -> None:
    fused.TILE_ROWS = mode["tile_rows"]
    fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER = mode["prefetch"], mode["trigger"]
    fused.STACKED_PAIR, fused.EPILOGUE_FIRST = mode["stack"], mode["early"]
    fused.NORM_IN_PRODUCER_ABOVE, fused.TALL_TILES_ABOVE = mode["norm_in_producer"], mode["tall_above"]
    decode_attention.PDL, decode_attention.SHARE_KV = mode["pdl"], mode["share_kv"]
    decode_attention.SPLIT_PROGRAMS_PER_SM, decode_attention.ITEMS_PER_SM = mode["split_programs"], mode["items"]
    decode_attention.COMBINE_SHORT, decode_attention.COMBINE_SPLITS, decode_attention.COMBINE_COLUMNS = mode["merge"]
    decode_attention.ATTENTION_SPLIT = mode["slots"]
    fused.RMS_LOADS_FIRST, fused.FACTORED_NORM = mode["loads_first"], mode["factored"]
    fused.FACTORED_QKV_NORM, fused.TMA_WEIGHTS = mode["factored_qkv"], mode["tma"]
    fused.WEIGHTS_AHEAD, decode_attention.EARLY_TRIGGER_ROWS = mode["ahead"], mode["trigger_rows"]
    decode_attention.SPLIT_TRIGGER_SPLITS = mode["split_trigger"]
    decode_attention.GEMV_TRIGGER_ROWS = mode["gemv_trigger_rows"]
    decode_attention.MERGE_HEAD_AT_ONCE = mode["merge_at_once"]
    block_sizes.TUNED.clear()  # written, not `apply_tuned`: a mode's table is not a user's, which outranks a GPU's
    block_sizes.TUNED.update({(n, k): config for n, k, config in tables[mode["table"]]})


def launch_modes(gm: GraphModel, tables: dict[str, list], only: list[str] | None = None, rounds: int = 5,
                 contexts: tuple[int, ...] = MODE_CONTEXTS) -> list[dict]:
    """ms per step of each (mode, context, T), the median over alternating rounds (so drift hits every mode
    alike), and whether the mode's logits equal the first mode's bit for bit (most switches change which program
    computes a row, never how; other block sizes, merge widths and split widths may change the sums, alike for
    every T)."""
    vocab = gm.model.config.vocab_size
    modes = modes_of(tables)
    unknown = set(only or ()) - set(modes)
    if unknown:
        raise SystemExit(f"unknown launch mode(s) {sorted(unknown)}; known: {'; '.join(modes)}")
    modes = {name: mode for name, mode in modes.items() if not only or name in only}
    shipped = current_mode()
    graphs = {}
    try:
        for name, mode in modes.items():
            _set_mode(mode, tables)
            for context in contexts:
                for rows in MODE_ROWS:
                    torch.manual_seed(rows)
                    ids = torch.randint(0, vocab, (1, rows), device="cuda")
                    pos = torch.arange(context - rows, context, device="cuda")
                    graph, out = capture_graph(lambda ids=ids, pos=pos: gm.forward(ids, pos), gm.device)
                    graphs[name, context, rows] = graph, out, (ids, pos)  # the graph reads ids, pos: keep them
    finally:
        _set_mode(shipped, tables)
    times: dict = {key: [] for key in graphs}
    for _ in range(rounds):
        for key, (graph, _out, _inputs) in graphs.items():
            times[key].append(cuda_median_ms(graph.replay, 10))
    first = next(iter(modes))
    out = []
    for (name, context, rows), (graph, logits, _inputs) in graphs.items():
        graph.replay()
        reference_graph, reference, _ = graphs[first, context, rows]
        reference_graph.replay()  # (same tokens and positions: the cache holds the same K/V after either)
        ms, base = sorted(times[name, context, rows])[rounds // 2], sorted(times[first, context, rows])[rounds // 2]
        out.append({"mode": name, "block_sizes": modes[name]["table"], "tile_rows": modes[name]["tile_rows"],
                    "switches_as_shipped": _switches(modes[name]) == _switches(shipped),
                    "context": context, "T": rows, "ms": ms,
                    "ratio_to_first_mode": ms / base,
                    "logits_identical_to_first_mode": bool(torch.equal(logits, reference))})
        print(f"  {name:45s} context {context:5d} T={rows:2d}: {ms:.3f} ms ({ms / base:.3f}x the first mode), "
              f"logits identical: {out[-1]['logits_identical_to_first_mode']}", flush=True)
    return out


def _switches(mode: dict) -> dict:
    """A mode's module switches: everything but its block-size table."""
    return {key: value for key, value in mode.items() if key != "table"}


def fastest_table(modes: list[dict]) -> str:
    """The block-size table of the mode whose step is fastest at T = 1 + T = 5 (the whole step decides), among
    the modes whose switches are the shipped ones (a table is tuned for one tile height, and a faster switch
    must not make its mode's table look faster); the shipped table where none was timed."""
    cost: dict = {}
    for r in modes:
        if r["T"] in (1, 5) and r["switches_as_shipped"]:
            cost[r["mode"]] = cost.get(r["mode"], 0.0) + r["ms"]
    if not cost:
        return "shipped"
    best = min(cost, key=cost.get)
    return next(r["block_sizes"] for r in modes if r["mode"] == best)
