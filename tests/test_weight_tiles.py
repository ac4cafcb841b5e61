"""`fused.TMA_WEIGHTS` (`dfvg.gpu.weight_tiles`): the swapped, stacked launches take their weight tiles by TMA copies
through a descriptor. Same products in the same order, so every output must keep its bits, and every row of a T-row
launch must still equal its one-row launch."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dfvg.gpu.kernels import HAVE_TRITON
from tests.interpreted import run_interpreted
from tests.test_gpu_fused import fused_switch, invariance_failures, stack_passes, swapped_blocks

# `launch_outputs`' gate/up N, K, query heads, kv heads, head_dim: on a GPU the target's; in the interpreter small ones
SHAPES = {"cuda": (8960, 1536, 12, 2, 128), "cpu": (48, 256, 4, 2, 32)}


@contextlib.contextmanager
def counted_descriptors(on: bool):
    """`fused.TMA_WEIGHTS` set to `on` inside the block, with every launch swapped and stacked as on Hopper
    (`swapped_blocks`), yielding a list that grows by one per descriptor a launch built (so a check can tell the
    TMA path ran)."""
    from dfvg.gpu import fused

    built = []
    shipped = fused.weight_descriptor

    def counting(*args):
        built.append(args[1:])
        return shipped(*args)

    with swapped_blocks(), fused_switch("STACKED_PAIR", True), fused_switch("TMA_WEIGHTS", on), \
            fused_switch("weight_descriptor", counting):
        yield built


def launch_outputs(device: str) -> list[torch.Tensor]:
    """Every kind of swapped launch once, split-K 3 and 1, over 17 rows (two row tiles): QKV + RoPE (q, the K and V
    it wrote; also with two column chunks a head half, so a program's row within its head is not 0), RMSNorm +
    SwiGLU, SwiGLU on a factored norm's rows, O with bias and residual and its scaled output and block sums. On a GPU
    the target's shapes; in the interpreter small ones."""
    from dfvg.gpu import fused

    torch.manual_seed(9)
    rows = 17
    n, k, heads, kv_heads, hd = SHAPES[device]
    w13 = (torch.randn(2 * n, k) * k ** -0.5).to(device, torch.bfloat16)
    w_qkv = (torch.randn((heads + 2 * kv_heads) * hd, k) * k ** -0.5).to(device, torch.bfloat16)
    w_o = (torch.randn(k, k) * k ** -0.5).to(device, torch.bfloat16)
    g, x = (torch.rand(k) + 0.5).to(device, torch.bfloat16), (torch.randn(rows, k) * 3).to(device, torch.bfloat16)
    pos, cos, sin = torch.arange(20, 20 + rows, device=device), *(torch.randn(64, hd, device=device) for _ in "cs")
    outs = []
    for split in (3, 1):
        pick = {"SPLIT_K": split}
        for qkv_pick in (pick, {**pick, "BN": hd // 4}):  # (BN hd / 4: two chunks of a head's half)
            kc, vc = (torch.zeros(64, kv_heads, hd, device=device, dtype=torch.bfloat16) for _ in "kv")
            q = fused.qkv_rope(x, g, w_qkv, None, pos, cos, sin, kc, vc, (heads, kv_heads, hd, 0, 1e-6),
                               config=qkv_pick)
            outs += [q, kc, vc]
        out, scaled, sums = fused.linear_then_scaled(x, w_o, g, bias=g, residual=x, config=pick)
        outs += [fused.fused_linear(x, w13, norm=g, swiglu=True, config=pick), out, scaled, sums,
                 fused.fused_linear(scaled, w13, swiglu=True, row_sums=sums, config=pick)]
    return outs


def tma_checks(device: str) -> list[float]:
    """[outputs of `launch_outputs` whose bits differ between TMA and per-thread loads, kinds of descriptor the TMA
    run did not build (QKV's heads as groups, a stacked pair, a single block: 0 when every launch kind took TMA),
    descriptors the run with TMA off built (0), rows of T-row launches with TMA that differ from one-row launches
    (`invariance_failures`, T up to 20 on CPU, 64 on a GPU), rows of a 2-layer model's T-row pass whose logits
    differ from one-row passes, 1.0 if that pass's logits equal the per-thread loads' bit for bit]."""
    rows = 6 if device == "cpu" else 64
    heads = SHAPES[device][2] + 2 * SHAPES[device][3]  # `launch_outputs`' QKV weight: q, k and v heads
    run = stack_passes(device, rows, 200, seed=10)
    with torch.inference_mode():
        with counted_descriptors(False) as built_off:
            plain, plain_logits = launch_outputs(device), run([(0, rows)], 70)[0]
        with counted_descriptors(True) as built:
            described = launch_outputs(device)
            rows_differ = invariance_failures(device, 20 if device == "cpu" else 64, splits=(1, 3), swap=True)
            whole, alone = run([(0, rows)], 70)[0], run([(i, i + 1) for i in range(rows)], 70)[0]
    differ = sum(not torch.equal(a, b) for a, b in zip(plain, described, strict=True))
    missing = {(heads, True), (1, True), (1, False)} - {(groups, pair) for groups, pair, *_ in built}
    model_rows = sum(not torch.equal(whole[i], alone[i]) for i in range(rows))
    return [differ, len(missing), len(built_off), len(rows_differ), model_rows, float(torch.equal(whole, plain_logits))]


@pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed (CUDA builds of torch ship it)")
def test_tma_weight_tiles_change_no_bit_under_triton_interpreter():
    """Under the interpreter a descriptor's copy is a plain load, so what this checks is the descriptor itself: a
    block at the wrong group, half or row (a RoPE head's halves swapped, up read as gate, a head's second chunk read
    as its first) changes outputs (a descriptor read at group 0 for every QKV head: 6 outputs differ, checked by hand).
    Rows past a block's edge feed only columns no launch stores, so TMA's zero fill there is not visible."""
    checks = interpreted_checks("tma_checks")
    assert checks == [0, 0, 0, 0, 0, 1.0], checks


@pytest.mark.gpu
def test_tma_weight_tiles_change_no_bit_on_gpu():
    checks = gpu_checks(tma_checks)
    assert checks == [0, 0, 0, 0, 0, 1.0], checks


def interpreted_checks(name: str) -> list[float]:
    """This module's `name`('cpu') run under Triton's interpreter (a subprocess), as floats."""
    return list(map(float, run_interpreted("tests.test_weight_tiles", f"*t.{name}('cpu')", timeout=900).split()))


def gpu_checks(checks) -> list[float]:
    """checks('cuda'), or a skip without a CUDA GPU and Triton."""
    if not torch.cuda.is_available() or not HAVE_TRITON:
        pytest.skip("needs a CUDA GPU with Triton")
    return checks("cuda")


@contextlib.contextmanager
def weights_ahead(steps: int):
    """`fused.WEIGHTS_AHEAD` set to `steps` inside the block, every launch swapped and stacked as on Hopper, yielding a
    list of the AHEAD each launch took (so a check can tell the path ran)."""
    from dfvg.gpu import fused

    taken = []
    shipped = fused._weight_tiles

    def counting(*args):
        options = shipped(*args)
        taken.append(options["AHEAD"])
        return options

    with swapped_blocks(), fused_switch("STACKED_PAIR", True), fused_switch("WEIGHTS_AHEAD", steps), \
            fused_switch("_weight_tiles", counting):
        yield taken


def ahead_checks(device: str) -> list[float]:
    """`fused.WEIGHTS_AHEAD` (a split's weight tiles all loaded before the wait): [outputs of `launch_outputs` whose
    bits differ from the loop's, launches of that run that loaded none ahead (in the interpreter 0: all did, splits of
    1 or 2 steps of 128, the last split of 3 past K; on a GPU the 5 launches of 12 steps, split-K 1), launches of the
    run with it off that did (0), rows of T-row launches that differ from one-row launches (`invariance_failures`, 3
    steps a split and 1), rows of a 2-layer model's T-row pass whose logits differ from one-row passes, 1.0 if that
    pass's logits equal the loop's bit for bit]."""
    rows = 6 if device == "cpu" else 64
    run = stack_passes(device, rows, 200, seed=10)
    with torch.inference_mode():
        with weights_ahead(0) as taken_off:
            plain, plain_logits = launch_outputs(device), run([(0, rows)], 70)[0]
        with weights_ahead(3 if device == "cpu" else 4) as taken:
            ahead, launches = launch_outputs(device), list(taken)
            rows_differ = invariance_failures(device, 20 if device == "cpu" else 64, splits=(1, 3), swap=True)
            whole, alone = run([(0, rows)], 70)[0], run([(i, i + 1) for i in range(rows)], 70)[0]
    differ = sum(not torch.equal(a, b) for a, b in zip(plain, ahead, strict=True))
    model_rows = sum(not torch.equal(whole[i], alone[i]) for i in range(rows))
    return [differ, launches.count(0), sum(taken_off), len(rows_differ), model_rows,
            float(torch.equal(whole, plain_logits))]


@pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed (CUDA builds of torch ship it)")
def test_weights_loaded_ahead_change_no_bit_under_triton_interpreter():
    """A tile of the wrong K step (every step reading the split's first: 11 outputs and the model's logits differ,
    checked by hand) or the ahead path's products in another order changes outputs; an empty split (past K) must add
    nothing."""
    checks = interpreted_checks("ahead_checks")
    assert checks == [0, 0, 0, 0, 0, 1.0], checks


@pytest.mark.gpu
def test_weights_loaded_ahead_change_no_bit_on_gpu():
    checks = gpu_checks(ahead_checks)
    assert checks == [0, 5, 0, 0, 0, 1.0], checks


@pytest.mark.gpu
def test_weights_ahead_with_early_triggers_change_no_bit_of_a_graphed_forward_on_gpu():
    """The graphed forward with QKV's and O's weights loaded before the wait and every early trigger on at every row
    count and context (GEMVs after their weights, the attention's split and merge at once) equals the one with each
    launch triggering at its exit and no weights ahead, bit for bit, at T = 1, 5 and 64, two replays each (a launch
    that read what the one before had not yet written would differ); its launches take the ahead path."""
    from dfvg.gpu.decode_attention import pdl_on

    if not torch.cuda.is_available() or not HAVE_TRITON or not pdl_on(torch.device("cuda")):
        pytest.skip("needs a CUDA GPU with Triton and programmatic dependent launch (sm_90+)")
    from dfvg.gpu import decode_attention
    from dfvg.gpu.graphs import GraphModel, capture_graph
    from tests.test_gpu_fused import small_model

    gm = GraphModel(small_model(128, "cuda", layers=4), compile_blocks=False)
    gm.ensure_cache(256)
    for rows in (1, 5, 64):
        ids = torch.randint(0, 512, (1, rows), device="cuda")
        pos = torch.arange(100, 100 + rows, device="cuda")
        outs = []
        for steps, trigger in ((0, False), (3, True)):
            with weights_ahead(steps) as taken, fused_switch("EARLY_TRIGGER", trigger, decode_attention), \
                    fused_switch("EARLY_TRIGGER_ROWS", None, decode_attention), \
                    fused_switch("GEMV_TRIGGER_ROWS", None, decode_attention), \
                    fused_switch("SPLIT_TRIGGER_SPLITS", 2 ** 20 if trigger else 0, decode_attention):
                graph, out = capture_graph(lambda ids=ids, pos=pos: gm.forward(ids, pos), gm.device)
                graph.replay()
                graph.replay()
                torch.cuda.synchronize()
            outs.append(out.clone())
            assert any(taken) == bool(steps), (steps, taken)
        assert torch.equal(outs[0], outs[1]) and outs[0].abs().sum() > 0, rows


def test_weights_tma_cannot_describe_take_per_thread_loads():
    """`fused._weight_tiles`: a weight whose rows are not whole 16-byte units, or a launch that is not swapped, keeps
    the per-thread loads even with `TMA_WEIGHTS` on (TMA would refuse the descriptor at launch); so does every launch
    with `STACKED_PAIR` off, and a weight whose base is not 16-byte aligned."""
    from dfvg.gpu import fused

    cfg = {"BN": 64, "BK": 128, "SPLIT_K": 1, "SWAP_AB": 1}
    with fused_switch("TMA_WEIGHTS", True), fused_switch("weight_descriptor", lambda *args: "descriptor"):
        assert fused._weight_tiles(torch.empty(96, 256, dtype=torch.bfloat16), cfg, True, 1)["TMA"]
        assert not fused._weight_tiles(torch.empty(96, 260, dtype=torch.bfloat16), cfg, True, 1)["TMA"]
        assert not fused._weight_tiles(torch.empty(96, 256, dtype=torch.bfloat16), {**cfg, "SWAP_AB": 0}, True,
                                       1)["TMA"]
        assert not fused._weight_tiles(torch.empty(96, 256, dtype=torch.bfloat16), cfg, True, 5)["TMA"]
        assert not fused._weight_tiles(torch.empty(96 * 256 + 1, dtype=torch.bfloat16)[1:].view(96, 256), cfg, True,
                                       1)["TMA"]
        with fused_switch("STACKED_PAIR", False):
            assert not fused._weight_tiles(torch.empty(96, 256, dtype=torch.bfloat16), cfg, True, 1)["TMA"]
    assert not fused._weight_tiles(torch.empty(96, 256, dtype=torch.bfloat16), cfg, True, 1)["TMA"]  # shipped off
