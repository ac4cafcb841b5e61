"""Greedy token trees as one captured step (`dfvg.gpu.tree_device`): lossless on the graph models of every
architecture (CPU: the same bodies replayed eagerly), the same tree and acceptance as the eager tree step,
the compacted cache, the tree attention of the fused kernel bit for bit against a chain (Triton's
interpreter here, the tensor cores on the GPU), and whole trees against plain decoding in bf16 on the GPU."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.drafter import TorchDrafter
from dfvg.engine import Engine
from dfvg.errors import UserError
from dfvg.generate import generate
from dfvg.gpu.graph_drafter import GraphDrafter
from dfvg.gpu.graphs import GraphVerifier
from dfvg.gpu.kernels import HAVE_TRITON
from dfvg.gpu.tree_device import DeviceTreeStep, tree_shape
from dfvg.gpu.tree_rows import TreeRows
from dfvg.sampling import SamplingParams
from dfvg.tree import TreeSpec, parse_tree_spec, static_nodes
from dfvg.verifier import TorchVerifier
from tests.conftest import save_checkpoint
from tests.interpreted import run_interpreted

ROOT = Path(__file__).resolve().parents[1]
PROMPT = list(range(2, 40))
SHAPES = ("1,1,1,1", "2,2,1", "3,1,2", "dynamic:8", "dynamic:16")


@pytest.fixture(scope="module", params=("llama", "qwen2", "qwen3"))
def arch_pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    save_checkpoint(root / "target", request.param, seed=1)
    save_checkpoint(root / "draft", request.param, seed=1, num_hidden_layers=1)  # shares the target's embeddings
    return root / "target", root / "draft"


def graph_engine(target_dir, draft_dir, cache_len: int = 96) -> tuple[Engine, GraphDrafter]:
    engine = Engine(GraphVerifier(load_model(target_dir), compile_blocks=False, cache_len=cache_len))
    drafter = GraphDrafter(load_model(draft_dir), engine.verifier.vocab_size, compile_blocks=False,
                           cache_len=cache_len)
    return engine, drafter


def test_tree_shapes_count_the_eager_trees_nodes():
    assert tree_shape(TreeSpec(branching=(2, 2, 1)), 4).candidates == static_nodes((2, 2, 1)) == 10
    assert tree_shape(TreeSpec(branching=(2, 2, 1)), 4).keep == 10
    dynamic = tree_shape(TreeSpec(budget=16), 4)
    assert (dynamic.depth, dynamic.candidates, dynamic.keep) == (4, TreeSpec(budget=16).max_candidates(4), 16)
    assert tree_shape(TreeSpec(budget=500), 2).keep == 4 + 16  # the budget is capped by what is grown


def test_tree_rows_mask_sees_committed_slots_and_ancestors():
    root = torch.tensor([3])
    rows = TreeRows(torch.tensor([3, 4, 5, 6]), root, torch.tensor([[3, 3], [4, 3], [5, 3], [4, 6]]))
    mask = rows.mask(8).int().tolist()
    assert mask == [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 1, 0, 0],
                    [1, 1, 1, 1, 1, 0, 1, 0]]


@pytest.mark.parametrize("spec", SHAPES)
def test_device_trees_are_lossless_and_decide_as_the_eager_tree(arch_pair, spec):
    """Same tokens as plain decoding, and the same accepted length per step as the eager tree step (the
    same tree, grown by the same rules; the last step differs only where the eager loop shortens its tree)."""
    target_dir, draft_dir = arch_pair
    expected = generate(TorchVerifier(load_model(target_dir)), PROMPT, 30).tokens
    for drafter_dir in (draft_dir, target_dir):
        engine, drafter = graph_engine(target_dir, drafter_dir)
        result = engine.decode(drafter, PROMPT, 30, k=4, tree=parse_tree_spec(spec))
        assert isinstance(list(engine.device_steps.values())[-1], DeviceTreeStep)
        assert result.tokens == expected
        eager = Engine(TorchVerifier(load_model(target_dir)))
        reference = eager.decode(TorchDrafter(load_model(drafter_dir), eager.verifier.vocab_size), PROMPT, 30,
                                 k=4, tree=parse_tree_spec(spec))
        got, want = ([s.num_accepted for s in r.steps][:-1] for r in (result, reference))
        assert got == want
        assert [s.num_drafted for s in result.steps] == [tree_shape(parse_tree_spec(spec), 4).keep] * len(got + [0])
    assert sum(got) > len(got)  # the target drafting for itself: most of every tree's depth is accepted


def test_device_tree_leaves_the_target_cache_as_plain_decoding_does(arch_pair):
    """The accepted paths' K/V are moved on the device to the slots plain decoding writes."""
    target_dir, draft_dir = arch_pair
    plain = TorchVerifier(load_model(target_dir))
    tokens = generate(plain, PROMPT, 23).tokens
    engine, drafter = graph_engine(target_dir, target_dir)
    assert engine.decode(drafter, PROMPT, 23, k=4, tree=parse_tree_spec("2,2,1")).tokens == tokens
    valid = len(PROMPT) + len(tokens) - 1
    for a, b in zip(plain.model.layers, engine.verifier.model.layers, strict=True):
        for name in ("k", "v"):
            torch.testing.assert_close(getattr(a.attention.kv_cache, name)[0, :valid],
                                       getattr(b.attention.kv_cache, name)[0, :valid], atol=1e-4, rtol=1e-4)


