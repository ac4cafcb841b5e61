"""The reference path of dfvg.gpu.kernels on CPU (always), and the Triton kernels against it (gpu-marked)."""

from __future__ import annotations

import pytest
import torch

from dfvg.acceptance import accept
from dfvg.gpu import kernels
from dfvg.sampling import SamplingParams, processed_probs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("mismatch_at", [None, 0, 2])
def test_greedy_accept_reference_matches_engine_rule(mismatch_at):
    logits = torch.randn(5, 300)
    drafts = logits.argmax(-1)[:4].clone()
    if mismatch_at is not None:
        drafts[mismatch_at] = (drafts[mismatch_at] + 1) % 300
    out = kernels.greedy_accept_reference(logits, drafts)
    want = accept(drafts, None, processed_probs(logits, SamplingParams()), torch.zeros(5))
    assert (int(out[0]), int(out[1])) == want
    assert torch.equal(out[2:], logits.argmax(-1))


def test_greedy_accept_reference_plain_decode_and_ties():
    logits = torch.zeros(1, 10)
    logits[0, 3] = logits[0, 8] = 2.0
    out = kernels.greedy_accept_reference(logits, torch.zeros(0, dtype=torch.long))
    assert out.tolist() == [0, 3, 3]


def test_tree_mask_chain_is_causal():
    mask = kernels.tree_attention_mask(4, kernels.chain_tree_mask(3), 9)
    assert mask.tolist()[0] == [True] * 5 + [False] * 4
    assert mask.tolist()[2] == [True] * 7 + [False] * 2


def test_verify_attention_reference_is_causal_attention():
    torch.manual_seed(0)
    q, kc, vc = torch.randn(3, 4, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8)
    out = kernels.verify_attention_reference(q, kc, vc, 5, kernels.chain_tree_mask(3))
    # query 0 at slot 5 by hand: softmax over slots 0..5 of head 0 (kv head 0)
    scores = kc[:6, 0] @ q[0, 0] / 8**0.5
    assert torch.allclose(out[0, 0], torch.softmax(scores, 0) @ vc[:6, 0], atol=1e-5)
    tree = torch.eye(3, dtype=torch.bool)  # siblings: each new token sees only the prefix and itself
    out_tree = kernels.verify_attention_reference(q, kc, vc, 5, tree)
    scores = torch.cat([kc[:5, 0], kc[7:8, 0]]) @ q[2, 0] / 8**0.5
    want = torch.softmax(scores, 0) @ torch.cat([vc[:5, 0], vc[7:8, 0]])
    assert torch.allclose(out_tree[2, 0], want, atol=1e-5)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("rows,vocab", [(1, 151936), (5, 151936), (9, 4097), (16, 1000)])
def test_greedy_accept_triton_matches_reference(rows, vocab):
    if not kernels.HAVE_TRITON:
        pytest.skip("Triton is not installed")
    for trial in range(3):
        logits = torch.randn(rows, vocab, device="cuda")
        drafts = logits.argmax(-1)[: rows - 1].clone()
        if trial and rows > 1:
            drafts[trial % (rows - 1)] += 1
        assert torch.equal(kernels.greedy_accept_triton(logits, drafts),
                           kernels.greedy_accept_reference(logits, drafts))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("heads,kv,hd,start,rows", [(12, 2, 128, 300, 5), (14, 2, 64, 37, 9), (4, 4, 64, 0, 2)])
def test_verify_attention_triton_matches_reference(heads, kv, hd, start, rows):
    if not kernels.HAVE_TRITON:
        pytest.skip("Triton is not installed")
    q = torch.randn(rows, heads, hd, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(start + rows + 20, kv, hd, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    tree = (torch.rand(rows, rows, device="cuda") < 0.5) | torch.eye(rows, dtype=torch.bool, device="cuda")
    want = kernels.verify_attention_reference(q.double(), kc.double(), vc.double(), start, tree)
    got = kernels.verify_attention_triton(q, kc, vc, start, tree)
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-2
