"""A GEMV launch that streams its weights while the launch before it drains (dfvg.gpu.fused.PREFETCH_COLUMNS,
dfvg.gpu.decode_attention.EARLY_TRIGGER): the L2 prefetch asks for exactly the program's own weights, the
launcher turns both on only where they can run, they compile for sm_90, and on a GPU neither changes a bit.

The prefetch itself is PTX (sm_90), which Triton's interpreter cannot run: the pieces it asks for come from
`gemv_stream._weight_pieces`, which runs here under the interpreter in a subprocess.
"""

from __future__ import annotations

import pytest
import torch

from dfvg.gpu.kernels import HAVE_TRITON
from tests.interpreted import run_interpreted

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed (CUDA builds of torch ship it)")

# (what, N rows of W, K, first row, second row or None, k_lo, k_len, BN, threads): programs of the 1.5B target's
# launches with their shipped block sizes (gate/up: a pair; down: split-K, first and last split; QKV: a v head's
# halves, whole and its last split; O and the LM head: the last block), and made-up ones whose spans and blocks do
# not divide evenly
CASES = [
    ("gate/up, last block", 2 * 8960, 1536, 8928, 8960 + 8928, 0, 1536, 32, 128),
    ("gate/up, first 512 columns", 2 * 8960, 1536, 0, 8960, 0, 512, 32, 128),
    ("down, split 0 of 8", 1536, 8960, 32, None, 0, 1152, 32, 128),
    ("down, split 7 of 8", 1536, 8960, 1504, None, 7 * 1152, 1152, 32, 128),
    ("qkv, last v head", 2048, 1536, 15 * 128 + 32, 15 * 128 + 96, 0, 1536, 32, 256),
    ("qkv, split 3 of 4", 2048, 1536, 15 * 128 + 32, 15 * 128 + 96, 3 * 384, 384, 32, 256),
    ("o proj, last block", 1536, 1536, 1520, None, 0, 1536, 16, 128),
    ("lm head, last block", 151936, 1536, 151872, None, 0, 1536, 64, 128),
    ("block past N", 100, 200, 96, None, 0, 200, 32, 128),
    ("pair past N", 2 * 40, 200, 32, 40 + 32, 0, 200, 16, 128),
    ("split past K", 64, 200, 16, None, 256, 128, 16, 128),  # a sweep's split-K can leave a last split empty
    ("uneven span", 64, 200, 16, None, 128, 128, 16, 128),
]

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from dfvg.gpu.gemv_stream import _weight_pieces

    @triton.jit
    def _pieces_kernel(offset_ptr, count_ptr, row0, row1, n_rows, K: tl.constexpr, k_lo, k_len, PAIR: tl.constexpr,
                       BN: tl.constexpr, THREADS: tl.constexpr):
        offset, count = _weight_pieces(row0, row1, n_rows, K, k_lo, k_len, PAIR, BN, THREADS)
        i = tl.arange(0, THREADS)
        tl.store(offset_ptr + i, offset)
        tl.store(count_ptr + i, count)


def piece_failures(cases: list[tuple] = CASES, shift: int = 0) -> list[str]:
    """Per case, what is wrong with the pieces: an element of the program's weights asked for not exactly once,
    an element outside them asked for, or a piece not in whole 16-byte units. `shift` moves the rows the kernel
    is given (not those wanted): the negative control."""
    failures = []
    for what, n_rows, k, row0, row1, k_lo, k_len, bn, threads in cases:
        offset = torch.zeros(threads, dtype=torch.int64)
        count = torch.zeros(threads, dtype=torch.int32)
        _pieces_kernel[(1,)](offset, count, row0 + shift, (row1 or 0) + shift, n_rows, k, k_lo, k_len,
                             PAIR=row1 is not None, BN=bn, THREADS=threads)
        span = range(k_lo, min(k_lo + k_len, k))
        rows = [r for first in (row0, row1) if first is not None for r in range(first, first + bn) if r < n_rows]
        wanted = {r * k + c for r in rows for c in span}
        asked = [o + j for o, c in zip(offset.tolist(), count.tolist(), strict=True) for j in range(c)]
        if len(asked) != len(set(asked)) or set(asked) != wanted:
            failures.append(f"{what}: {len(asked)} elements asked ({len(set(asked))} distinct), "
                            f"{len(wanted)} wanted, {len(set(asked) - wanted)} outside")
        if any(o % 8 or c % 8 for o, c in zip(offset.tolist(), count.tolist(), strict=True) if c):
            failures.append(f"{what}: a piece not in whole 16-byte units")
    return failures