def test_trees_the_device_step_cannot_take_run_eagerly(arch_pair):
    """Sampling takes the eager tree step; a chain afterwards still takes its own captured step, and a second
    tree run reuses the captured tree."""
    target_dir, draft_dir = arch_pair
    engine, drafter = graph_engine(target_dir, draft_dir)
    spec = parse_tree_spec("2,2,1")
    sampled = engine.decode(drafter, PROMPT, 8, k=4, tree=spec, sampling=SamplingParams(1.0), seed=1)
    assert len(sampled.tokens) == 8 and engine.device_steps == {}
    engine.decode(drafter, PROMPT, 8, k=4, tree=spec)
    engine.decode(drafter, PROMPT, 8, k=4, tree=spec)
    engine.decode(drafter, PROMPT, 8, k=4)
    assert [type(s).__name__ for s in engine.device_steps.values()] == ["DeviceTreeStep", "DeviceStep"]


@pytest.mark.parametrize("max_new", [1, 12])
def test_a_prompt_too_short_for_the_device_tree_decodes_plainly_until_it_fits(arch_pair, monkeypatch, max_new):
    """Greedy: the first tokens as plain decoding makes them, then the device tree, never the eager tree
    (whose bf16 verify rounds differently from plain decoding); one result, equal to plain decoding."""
    target_dir, draft_dir = arch_pair
    engine, drafter = graph_engine(target_dir, draft_dir)
    spec, short = parse_tree_spec("2,2,1"), [5, 6]
    monkeypatch.setattr("dfvg.engine.tree_step", lambda *a, **k: pytest.fail("the eager tree step was built"))
    result = engine.decode(drafter, short, max_new, k=4, tree=spec)
    assert result.tokens == generate(TorchVerifier(load_model(target_dir)), short, max_new).tokens
    lead = tree_shape(spec, 4).depth + 1 - len(short)
    assert [s.num_drafted for s in result.steps][:lead] == [0] * min(lead, max_new)
    if max_new > lead:  # the device tree takes over exactly when the context fits it
        assert isinstance(list(engine.device_steps.values())[-1], DeviceTreeStep)
        assert result.steps[lead].num_drafted > 0
    else:
        assert len(result.steps) == max_new
    eos = result.tokens[:1]  # an EOS inside the plain lead ends the generation there, as plain decoding ends
    assert engine.decode(drafter, short, max_new, k=4, tree=spec, eos_ids=eos).tokens == eos


def test_a_too_short_prompt_is_checked_against_the_context_before_its_plain_lead(arch_pair):
    """The length check names the user's prompt and max_new_tokens, not the lengthened prompt of the tree part."""
    target_dir, draft_dir = arch_pair
    engine, drafter = graph_engine(target_dir, draft_dir)
    too_many = engine.context_limit - 1
    with pytest.raises(UserError, match=rf"prompt \(2 tokens\) \+ max_new_tokens \({too_many}\)"):
        engine.decode(drafter, [5, 6], too_many, k=4, tree=parse_tree_spec("2,2,1"))


def test_a_generation_continued_is_one_result():
    """GenerationResult.then: tokens and steps in order, the second part's prefill counted as decode time, its
    faults stamped with their step and time in the whole generation."""
    from dfvg.fallback import DraftFault
    from dfvg.generate import GenerationResult
    from dfvg.stats import StepRecord

    fault = DraftFault("fpga", "error", "boom", at_s=0.5, lost_s=0.1, fallback="target only", utc="", proposal=1,
                       step=1)
    step = StepRecord(num_drafted=0, num_accepted=0)
    first = GenerationResult([1, 2], [step, step], prefill_s=1.0, decode_s=2.0, warmup_s=0.5)
    rest = GenerationResult([3], [step, step], prefill_s=0.25, decode_s=4.0, stopped_by="eos", faults=[fault])
    joined = first.then(rest)
    assert joined.tokens == [1, 2, 3] and len(joined.steps) == 4 and joined.stopped_by == "eos"
    assert (joined.prefill_s, joined.decode_s, joined.warmup_s) == (1.0, 6.25, 0.5)
    assert (joined.faults[0].step, joined.faults[0].at_s) == (3, 3.5) and fault.step == 1


