"""Token trees on the FPGA datapath (`dfvg.fpga.datapath.tree_drafter`): the exact integer top-k, tree rows
bit for bit equal to the chain's, lossless greedy decoding (library and CLI, int8 and int4, every family),
modeled board time per tree, and one-line refusals for what the datapath's trees cannot do."""

from __future__ import annotations

import json

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.cli import main
from dfvg.drafter import TorchDrafter
from dfvg.engine import Engine
from dfvg.errors import UserError
from dfvg.fpga.board.latency import softmax_time_s, topk_time_s
from dfvg.fpga.datapath.drafter import FpgaDrafter, draft_block
from dfvg.fpga.datapath.fixed_point import argmax_lowest, topk_lowest
from dfvg.fpga.datapath.tree_drafter import DatapathTreeDrafter
from dfvg.generate import generate
from dfvg.sampling import SamplingParams
from dfvg.tree import TreeSpec, parse_tree_spec
from dfvg.tree_step import tree_step
from dfvg.verifier import TorchVerifier
from tests.conftest import save_checkpoint

PROMPT = [5, 9, 14, 3, 22, 41, 7]


def test_topk_lowest_ranks_values_then_lower_indices():
    assert topk_lowest(torch.tensor([3, 7, 7, 1]), 3).tolist() == [1, 2, 0]
    x = torch.randint(-6, 6, (200, 37), generator=torch.Generator().manual_seed(0))  # many ties
    assert torch.equal(topk_lowest(x, 1)[:, 0], argmax_lowest(x))
    for row, got in zip(x.tolist(), topk_lowest(x, 5).tolist(), strict=True):
        assert got == sorted(range(len(row)), key=lambda i: (-row[i], i))[:5]
    assert topk_lowest(torch.tensor([-(2**31), 2**31 - 1, 0]), 2).tolist() == [1, 2]  # the int32 logit range
    with pytest.raises(ValueError):
        topk_lowest(torch.tensor([0.5, 1.5]), 1)


def ancestors(parents: list[int], node: int) -> list[int]:
    """Node indices from depth 1 down to `node` itself: parents [-1, -1, 0], node 2 -> [0, 2]."""
    chain = []
    while node >= 0:
        chain, node = [node, *chain], parents[node]
    return chain


def test_ancestors_walk_from_depth_one_to_the_node():
    assert ancestors([-1, -1, 0, 2], 3) == [0, 2, 3] and ancestors([-1], 0) == [0]


@pytest.fixture(scope="module")
def drafter(tiny_pair):
    return FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8)


def test_tree_rows_equal_the_chains_rows_bit_for_bit(tiny_pair, drafter):
    """Every node's integer logits equal the chain's logits after the same tokens (its ancestors fed in
    sequence, on a second instance of the same draft), so the first-child path of any tree is the chain."""
    tree_drafter = DatapathTreeDrafter(drafter, TreeSpec(branching=(3, 2, 2)))
    drafter.prefill(PROMPT, 96)
    tree = tree_drafter.propose(PROMPT, 3, SamplingParams(), torch.Generator())
    chain_model = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8).model
    chain_model.setup_cache(96)
    fed = [i for i, slot in enumerate(tree_drafter.slots) if slot >= 0]
    assert fed == list(range(9))  # levels 1 and 2: 3 + 6 nodes, in their own slots
    for node in fed:
        path = [tree.tokens[i] for i in ancestors(tree.parents, node)]
        chain = chain_model.forward(torch.tensor(PROMPT + path), 0)
        assert torch.equal(frontier_logits(tree_drafter, tree, node), chain), node
    first_path = [tree.tokens[0], tree.tokens[3], tree.tokens[9]]  # first child of the first child, twice
    assert first_path == draft_block(chain_model, PROMPT, 0, 3, drafter.vocab_limit)


def frontier_logits(tree_drafter: DatapathTreeDrafter, tree, node: int) -> torch.Tensor:
    """Re-feed the level holding `node` (its K/V and its ancestors' are already in the tree slots) and
    return node's row of the logits."""
    depth = len(ancestors(tree.parents, node))
    level = [i for i in range(len(tree.tokens)) if len(ancestors(tree.parents, i)) == depth]
    return tree_drafter._feed(tree.tokens, tree.parents, level)[level.index(node)]


@pytest.mark.parametrize("spec", ["1,1,1,1", "2,2,1", "3,1,2", "dynamic:8"])
@pytest.mark.parametrize("bits", [8, 4])
def test_fpga_trees_are_lossless(tiny_pair, spec, bits):
    target = load_model(tiny_pair[0])
    expected = generate(TorchVerifier(target), PROMPT, 24).tokens
    for directory in tiny_pair:
        engine = Engine(TorchVerifier(target))
        fpga = FpgaDrafter.from_checkpoint(directory, target_vocab_size=96, bits=bits, group_size=16)
        result = engine.decode(fpga, PROMPT, 24, k=4, tree=parse_tree_spec(spec))
        assert result.tokens == expected
        assert all(s.modeled_draft_s > 0 for s in result.steps if s.num_drafted)  # the board model's time of each tree