def interpreted_failures(call: str) -> str:
    """`call` (an expression over this module as t) under Triton's interpreter: its failures, one per line, or
    'ok'."""
    return run_interpreted("tests.test_stream_ahead", f'"\\n".join({call}) or "ok"', timeout=600).strip()


@needs_triton
def test_the_prefetch_asks_for_exactly_the_programs_weights_under_triton_interpreter():
    assert interpreted_failures("t.piece_failures()") == "ok"


@needs_triton
def test_pieces_of_the_wrong_rows_or_misaligned_are_reported_under_triton_interpreter():
    """The check above can fail: the kernel given the next row instead of the wanted first one asks for one
    row too many at the end and misses one at the start; rows of 204 columns do not start on 16 bytes."""
    got = interpreted_failures("t.piece_failures(t.CASES[-1:], shift=1) + "
                               "t.piece_failures([('K = 204', 64, 204, 16, None, 0, 204, 16, 128)])")
    assert got.splitlines() == ["uneven span: 1152 elements asked (1152 distinct), 1152 wanted, 72 outside",
                                "K = 204: a piece not in whole 16-byte units"]


@needs_triton
def test_the_launcher_prefetches_only_under_pdl_with_aligned_rows(monkeypatch):
    """PREFETCH and TRIGGER need programmatic dependent launch (sm_90, a GPU) and their switch; the prefetch also
    whole 16-byte units from rows that start on 16 bytes (cp.async.bulk's rule): a weight view one element in,
    or K not a multiple of 8, gets none, and a column count is rounded down to a multiple of 8."""
    from dfvg.gpu import decode_attention, fused

    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    cfg = {"BN": 16, "BK": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
    weights = torch.zeros(65 * 64, dtype=torch.bfloat16)
    aligned, shifted = weights[:64 * 64].view(64, 64), weights[1:1 + 64 * 64].view(64, 64)
    odd_k = torch.zeros(64, 60, dtype=torch.bfloat16)

    def options(weight, pdl: bool, columns: int, trigger: bool, pair: bool = False, config: dict = cfg) -> tuple:
        monkeypatch.setattr(fused, "pdl_on", lambda device: pdl)
        monkeypatch.setattr(decode_attention, "pdl_on", lambda device: pdl)
        monkeypatch.setattr(fused, "PREFETCH_COLUMNS", columns)
        monkeypatch.setattr(decode_attention, "EARLY_TRIGGER", trigger)
        got = fused._launch_options(x, weight, config, pair, fused.TILE_ROWS)
        assert got["BT"] == fused.TILE_ROWS  # the launch's row-tile height, as `_tile_rows` chose it
        return got["PREFETCH"], got["TRIGGER"], got["THREADS"]

    assert options(aligned, True, 517, True) == (512, True, 128)
    assert options(shifted, True, 512, True) == (0, True, 128)
    assert options(odd_k, True, 512, False) == (0, False, 128)
    assert options(aligned, False, 512, True) == (0, False, 128)
    assert options(aligned, True, 0, False) == (0, False, 128)
    # a SwiGLU pair of 2 x 64 rows fits 128 threads (a piece each); 2 x 128 rows (a sweep's BN) would not
    assert options(aligned, True, 512, False, pair=True, config={**cfg, "BN": 64})[0] == 512
    assert options(aligned, True, 512, False, pair=True, config={**cfg, "BN": 128})[0] == 0


@needs_triton
def test_every_launch_compiles_its_prefetch_before_the_wait_and_its_trigger_after_the_loop():
    """gpu/compile_sm90.py --stream-ahead (sm_90, no GPU): each of the target's five GEMV launches has one bulk L2
    prefetch before griddepcontrol.wait and one launch_dependents after its last tensor-core instruction; the
    shipped build has no prefetch, and its trigger as shipped for 16-row tiles (`decode_attention.EARLY_TRIGGER`)."""
    from dfvg.gpu import decode_attention
    from dfvg.gpu.block_sizes import TUNED
    from tests.test_gpu_tools import compile_tool

    compile_sm90 = compile_tool(needs_triton=True)

    for shape in compile_sm90.LAUNCHES:
        for ahead in (True, False):
            ptx = compile_sm90.compiled_launch(16, shape, ahead).asm["ptx"]
            lines = ptx.splitlines()
            where = {name: [i for i, line in enumerate(lines) if name in line]
                     for name in ("cp.async.bulk.prefetch.L2", "griddepcontrol.wait", "griddepcontrol.launch_dep",
                                  "mma.sync")}
            if not ahead:
                assert not where["cp.async.bulk.prefetch.L2"], shape
                assert len(where["griddepcontrol.launch_dep"]) == decode_attention.EARLY_TRIGGER, shape
                continue
            [prefetch], [wait], [trigger] = (where[name] for name in
                                             ("cp.async.bulk.prefetch.L2", "griddepcontrol.wait",
                                              "griddepcontrol.launch_dep"))
            assert prefetch < wait < min(where["mma.sync"]) and trigger > max(where["mma.sync"]), (shape, TUNED[shape])


def launch_outputs(columns: int, trigger: bool, repeats: int = 20) -> list:
    """The 1.5B target's five GEMV launches at their real shapes and shipped block sizes (QKV + RoPE: a pair of
    half heads, split-K 4, writing a cache; O + residual; gate/up: a SwiGLU pair; down: split-K 8; the LM head),
    sharing one counter buffer over the repeats, at T = 1 and 5, with the switches given; asserts that the
    switches reach the launch."""
    from dfvg.gpu import decode_attention, fused

    shipped = fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER
    fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER = columns, trigger
    try:
        torch.manual_seed(0)

        def weights(*shape):
            return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02

        x, h = (torch.randn(5, k, device="cuda", dtype=torch.bfloat16) for k in (1536, 8960))
        wqkv, bqkv, wo, w13, w2, head = (weights(2048, 1536), weights(2048), weights(1536, 1536),
                                         weights(2 * 8960, 1536), weights(1536, 8960), weights(151936, 1536))
        g = torch.rand(1536, device="cuda", dtype=torch.bfloat16) + 0.5
        cos, sin = torch.rand(64, 128, device="cuda"), torch.rand(64, 128, device="cuda")
        kc, vc = (torch.zeros(64, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        counters = fused.new_counters("cuda")
        options = fused._launch_options(x, w2, fused.linear_config(1536, 8960), False, fused.TILE_ROWS)
        assert options["PREFETCH"] == columns // 8 * 8 and options["TRIGGER"] == trigger, options
        outs = []
        for _ in range(repeats):
            for rows in (1, 5):
                pos = torch.arange(40, 40 + rows, device="cuda")
                outs += [fused.qkv_rope(x[:rows], g, wqkv, bqkv, pos, cos, sin, kc, vc, (12, 2, 128, 8960, 1e-6),
                                        counters=counters), kc.clone(), vc.clone(),
                         fused.fused_linear(x[:rows], wo, residual=x[:rows], counters=counters),
                         fused.fused_linear(x[:rows], w13, norm=g, swiglu=True, counters=counters),
                         fused.fused_linear(h[:rows], w2, residual=x[:rows], counters=counters),
                         fused.fused_linear(x[:rows], head, norm=g, counters=counters)]
        torch.cuda.synchronize()
        return outs
    finally:
        fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER = shipped


def needs_sm90_pdl() -> None:
    """Skip where the switches cannot reach a launch: no CUDA GPU, no Triton, or no PDL (sm_90, Triton >= 3.3)."""
    if not torch.cuda.is_available() or not HAVE_TRITON:
        pytest.skip("needs a CUDA GPU with Triton")
    from dfvg.gpu.decode_attention import pdl_on

    if not pdl_on(torch.device("cuda")):
        pytest.skip("the weight prefetch and the early trigger need programmatic dependent launch (sm_90+)")


@pytest.mark.gpu
@pytest.mark.parametrize("columns,trigger", [(512, False), (0, True), (512, True), (8960, True)])
def test_streaming_ahead_changes_no_bit_of_the_targets_launches_on_gpu(columns, trigger):
    """The target's five GEMV launches, repeated with shared split-K counters, give the same bits (and cache
    writes) with the switches as without (a partial-column prefetch among them)."""
    needs_sm90_pdl()
    shipped = launch_outputs(0, False)
    ahead = launch_outputs(columns, trigger)
    assert all(torch.equal(a, b) for a, b in zip(shipped, ahead, strict=True))
    assert shipped[0].abs().sum() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("columns,trigger", [(512, True), (8960, True)])
def test_streaming_ahead_changes_no_bit_of_a_graphed_forward_on_gpu(columns, trigger):
    """The graphed forward (every launch of a layer, the attention merge's trigger among them; T = 1 and 5, two
    replays each) equals the one without the prefetch and the early triggers bit for bit."""
    needs_sm90_pdl()
    from dfvg.gpu import decode_attention, fused
    from dfvg.gpu.graphs import GraphModel, capture_graph
    from tests.test_gpu_fused import small_model

    gm = GraphModel(small_model(64, "cuda", layers=4), compile_blocks=False)
    gm.ensure_cache(256)
    shipped = fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER
    for rows in (1, 5):  # against no prefetch and no early trigger (each launch's at its exit)
        ids = torch.randint(0, 512, (1, rows), device="cuda")
        pos = torch.arange(100, 100 + rows, device="cuda")
        outs = []
        try:
            for switches in ((0, False), (columns, trigger)):
                fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER = switches
                graph, out = capture_graph(lambda ids=ids, pos=pos: gm.forward(ids, pos), gm.device)
                graph.replay()
                graph.replay()
                torch.cuda.synchronize()
                outs.append(out.clone())
        finally:
            fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER = shipped
        assert torch.equal(outs[0], outs[1]) and outs[0].abs().sum() > 0, rows


@needs_triton
def test_qkv_and_o_load_their_weights_before_the_wait_and_the_others_do_not():
    """gpu/compile_sm90.py with `fused.WEIGHTS_AHEAD` = 3 (sm_90, no GPU, the H100's table): QKV's and O's 3-step splits
    issue their weight loads (ld.global) before griddepcontrol.wait and run no cp.async loop; gate/up, down and the LM
    head (12, 35 and 6 steps) keep theirs, with nothing loaded before the wait; with it off, no launch loads early."""
    from dfvg.gpu import fused
    from dfvg.gpu.block_sizes import GPU_TABLES
    from tests.test_gpu_tools import compile_tool

    compile_sm90 = compile_tool(needs_triton=True)

    def early_loads(shape) -> tuple[int, int]:
        lines = compile_sm90.compiled_launch(16, shape, table=GPU_TABLES["H100"] | {
            (151936, 1536): compile_sm90.TUNED[(151936, 1536)]}).asm["ptx"].splitlines()
        wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
        return (sum("ld.global" in line for line in lines[:wait]),
                sum("cp.async.cg" in line or "cp.async.ca" in line for line in lines))

    shipped = fused.WEIGHTS_AHEAD
    try:
        fused.WEIGHTS_AHEAD = 3
        ahead = {compile_sm90.LAUNCHES[shape]: early_loads(shape) for shape in compile_sm90.LAUNCHES}
        fused.WEIGHTS_AHEAD = 0
        plain = {compile_sm90.LAUNCHES[shape]: early_loads(shape) for shape in compile_sm90.LAUNCHES}
    finally:
        fused.WEIGHTS_AHEAD = shipped
    for name in ("qkv + rope", "o proj + residual"):
        assert ahead[name][0] > 0 and ahead[name][1] == 0 and plain[name][1] > 0, (name, ahead, plain)
    assert all(ahead[name] == plain[name] for name in ahead if not name.startswith(("qkv", "o proj"))), (ahead, plain)
    assert all(loads == 0 for loads, _ in plain.values()), plain


def test_early_triggers_follow_their_row_bound(monkeypatch):
    """`decode_attention.early_trigger_on`: launches of up to EARLY_TRIGGER_ROWS rows trigger early (None: every row
    count), GEMVs up to GEMV_TRIGGER_ROWS, more rows do not, and nothing triggers without PDL or with EARLY_TRIGGER
    off."""
    from dfvg.gpu import decode_attention

    device = torch.device("cuda")
    monkeypatch.setattr(decode_attention, "pdl_on", lambda device: True)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER", True)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER_ROWS", 16)
    assert [decode_attention.early_trigger_on(device, rows) for rows in (1, 16, 17, 64)] == [True, True, False, False]
    monkeypatch.setattr(decode_attention, "GEMV_TRIGGER_ROWS", None)  # GEMVs have their own bound
    assert [decode_attention.early_trigger_on(device, 64, gemv) for gemv in (False, True)] == [False, True]
    monkeypatch.setattr(decode_attention, "GEMV_TRIGGER_ROWS", 16)
    assert not decode_attention.early_trigger_on(device, 17, True)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER_ROWS", None)
    assert decode_attention.early_trigger_on(device, 64)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER", False)
    assert not decode_attention.early_trigger_on(device, 1)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER", True)
    monkeypatch.setattr(decode_attention, "pdl_on", lambda device: False)
    assert not decode_attention.early_trigger_on(device, 1)


def recorded_triggers(monkeypatch, module, **kernels: str) -> dict:
    """Replace `module`'s kernels (name: attribute) by recorders of the TRIGGER each launch is given, under PDL with
    the early trigger on (no GPU: the arguments are checked, not the kernels); returns the name -> TRIGGER record."""
    from dfvg.gpu import decode_attention

    if not HAVE_TRITON:
        pytest.skip("Triton is not installed")
    launched = {}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.__setitem__(self.name, kwargs["TRIGGER"])

    for name, attribute in kernels.items():
        monkeypatch.setattr(module, attribute, Recorder(name))
    monkeypatch.setattr(decode_attention, "pdl_on", lambda device: True)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER", True)
    return launched


def test_attention_passes_the_split_and_merge_triggers_it_was_given(monkeypatch):
    """`decode_attention.attention` hands its split launch `SPLIT_TRIGGER_SPLITS` and its merge the trigger where
    launches of its rows trigger early (`early_trigger_on`), 0 and False where they do not: the launches are replaced
    by recorders (no GPU), so this checks the arguments, not the kernels."""
    from dfvg.gpu import decode_attention

    launched = recorded_triggers(monkeypatch, decode_attention, split="_attention_split_kernel",
                                 merge="_attention_combine_kernel")
    monkeypatch.setattr(decode_attention, "SPLIT_TRIGGER_SPLITS", 128)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER_ROWS", 16)
    dims = (4, 2, 32, 0, 1e-6)
    cache = torch.zeros(256, 2, 32, dtype=torch.bfloat16)
    for rows, trigger in ((1, True), (16, True), (17, False)):
        q, pos = torch.zeros(rows, 4 * 32, dtype=torch.bfloat16), torch.arange(100, 100 + rows)
        decode_attention.attention(q, cache, cache, pos, dims)
        assert launched == {"split": 128 if trigger else 0, "merge": trigger}, (rows, launched)
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER", False)
    decode_attention.attention(torch.zeros(1, 4 * 32, dtype=torch.bfloat16), cache, cache, torch.arange(100, 101), dims)
    assert launched == {"split": 0, "merge": False}, launched


def test_qkv_keeps_the_attentions_trigger_bound_and_the_other_gemvs_theirs(monkeypatch):
    """QKV's launch lets the attention split start early only up to the attention's bound (`EARLY_TRIGGER_ROWS`): the
    split is the launch after it. The GEMVs that a GEMV follows (O, gate/up, down: `fused_linear`) take
    `GEMV_TRIGGER_ROWS`. The kernels are replaced by recorders (no GPU): this checks the arguments."""
    from dfvg.gpu import decode_attention, fused

    launched = recorded_triggers(monkeypatch, fused, qkv="_qkv_rope_kernel", gemv="_linear_kernel")
    monkeypatch.setattr(decode_attention, "EARLY_TRIGGER_ROWS", 16)
    dims, bf16 = (4, 2, 32, 0, 1e-6), torch.bfloat16
    cache, table = torch.zeros(256, 2, 32, dtype=bf16), torch.zeros(256, 32)
    for gemv_bound, rows, expected in ((None, 16, (True, True)), (None, 17, (False, True)), (None, 64, (False, True)),
                                       (16, 17, (False, False)), (64, 17, (False, True))):
        monkeypatch.setattr(decode_attention, "GEMV_TRIGGER_ROWS", gemv_bound)
        x, pos = torch.zeros(rows, 64, dtype=bf16), torch.arange(100, 100 + rows)
        fused.qkv_rope(x, torch.ones(64, dtype=bf16), torch.zeros(8 * 32, 64, dtype=bf16), None, pos, table, table,
                       cache, cache, dims)
        fused.fused_linear(x, torch.zeros(32, 64, dtype=bf16))
        assert (launched["qkv"], launched["gemv"]) == expected, (gemv_bound, rows, launched)
