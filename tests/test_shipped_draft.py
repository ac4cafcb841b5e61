"""The shipped distilled draft (drafts/): intact, loadable, under 64 MB, and installed by download_models.py."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from dfvg.checkpoint import load_model

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "drafts" / "qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768"


def test_shipped_draft_is_intact_small_and_loads():
    weights = SHIPPED / "model.safetensors"
    recipe = json.loads((SHIPPED / "distill_recipe.json").read_text())
    assert weights.stat().st_size <= 64 * 10**6
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == recipe["model_safetensors_sha256"]
    model = load_model(SHIPPED)  # checks every shape, the head ids and the token -> row table
    cfg = model.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.head_vocab_size, cfg.vocab_size) == (4, 512, 32768, 151936)
    assert cfg.embed_rows and model.output.weight is model.tok_embeddings.weight
    assert torch.equal(model.token_rows[model.head_token_ids], torch.arange(32768))
    logits = model.feed([151643, 750, 15801], 0, last_only=True) if model.setup_cache(1, 8) is None else None
    assert logits.shape == (1, 151936) and torch.isfinite(logits).sum() == 32768  # only head ids are proposable


def test_download_models_installs_the_shipped_draft(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import download_models

    target = tmp_path / "qwen2.5-coder-1.5b-instruct"
    target.mkdir()
    (target / "tokenizer.json").write_text("{}")
    download_models.install_shipped_drafts(target.name, tmp_path)
    installed = tmp_path / SHIPPED.name
    assert (installed / "model.safetensors").resolve() == (SHIPPED / "model.safetensors").resolve()
    assert (installed / "tokenizer.json").read_text() == "{}" and (installed / "config.json").is_file()
