"""config.json parsing: the classic and transformers-5 RoPE keys, and refusals."""

from __future__ import annotations

import pytest

from dfvg.checkpoint import config_from_dict
from dfvg.errors import UserError

BASE = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2}


def test_classic_rope_keys_and_defaults():
    cfg = config_from_dict({**BASE, "model_type": "llama", "rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}})
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.num_kv_heads == 2 and cfg.head_dim == 4 and not cfg.attention_bias


def test_architecture_flags():
    assert config_from_dict({**BASE, "model_type": "qwen2"}).attention_bias
    assert not config_from_dict({**BASE, "model_type": "qwen2"}).output_bias
    qwen3 = config_from_dict({**BASE, "model_type": "qwen3", "head_dim": 6, "rope_parameters": {
        "rope_type": "default", "rope_theta": 1e6}})
    assert qwen3.qk_norm and qwen3.head_dim == 6 and qwen3.rope_theta == 1e6 and qwen3.rope_scaling is None


@pytest.mark.parametrize("raw, message", [
    ({"model_type": "mistral"}, "model_type 'mistral'"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"model_type": "llama", "mlp_bias": True}, "mlp_bias"),
])
def test_refusals(raw, message):
    with pytest.raises(UserError, match=message):
        config_from_dict({**BASE, **raw})
