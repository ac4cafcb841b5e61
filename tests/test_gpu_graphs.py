"""dfvg.gpu.graphs / dfvg.gpu.fast: the functional forward and the device-resident loop agree with the eager
engine. On CPU the "graphs" are plain replays of the same bodies; gpu-marked tests capture real CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from dfvg.checkpoint import config_from_dict, convert_state_dict
from dfvg.drafter import TorchDrafter
from dfvg.engine import Engine
from dfvg.generate import generate
from dfvg.gpu.graph_drafter import GraphDrafter
from dfvg.gpu.graphs import PREFILL_CHUNK, GraphModel, GraphVerifier, graph_prefill
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.conftest import hf_config

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tiny(arch: str, seed: int, dtype=torch.float32, device="cpu", **overrides) -> Transformer:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(hf_config(arch, **overrides), dtype=torch.float32)
    cfg = config_from_dict(hf.config.to_dict())
    model = Transformer(cfg)
    model.load_state_dict(convert_state_dict(dict(hf.state_dict()), cfg))
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_functional_forward_matches_model(arch):
    model = tiny(arch, 0)
    gm = GraphModel(model, compile_blocks=False)
    gm.ensure_cache(40)
    ids = torch.randint(0, 96, (1, 9))
    with torch.inference_mode():
        want = model(ids, torch.arange(9)[None])[0]
        got = torch.cat([gm.forward(ids[:, :6], torch.arange(6)), gm.forward(ids[:, 6:], torch.arange(6, 9))])
    assert torch.allclose(got, want, atol=1e-4)


def test_a_bigger_cache_frees_the_old_store_first_and_drops_its_graphs():
    """Every layer's K/V is one tensor (`Transformer.kv_store`): the graph model keeps only a weak reference to
    it, so a reallocation (a longer prompt) never holds the old store and the new one at once."""
    import weakref

    model = tiny("qwen2", 0)
    gm = GraphModel(model, compile_blocks=False)
    gm.ensure_cache(16)
    first, old = gm._cache_id, weakref.ref(model.kv_store)
    gm.graphs["x"] = ("a graph over the old store", None)
    gm.ensure_cache(8)  # fits: nothing changes
    assert gm._cache_id == first and "x" in gm.graphs and old() is model.kv_store
    gm.ensure_cache(64)
    assert old() is None and gm._cache_id == first + 1 and gm.graphs == {}
    assert model.layers[-1].attention.kv_cache.k.shape[0:2] == (1, gm.cache_len)


@pytest.mark.parametrize("length", [1, 16, 37, 64, 70])
def test_graph_prefill_fills_the_cache_like_eager_feed(length):
    """64-token chunks through one T=64 token graph (last chunk padded) leave the cache eager feed leaves."""
    model = tiny("qwen2", 0)
    gm = GraphModel(model, compile_blocks=False)
    gm.ensure_cache(150)
    ids = torch.randint(0, 96, (length + 1,)).tolist()
    with torch.inference_mode():
        want = model(torch.tensor([ids]), torch.arange(length + 1)[None])[0, -1]
        graph_prefill(gm, ids[:-1])
        got = gm.forward(torch.tensor([ids[-1:]]), torch.tensor([length]))[0]
    assert torch.allclose(got, want, atol=1e-4)
    assert gm.graph_key(("runner", PREFILL_CHUNK, True)) in gm.graphs  # one graph served every chunk


def test_graph_prefill_near_the_end_of_the_cache_takes_the_same_forward(monkeypatch):
    """A padded chunk that would run into the scratch slots is fed through `GraphModel.forward`, unpadded (on
    the GPU the same fused rows as the graph), never through the model's eager feed: the prompt's K/V must
    not depend on how large a run made its cache."""
    model = tiny("qwen2", 0)
    gm = GraphModel(model, compile_blocks=False)
    gm.ensure_cache(100)  # the second 64-row chunk (positions 64..127) would reach past scratch_pos = 100
    ids = torch.randint(0, 96, (91,)).tolist()
    monkeypatch.setattr(model, "feed", lambda *a, **k: pytest.fail("graph_prefill fed the model eagerly"))
    with torch.inference_mode():
        want = model(torch.tensor([ids]), torch.arange(91)[None])[0, -1]
        graph_prefill(gm, ids[:-1])
        got = gm.forward(torch.tensor([ids[-1:]]), torch.tensor([90]))[0]
    assert torch.allclose(got, want, atol=1e-4)


@pytest.fixture(scope="module")
def pair():
    return tiny("qwen2", 1), tiny("qwen2", 2, num_hidden_layers=1, hidden_size=32, intermediate_size=48)


@pytest.mark.parametrize("k,self_draft", [(0, False), (3, False), (4, True)])
def test_device_step_equals_host_step(pair, k, self_draft):
    target, draft = pair
    verifier = GraphVerifier(target, compile_blocks=False, cache_len=96)
    drafter = GraphDrafter(target if self_draft else draft, 96, compile_blocks=False, cache_len=96) if k else None
    engine = Engine(verifier)
    for length in (2, 7, 1):
        ids = torch.randint(2, 96, (length,)).tolist()
        want = generate(TorchVerifier(target), ids, 25).tokens
        result = engine.decode(drafter, ids, 25, k=k)
        assert result.tokens == want
        if self_draft:
            assert result.stats()["acceptance_rate"] == 1.0  # the drafter is the target: all accepted


def test_device_step_stops_at_eos(pair):
    target, draft = pair
    ids = [5, 9, 11]
    free = generate(TorchVerifier(target), ids, 20).tokens
    eos = free[6]
    engine = Engine(GraphVerifier(target, False, 64))
    got = engine.decode(GraphDrafter(draft, 96, False, 64), ids, 20, k=3, eos_ids=[eos])
    assert got.tokens == free[: free.index(eos) + 1] and got.stopped_by == "eos"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, cuda])])
@pytest.mark.parametrize("k", [0, 3])
def test_the_lookahead_replay_changes_no_token(monkeypatch, k, device):
    """`fast.LOOKAHEAD`: the device step launches the next replay before the host reads this one's record. The
    tokens equal those without it over consecutive generations on one engine: one with room to spare, one run up
    to the scratch slots (a 64-slot run: with drafts its last step has no room for another, which needs 2k + 2
    positions past the committed ones; plain decoding's k + 1 reserve always leaves room), one that stops at EOS.
    It does launch ahead: one replay more than it reads in each generation whose last step had room (counted on
    the CPU, where every replay runs the step's body; on a GPU the captured graph replays, with a pinned copy). The
    room check is a precaution (past it a replay would write scratch slots, which nothing reads), so only the
    counts guard it; reading the live record instead of the copy, or keeping a replay across a prefill, changes
    tokens."""
    from dfvg.gpu import fast

    # models of their own: a model keeps the largest cache any test gave it, and the scratch slots must sit at 64
    target = tiny("qwen2", 1, device=device)
    draft = tiny("qwen2", 2, device=device, num_hidden_layers=1, hidden_size=32, intermediate_size=48)
    free = generate(TorchVerifier(target), [5, 9, 11], 20).tokens
    jobs = (([5, 9, 11], 20, ()), ([7, 3], 64 - 2 - k - 1, ()), ([5, 9, 11], 20, (free[9],)))
    replays = []
    body = fast.step_body
    monkeypatch.setattr(fast, "step_body", lambda *args: (replays.append(1), body(*args))[1])

    def run(lookahead: bool) -> tuple[list, list[int]]:
        monkeypatch.setattr(fast, "LOOKAHEAD", lookahead)
        engine = Engine(GraphVerifier(target, compile_blocks=False, cache_len=64))
        drafter = GraphDrafter(draft, 96, compile_blocks=False, cache_len=64) if k else None
        outputs, counts = [], []
        for ids, n, eos in jobs:
            replays.clear()
            result = engine.decode(drafter, ids, n, k=k, eos_ids=eos)
            outputs.append((result.tokens, result.stopped_by))
            counts.append(len(replays) - len(result.steps))
        return outputs, counts

    (ahead, ahead_counts), (plain, counts) = run(True), run(False)
    assert ahead == plain
    if device == "cpu":
        assert ahead_counts == [1, 0 if k else 1, 1] and counts == [0, 0, 0]


def test_graph_protocol_classes_in_reference_loop(pair):
    target, draft = pair
    verifier, drafter = GraphVerifier(target, False, 64), GraphDrafter(draft, 96, False, 64)
    ids = [3, 4, 5, 6]
    want = generate(TorchVerifier(target), ids, 20, drafter=TorchDrafter(draft), draft_length=3)
    got = generate(verifier, ids, 20, drafter=drafter, draft_length=3)
    assert got.tokens == want.tokens
    assert [s.num_accepted for s in got.steps] == [s.num_accepted for s in want.steps]
    sampled = generate(verifier, ids, 12, drafter=drafter, draft_length=3, sampling=SamplingParams(0.8), seed=3)
    ref = generate(TorchVerifier(target), ids, 12, drafter=TorchDrafter(draft), draft_length=3,
                   sampling=SamplingParams(0.8), seed=3)
    assert sampled.tokens == ref.tokens


@pytest.fixture(scope="module")
def cuda_pair():
    """fp32 target and draft on the GPU, so rounding cannot flip a token against the eager engine."""
    target = tiny("qwen2", 1, device="cuda")
    return target, tiny("qwen2", 2, device="cuda", num_hidden_layers=1, hidden_size=32, intermediate_size=48)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("compile_blocks", [False, True])
def test_cuda_graphs_match_eager_on_gpu(cuda_pair, compile_blocks):
    """Graph replays (single sequence) must give the eager engine's tokens."""
    target, draft = cuda_pair
    verifier = GraphVerifier(target, compile_blocks, 128)
    drafter = GraphDrafter(draft, 96, compile_blocks, 128)
    engine = Engine(verifier)
    for k in (0, 4):
        for length in (3, 17):
            ids = torch.randint(2, 96, (length,)).tolist()
            want = generate(TorchVerifier(target), ids, 30).tokens
            assert engine.decode(drafter if k else None, ids, 30, k=k).tokens == want
    ids = [4, 5, 6, 7]
    loop = generate(verifier, ids, 30, drafter=drafter, draft_length=3).tokens
    assert loop == generate(TorchVerifier(target), ids, 30).tokens


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("compile_blocks", [False, True])
def test_device_batch_matches_eager_on_gpu(cuda_pair, compile_blocks):
    """A batch's captured step (B = 3, plain and k = 4) gives each row's eager tokens."""
    target, draft = cuda_pair
    engine = Engine(GraphVerifier(target, compile_blocks, 128))
    prompts = [torch.randint(2, 96, (n,)).tolist() for n in (3, 17, 8)]
    want = [generate(TorchVerifier(target), p, 30).tokens for p in prompts]
    drafters = engine.batch_drafters(lambda: GraphDrafter(draft, 96, compile_blocks, 128), 3, SamplingParams())
    for k, rows in ((0, [None] * 3), (4, drafters)):
        assert [r.tokens for r in engine.decode_batch(rows, prompts, 30, k=k)] == want
    assert len(engine.device_rows) == 2


def test_blocks_past_the_acceptance_kernel_fall_back_to_host_verification(pair):
    """k + 1 > 16 rows (adaptive k_max = 16) exceeds the Triton acceptance kernel: no device step and no captured
    verify-and-accept for such a block, the host verify instead, and still plain decoding's tokens."""
    from dfvg.gpu.fast import fits_device_step
    from dfvg.gpu.graphs import VERIFY_ROWS, verify_greedy

    target, draft = pair
    verifier, drafter = GraphVerifier(target, False, 96), GraphDrafter(target, 96, False, 96)
    assert VERIFY_ROWS == 16
    assert fits_device_step(verifier, drafter, 5, 15) and not fits_device_step(verifier, drafter, 5, 16)
    verifier.prefill([3, 4, 5], 64)
    assert verify_greedy(verifier, [3, 4, 5], [0] * 16) is None and verify_greedy(verifier, [3, 4, 5], [0] * 15)
    ids = [3, 4, 5, 6]
    want = generate(TorchVerifier(target), ids, 40).tokens
    got = Engine(verifier).decode(drafter, ids, 40, k=20)
    assert got.tokens == want and got.stats()["acceptance_rate"] == 1.0


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_rows_forward_matches_each_row_alone(arch):
    """B rows at their own positions, in their own cache rows, compute what each row computes alone; right
    padding of the shorter rows (positions past their tokens) is never attended to."""
    model = tiny(arch, 0)
    gm = GraphModel(model, compile_blocks=False)
    gm.ensure_cache(40, rows=3)
    seqs = [torch.randint(0, 96, (n,)) for n in (9, 4, 12)]
    width = max(len(s) for s in seqs) - 2
    with torch.inference_mode():
        want = torch.stack([model.feed(s.tolist(), 0)[-2:] for s in seqs])  # each alone, in cache row 0
        ids = torch.stack([torch.cat([s[:-2], s[:1].expand(width - len(s) + 2)]) for s in seqs])
        gm.forward_rows(ids, torch.arange(width).expand(3, -1).contiguous())
        last_two = torch.stack([s[-2:] for s in seqs])
        positions = torch.stack([torch.arange(len(s) - 2, len(s)) for s in seqs])
        got = gm.forward_rows(last_two, positions)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("k", [0, 3])
def test_device_batch_equals_plain_decoding_per_row(pair, k):
    """A batch on graph models is one device replay per step; every row equals its own plain decoding,
    rows that stop early (EOS) are retired in place while the others go on."""
    target, draft = pair
    prompts = [[5, 9, 11], list(range(2, 30)), [7, 8], [40, 41, 42, 43, 44]]
    free = [generate(TorchVerifier(target), p, 24).tokens for p in prompts]
    eos = free[0][5]
    want = [generate(TorchVerifier(target), p, 24, eos_ids=[eos]).tokens for p in prompts]
    assert len(want[0]) == 6 and any(len(w) == 24 for w in want)
    engine = Engine(GraphVerifier(target, False, 96))
    drafters = engine.batch_drafters(lambda: GraphDrafter(draft, 96, False, 96), len(prompts), SamplingParams()) \
        if k else [None] * len(prompts)
    results = engine.decode_batch(drafters, prompts, 24, k=k, eos_ids=[eos])
    assert [r.tokens for r in results] == want
    assert list(engine.device_rows) == [(id(drafters[0]), k, len(prompts))]  # the device path ran
    if k:
        assert len({len(r.steps) for r in results}) > 1  # rows accepted different numbers of drafts


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_long_prompt_prefills_in_one_causal_pass_like_the_chunked_feed(arch, monkeypatch):
    """A prompt of `LONG_PROMPT` tokens or more on the fused path runs in one eager pass whose attention reads
    only the prompt's own slots (`run_layers(causal_prefix=True)`). Here the path is forced on a CPU model
    (the fused flag set, LONG_PROMPT lowered): the cache and the written features must be what the chunked feed
    writes (fp32, different kernels: within 1e-4), for caches of two sizes, and the next token's logits too."""
    import dfvg.gpu.graphs as graphs

    model = tiny(arch, 1)
    tokens = torch.randint(0, 96, (40,)).tolist()
    with torch.inference_mode():
        model.setup_cache(1, 64)
        want_logits = model.feed(tokens, 0)[-1]
        want_store = model.kv_store[:, :, :, :40].clone()
        want_features = model.norm(model.run_layers(model.embed(torch.tensor([tokens])), torch.arange(40)[None])[0])
    monkeypatch.setattr(graphs, "LONG_PROMPT", 32)
    for cache in (48, 200):
        gm = GraphModel(model, compile_blocks=False)
        gm.ensure_cache(cache)
        gm.keep_features()
        gm.fused = True  # the path a CUDA model takes; nothing below launches a fused kernel
        monkeypatch.setattr(graphs, "graph_prefill", lambda *a: pytest.fail("a long prompt took the chunked path"))
        gm.prefill(tokens[:-1])
        gm.fused = False
        with torch.inference_mode():
            got_logits = gm.forward(torch.tensor([tokens[-1:]]), torch.tensor([39]))[-1]
        assert torch.allclose(model.kv_store[:, :, :, :40], want_store, atol=1e-4)
        assert torch.allclose(gm.features[:40], want_features, atol=1e-4)
        assert torch.allclose(got_logits, want_logits, atol=1e-4)
        assert int(got_logits.argmax()) == int(want_logits.argmax())