def tree_attention_failures(device: str) -> list[str]:
    """Rows of a tree attention launch that differ in any bit from the same query on a chain cache where the
    row's ancestors sit at their positions (what plain decoding of that path computes)."""
    from dfvg.gpu.decode_attention import attention
    from tests.test_gpu_fused import attention_programs

    torch.manual_seed(2)
    heads, kv_heads, hd, slots, root = 6, 2, 32, 256, 190  # positions cross the 64-slot split at 192
    kc, vc = (torch.randn(slots, kv_heads, hd).to(device, torch.bfloat16) for _ in range(2))
    parents = [-1, -1, 0, 0, 1, 2, 5, 6]
    chains: list[list[int]] = []
    for i, parent in enumerate(parents):
        chains.append(([] if parent < 0 else chains[parent]) + [root + 1 + i])
    depth = max(map(len, chains))
    ancestors = torch.tensor([[root] * depth] + [c + [root] * (depth - len(c)) for c in chains], device=device)
    pos = torch.tensor([root] + [root + len(c) for c in chains], device=device)
    q = torch.randn(len(parents) + 1, heads * hd).to(device, torch.bfloat16)
    dims = (heads, kv_heads, hd, 0, 1e-6)
    failures = []
    # as shipped (an item per node); every node in one item per split, 2 programs taking the items in turn
    for wanted, programs in ((None, None), (1, 2)):
        with attention_programs(wanted, programs):
            got = attention(q, kc, vc, pos, dims, (torch.tensor([root], device=device), ancestors))
        failures += [f"items {wanted}, programs {programs}: {f}"
                     for f in _chain_mismatches(got, q, kc, vc, pos, dims, chains, root)]
    return failures


def _chain_mismatches(got, q, kc, vc, pos, dims, chains, root) -> list[str]:
    """Rows of tree attention output `got` that differ from the same query on the chain of its ancestors."""
    from dfvg.gpu.decode_attention import attention

    failures = []
    for row, chain in enumerate([[]] + chains):
        chain_k, chain_v = kc.clone(), vc.clone()
        chain_k[root + 1 : root + 1 + len(chain)], chain_v[root + 1 : root + 1 + len(chain)] = kc[chain], vc[chain]
        want = attention(q[row : row + 1], chain_k, chain_v, pos[row : row + 1], dims)
        if not torch.equal(got[row], want[0]):
            failures.append(f"row {row}")
    return failures


def slot_write_failures(device: str) -> list[str]:
    """The QKV launch writes K/V at `slots` (a tree's nodes) exactly what it writes at the positions."""
    from dfvg.gpu.fused import qkv_rope
    from tests.test_gpu_fused import small_model

    model = small_model(32, device)
    model.setup_cache(1, 64)
    cfg, attn = model.config, model.layers[0].attention
    dims = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps)
    x = torch.randn(5, cfg.hidden_size).to(device, torch.bfloat16)
    pos, slots = torch.tensor([20, 21, 21, 22, 22], device=device), torch.tensor([20, 23, 30, 27, 25], device=device)
    kc, vc = (torch.zeros(64, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device) for _ in "kv")
    weights = (model.layers[0].attention_norm.weight, attn.wqkv.weight, attn.wqkv.bias)
    failures = []
    for row in range(5):  # each row alone at its position, then all rows at their slots
        qkv_rope(x[row:row + 1], *weights, pos[row:row + 1], model.rope_cos, model.rope_sin, kc, vc, dims)
        want_k, want_v = kc[pos[row]].clone(), vc[pos[row]].clone()
        qkv_rope(x, *weights, pos, model.rope_cos, model.rope_sin, kc, vc, dims, slots=slots)
        if not (torch.equal(kc[slots[row]], want_k) and torch.equal(vc[slots[row]], want_v)):
            failures.append(f"row {row}")
    return failures


