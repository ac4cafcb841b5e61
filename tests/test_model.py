"""Our transformer against transformers' reference implementation, in fp32 on CPU."""

from __future__ import annotations

import pytest
import torch

from dfvg.checkpoint import load_model
from tests.conftest import save_checkpoint

LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64, "rope_theta": 500000.0,
}
CASES = {
    "llama-gqa-llama3rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "llama-mha-tied": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "llama-attention-bias": ("llama", {"attention_bias": True}),
    "qwen2-bias-tied": ("qwen2", {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default",
                                                                                   "rope_theta": 1e6}}),
    "qwen2-sharded": ("qwen2", {"max_shard_size": "40KB"}),
    "qwen3-qknorm": ("qwen3", {}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_checkpoint(directory, arch, seed=3, **dict(overrides))
    return request.param, reference, load_model(directory)


def reference_logits(reference, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return reference(torch.tensor([ids])).logits[0].float()


def ours(model, ids: list[int], start: int) -> torch.Tensor:
    positions = torch.arange(start, start + len(ids))[None]
    with torch.no_grad():
        return model(torch.tensor([ids]), positions)[0]


def test_full_sequence_logits_match(pair):
    name, reference, model = pair
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    model.setup_cache(1, 64)
    torch.testing.assert_close(ours(model, ids, 0), reference_logits(reference, ids), atol=2e-4, rtol=1e-4)


def test_incremental_decode_and_rollback_match(pair):
    name, reference, model = pair
    ids = torch.randint(0, 96, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    model.setup_cache(1, 64)
    ours(model, ids[:10], 0)
    steps = [ours(model, [ids[p]], p)[0] for p in range(10, 30)]  # one token at a time
    torch.testing.assert_close(torch.stack(steps), reference_logits(reference, ids)[10:], atol=2e-4, rtol=1e-4)
    # Roll back to position 18 and continue with other tokens: stale slots 18..29 must not leak in.
    other = [5, 6, 7, 8]
    rolled = ours(model, other, 18)
    torch.testing.assert_close(rolled, reference_logits(reference, ids[:18] + other)[18:], atol=2e-4, rtol=1e-4)


def test_batch_rows_with_different_positions(pair):
    """Two sequences at different lengths in one batch each match their own reference."""
    name, reference, model = pair
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 96, (12,), generator=gen).tolist(), torch.randint(0, 96, (7,), generator=gen).tolist()
    model.setup_cache(2, 64)
    with torch.no_grad():
        model(torch.tensor([a[:11]]), torch.arange(11)[None])  # row 0 only
        model(torch.tensor([b[:6], b[:6]]), torch.tensor([list(range(6))] * 2))  # rows 0 and 1
        model(torch.tensor([a[:11]]), torch.arange(11)[None])  # restore row 0
        last = model(torch.tensor([[a[11]], [b[6]]]), torch.tensor([[11], [6]]))[:, 0]
    torch.testing.assert_close(last[0], reference_logits(reference, a)[-1], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(last[1], reference_logits(reference, b)[-1], atol=2e-4, rtol=1e-4)


def test_training_through_the_shared_kv_store_backpropagates_like_inference(tmp_path):
    """Every layer's K/V lives in one store; a training pass (gradients flowing into K/V) puts them in out of
    place, so layer 2's write cannot invalidate what layer 1 saved for backward, and the logits are the ones a
    no-grad pass gives (which writes the store in place)."""
    from dfvg.distill.train import teacher_forced_states

    save_checkpoint(tmp_path, "qwen2", seed=0, num_hidden_layers=3)
    model = load_model(tmp_path)
    ids, pos = torch.randint(0, 90, (2, 10), generator=torch.Generator().manual_seed(0)), torch.arange(10)[None]
    with torch.no_grad():
        want = model.logits(teacher_forced_states(model, ids, pos.expand(2, 10)))
    assert model.kv_store.abs().sum() > 0  # inference wrote the store
    model.train().requires_grad_(True)
    got = model.logits(teacher_forced_states(model, ids, pos.expand(2, 10)))
    got[torch.isfinite(got)].sum().backward()
    assert torch.allclose(got, want, atol=1e-5)
    assert all(layer.attention.wqkv.weight.grad.abs().sum() > 0 for layer in model.layers)
