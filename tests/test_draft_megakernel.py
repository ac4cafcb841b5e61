"""The GPU draft's block in one launch (dfvg.gpu.draft_megakernel) against the per-launch fused draft steps.

Both run the same work items with the same block sizes, so the drafts and every K/V value the block writes
must be equal bit for bit: under Triton's CPU interpreter (one launch per phase; a subprocess, as in
test_gpu_fused) and on a GPU (gpu marker: the persistent launch with its grid barriers, in a CUDA graph).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from dfvg.gpu.kernels import HAVE_TRITON
from dfvg.model import ModelConfig, Transformer
from tests.test_gpu_fused import interpreted


def draft_model(device: str, layers: int = 2, head_dim: int = 32, head_vocab: bool = True) -> Transformer:
    """A small Qwen2-shaped draft; with head_vocab, a 192-row head over a token subset and an embedding over
    the same rows (the distilled draft's layout, `dfvg.distill`)."""
    torch.manual_seed(1)
    cfg = ModelConfig(model_type="qwen2", vocab_size=512, hidden_size=4 * head_dim, intermediate_size=192,
                      num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=head_dim, attention_bias=True,
                      tie_word_embeddings=True, head_vocab_size=192 if head_vocab else None,
                      embed_rows=head_vocab)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    if head_vocab:
        ids = torch.randperm(500)[:192].sort().values  # some ids >= 480, the "target vocabulary" below
        model.head_token_ids.copy_(ids)
        model.token_rows.copy_(torch.searchsorted(ids, torch.arange(512)).clamp(max=191))
    return model.to(device=device, dtype=torch.bfloat16)


@contextlib.contextmanager
def block_sizes_of(configs: dict):
    """The per-launch fused steps with these block sizes (`block_sizes.TUNED`), as the block kernel has them."""
    from dfvg.gpu import block_sizes

    shipped = dict(block_sizes.TUNED)
    block_sizes.TUNED.update(configs)
    try:
        yield
    finally:
        block_sizes.TUNED.clear()
        block_sizes.TUNED.update(shipped)


def block_mismatches(device: str, steps: int, layers: int = 2, head_vocab: bool = True,
                     persistent: bool | None = None, replays: int = 1, gemv: str = "latency") -> list[str]:
    """Draft `steps` tokens after a 70-token context both ways (per-launch fused steps, then the one-launch
    block from the same cache) and list what differs: the drafts, or the K/V of the block's positions.
    persistent None: the product's path (`draft_body`); else the kernel with these options."""
    from dfvg.gpu import draft_megakernel
    from dfvg.gpu.graphs import GraphModel, draft_body

    model = draft_model(device, layers, head_vocab=head_vocab)
    gm = GraphModel(model, compile_blocks=False, fused_layers=True)
    gm.fused = True  # the interpreter runs the fused kernels on the CPU (fused.supported wants CUDA)
    gm.ensure_cache(160)
    ids = torch.randint(0, 480, (1, 70), device=device)
    with torch.inference_mode():
        gm.forward(ids[:, :68], torch.arange(68, device=device))
    state = torch.tensor([[ids[0, 68], ids[0, 69], 69]], device=device)
    caches = [layer.attention.kv_cache for layer in model.layers]
    history = [(c.k.clone(), c.v.clone()) for c in caches]
    results = []
    for enabled in (False, True):
        for c, (k, v) in zip(caches, history, strict=True):
            c.k.copy_(k)
            c.v.copy_(v)
        drafts = torch.zeros(1, steps, dtype=torch.long, device=device)
        with torch.inference_mode():
            for _ in range(replays):
                if not enabled:
                    draft_megakernel.ENABLED = False
                    try:
                        with block_sizes_of(draft_megakernel.gemv_configs(model, gemv)):
                            draft_body(gm, state, drafts, 480)
                    finally:
                        draft_megakernel.ENABLED = True
                elif persistent is None:
                    draft_body(gm, state, drafts, 480)
                else:
                    kernel = draft_megakernel.DraftMegakernel(model, steps, 480, gemv=gemv)
                    kernel(state, drafts, persistent)
        written = slice(68, 69 + steps)
        results.append((drafts.clone(), [(c.k[0, written].clone(), c.v[0, written].clone()) for c in caches]))
    (want, want_kv), (got, got_kv) = results
    problems = [] if torch.equal(want, got) else [f"drafts {got.tolist()} != {want.tolist()}"]
    problems += [f"layer {i} K/V" for i, (a, b) in enumerate(zip(want_kv, got_kv, strict=True))
                 if not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))]
    if want_kv[0][0].abs().sum() == 0 or (head_vocab and not set(want[0].tolist()) <= set(
            model.head_token_ids.tolist())):
        problems.append(f"the reference drafted nothing a head row maps to: {want.tolist()}")
    return problems


@pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed (CUDA builds of torch ship it)")
@pytest.mark.parametrize("head_vocab,gemv", [(True, "latency"), (False, "latency"), (True, "launch")])
def test_block_equals_per_launch_steps_under_triton_interpreter(head_vocab, gemv):
    call = f"[len(t.block_mismatches('cpu', 3, head_vocab={head_vocab}, persistent=False, gemv={gemv!r}))]"
    assert interpreted(call, module="test_draft_megakernel") == [0.0]


def test_block_refuses_caches_that_are_not_one_tensor():
    from dfvg.gpu import draft_megakernel
    from dfvg.model import KVCache

    model = draft_model("cpu")
    model.setup_cache(1, 64)
    cache = model.layers[1].attention.kv_cache
    model.layers[1].attention.kv_cache = KVCache(cache.k.clone(), cache.v.clone())
    with pytest.raises(ValueError, match="not slices of one tensor"):
        draft_megakernel.DraftMegakernel(model, 2, 512)


def test_block_says_which_models_it_cannot_run():
    from dfvg.gpu import draft_megakernel

    assert draft_megakernel.unsupported(draft_model("cpu")) is None
    assert "head_dim 16" in draft_megakernel.unsupported(draft_model("cpu", head_dim=16))


@pytest.mark.gpu
@pytest.mark.parametrize("steps,layers,head_vocab", [(1, 2, True), (4, 4, True), (6, 3, False)])
def test_block_equals_per_launch_steps_on_gpu(steps, layers, head_vocab):
    if not torch.cuda.is_available() or not HAVE_TRITON:
        pytest.skip("needs a CUDA GPU with Triton")
    assert block_mismatches("cuda", steps, layers, head_vocab) == []  # draft_body: a graph-free call
    for gemv in ("latency", "launch"):
        assert block_mismatches("cuda", steps, layers, head_vocab, True, 3, gemv) == []
    assert block_mismatches("cuda", steps, layers, head_vocab, persistent=False) == []


@pytest.mark.gpu
def test_block_in_a_replayed_graph_equals_per_launch_steps_on_gpu():
    """Through the drafter's captured graph, twice: the barrier's counter must be back at zero after each."""
    if not torch.cuda.is_available() or not HAVE_TRITON:
        pytest.skip("needs a CUDA GPU with Triton")
    from dfvg.gpu import draft_megakernel
    from dfvg.gpu.graphs import GraphDrafter, draft_graph
    from dfvg.sampling import SamplingParams

    model = draft_model("cuda", layers=4)
    context = torch.randint(0, 480, (90,)).tolist()
    blocks = []
    for enabled in (False, True):
        draft_megakernel.ENABLED = enabled
        try:
            drafter = GraphDrafter(model, 480, compile_blocks=False, cache_len=256)
            drafter.prefill(context[:60], 256)
            blocks.append([drafter.propose(context[:n], 5, SamplingParams(), None).tokens for n in (60, 61, 75, 90)])
        finally:
            draft_megakernel.ENABLED = True
    assert blocks[0] == blocks[1]
    graph = draft_graph(drafter.gm, 5, 480)  # many replays: a counter zeroed while a program still polls hangs
    first = graph.drafts.clone()
    for _ in range(300):
        graph.graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph.drafts, first)
    kernels = [v for v in drafter.gm.graphs.values() if isinstance(v, draft_megakernel.DraftMegakernel)]
    assert kernels and all(kernel.barrier.sum().item() == 0 for kernel in kernels)