def chunked_tree_failures() -> list[str]:
    """Under the interpreter, with one fused launch cut to 4 rows: a 7-node tree verifies in two chunks, and
    every row's logits equal one-row fused steps of the same tokens, fed one after another (the chain)."""
    from dfvg.gpu import fused
    from dfvg.gpu.graphs import GraphModel
    from tests.test_fpga_tree import ancestors
    from tests.test_gpu_fused import small_model

    fused.MAX_ROWS = 4
    gm = GraphModel(small_model(32, "cpu"), compile_blocks=False, fused_layers=True)
    gm.fused, root = True, 11  # the kernels run on CPU tensors in the interpreter
    gm.ensure_cache(64)
    tokens = torch.randint(0, 512, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    parents, nodes = [-1, -1, 0, 0, 1, 2, 4], tokens[12:19]
    chains = [ancestors(parents, i) for i in range(len(parents))]
    with torch.inference_mode():
        gm.forward(torch.tensor([tokens[:root]]), torch.arange(root))  # the committed prefix (block path)
        caches = [layer.attention.kv_cache for layer in gm.model.layers]
        snapshot = [(cache.k.clone(), cache.v.clone()) for cache in caches]
        slots = [[root] * 3] + [[root + 1 + a for a in c] + [root] * (3 - len(c)) for c in chains]
        rows = TreeRows(torch.arange(root, root + 8), torch.tensor([root]), torch.tensor(slots))
        pos = torch.tensor([root] + [root + len(c) for c in chains])
        got = gm.forward(torch.tensor([[tokens[root], *nodes]]), pos, tree=rows)
        failures = []
        for row, chain in enumerate([[]] + chains):
            for cache, (k, v) in zip(caches, snapshot, strict=True):
                cache.k.copy_(k)
                cache.v.copy_(v)
            for step, token in enumerate([tokens[root]] + [nodes[i] for i in chain]):
                want = gm.forward(torch.tensor([[token]]), torch.tensor([root + step]))
            if not torch.equal(got[row], want[0]):
                failures.append(f"row {row}")
    return failures


def interpreted(call: str) -> str:
    """The last line `call` (an expression on this module) prints under Triton's CPU interpreter."""
    return run_interpreted("tests.test_tree_device", call).splitlines()[-1]


@pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed (CUDA builds of torch ship it)")
def test_tree_kernels_equal_the_chain_under_triton_interpreter():
    assert interpreted("t.tree_attention_failures('cpu') + t.slot_write_failures('cpu')") == "[]"
    assert interpreted("t.chunked_tree_failures()") == "[]"


@pytest.mark.gpu
def test_tree_attention_equals_the_chain_on_gpu():
    if not torch.cuda.is_available() or not HAVE_TRITON:
        pytest.skip("needs a CUDA GPU with Triton")
    assert tree_attention_failures("cuda") == [] and slot_write_failures("cuda") == []


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ("2,2,1,1", "4,2,1,1", "dynamic:16", "dynamic:40", "4,4,4"))
def test_bf16_trees_equal_plain_decoding_on_gpu(spec):
    """Random bf16 weights (near-ties everywhere): a tree's output equals plain decoding token for token
    only if every node row is computed bit for bit as plain decoding computes it (dynamic:40 has 41 rows;
    4,4,4 has 85, verified in two fused chunks)."""
    if not torch.cuda.is_available() or not HAVE_TRITON:
        pytest.skip("needs a CUDA GPU with Triton")
    from tests.test_gpu_fused import small_model

    target = small_model(64, "cuda", layers=3)
    engine = Engine(GraphVerifier(target, compile_blocks=False, cache_len=512))
    drafters = [GraphDrafter(model, 512, compile_blocks=False, cache_len=512)
                for model in (small_model(64, "cuda", layers=1), copy.deepcopy(target))]  # a copy drafts itself
    assert engine.verifier.gm.fused and all(d.gm.fused for d in drafters)
    for drafter in drafters:
        accepted = 0
        for seed in range(3):
            prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(seed)).tolist()
            plain = engine.decode(None, prompt, 96, k=0).tokens
            result = engine.decode(drafter, prompt, 96, k=4, tree=parse_tree_spec(spec))
            assert result.tokens == plain
            accepted += sum(s.num_accepted for s in result.steps)
    assert accepted > 0  # the self-draft: node rows, not only the root's, were compared


def test_the_warm_up_of_a_short_prompt_captures_the_device_tree(arch_pair):
    """A prompt shorter than a deep tree takes: the warm-up decodes past the plain lead, so the tree's capture
    is not left to the timed run."""
    target_dir, draft_dir = arch_pair
    engine, drafter = graph_engine(target_dir, draft_dir)
    engine.warm_up([drafter], [5], [4], 32, tree=parse_tree_spec("1,1,1,1,1,1,1"))  # depth 7: a lead of 7 tokens
    assert any(isinstance(s, DeviceTreeStep) for s in engine.device_steps.values())