def test_self_drafting_fpga_tree_accepts_more_than_its_chain(tiny_pair, spec="3,2,2"):
    target = load_model(tiny_pair[0])
    fpga = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8)
    chain = Engine(TorchVerifier(target)).decode(fpga, PROMPT, 40, k=3)
    tree = Engine(TorchVerifier(target)).decode(fpga, PROMPT, 40, k=3, tree=parse_tree_spec(spec))
    assert tree.tokens == chain.tokens
    assert tree.stats()["mean_accepted_length"] >= chain.stats()["mean_accepted_length"] > 1


def test_a_dynamic_datapath_tree_keeps_its_best_scored_nodes(tiny_pair, drafter):
    """Scores are the cumulative Q0.30 products of the nodes' integer softmax probabilities: the tree is the
    budget best of the grown nodes, each kept node's parent is kept, and a root child's score is the float
    softmax of the dequantized logits to within 2**-12."""
    tree_drafter = DatapathTreeDrafter(drafter, parse_tree_spec("dynamic:10"))
    drafter.prefill(PROMPT, 96)
    seen = []
    expand = tree_drafter._expand
    tree_drafter._expand = lambda grown, *a: (seen.append(grown), expand(grown, *a))[1]
    tree = tree_drafter.propose(PROMPT, 4, SamplingParams(), torch.Generator())
    grown = seen[0]
    assert len(tree.tokens) == 10 and len(grown.tokens) > 10
    ranked = sorted(range(len(grown.tokens)), key=lambda i: -grown.scores[i])
    best = sorted(ranked[:10])
    assert all(grown.scores[i] > grown.scores[j] for i in ranked[:9] for j in ranked[11:])  # no tie at the cut
    assert tree.tokens == [grown.tokens[i] for i in best]
    assert all(grown.parents[i] < 0 or grown.parents[i] in best for i in best)
    assert all(p < 0 or grown.scores[i] <= grown.scores[p] for i, p in enumerate(grown.parents))
    n = len(PROMPT)
    blocks = drafter.modeled_block_s(1, n - 1, 1) + 3 * drafter.modeled_block_s(1, n, 4)  # root, 3 levels of 4
    rows = 1 + 4 + 4 + 4  # expanded: the root, then 4 a level
    work, design = drafter.workload, drafter.design
    chosen = softmax_time_s(work, design, rows) + topk_time_s(work, design, rows)
    assert tree.modeled_s == pytest.approx(blocks + chosen, rel=1e-9) and chosen > 0
    drafter.prefill(PROMPT, 96)
    root = drafter.model.forward(torch.tensor(PROMPT), 0)
    probs = torch.softmax(root.double() * drafter.meta["scales"]["logits"], -1)
    for i in [i for i, p in enumerate(grown.parents) if p < 0]:
        assert abs(grown.scores[i] / 2**30 - float(probs[grown.tokens[i]])) < 2**-12


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_every_family_runs_fpga_trees_from_the_cli(tmp_path, capsys, arch):
    save_checkpoint(tmp_path, arch, seed=5)
    outputs = []
    for extra in (["--no-draft"], ["--draft", str(tmp_path), "--draft-device", "fpga", "--tree", "2,2,1"]):
        assert main(["generate", "--target", str(tmp_path), "--prompt-ids", "5,9,14,3", "--max-new-tokens", "12",
                     "--json", *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[1]["tokens"] == outputs[0]["tokens"]
    assert outputs[1]["stats"]["modeled_draft_s"] > 0 and outputs[1]["stats"]["num_draft_tokens"] > 0


@pytest.mark.parametrize("spec,sampling,message", [
    ("2,2", SamplingParams(1.0), "greedy only"),
    ("dynamic:8", SamplingParams(1.0), "greedy only"),
])
def test_what_fpga_trees_cannot_do_is_refused_in_one_line(tiny_pair, drafter, spec, sampling, message):
    verifier = TorchVerifier(load_model(tiny_pair[0]))
    with pytest.raises(UserError, match=message) as err:
        tree_step(verifier, drafter, parse_tree_spec(spec), sampling, 0, 4)
    assert "\n" not in str(err.value)
    assert isinstance(tree_step(verifier, TorchDrafter(load_model(tiny_pair[1])), parse_tree_spec(spec), sampling,
                                0, 4).tree_drafter.spec, TreeSpec)  # the torch draft takes both
