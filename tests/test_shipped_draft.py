"""The shipped distilled draft, feature head and block feature head (drafts/): intact, loadable, under 64 MB each,
and installed by download_models.py."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from dfvg.checkpoint import is_feature_head, load_model
from dfvg.feature_head import load_feature_head, with_mask_rows

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "drafts" / "qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768"
SHIPPED_HEAD = ROOT / "drafts" / "qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768-fh"
SHIPPED_BLOCK_HEAD = ROOT / "drafts" / "qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768-fh-b4"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_shipped_draft_is_intact_small_and_loads():
    weights = SHIPPED / "model.safetensors"
    recipe = json.loads((SHIPPED / "distill_recipe.json").read_text())
    assert weights.stat().st_size <= 64 * 10**6
    assert sha256(weights) == recipe["model_safetensors_sha256"]
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
    for shipped in (SHIPPED, SHIPPED_HEAD, SHIPPED_BLOCK_HEAD):
        installed = tmp_path / shipped.name
        assert (installed / "model.safetensors").resolve() == (shipped / "model.safetensors").resolve()
        assert (installed / "tokenizer.json").read_text() == "{}" and (installed / "config.json").is_file()
    assert is_feature_head(tmp_path / SHIPPED_HEAD.name) and not is_feature_head(tmp_path / SHIPPED.name)
    assert is_feature_head(tmp_path / SHIPPED_BLOCK_HEAD.name)


def intact_head(folder: Path):
    """The head of a shipped folder, after checking its size and that its weights are the recipe's."""
    recipe = json.loads((folder / "distill_recipe.json").read_text())
    assert (folder / "model.safetensors").stat().st_size + \
        (folder / "feature_head.safetensors").stat().st_size <= 64 * 10**6
    assert sha256(folder / "model.safetensors") == recipe["model_safetensors_sha256"]
    assert sha256(folder / "feature_head.safetensors") == recipe["feature_head_safetensors_sha256"]
    head = load_feature_head(folder, target_hidden_size=1536)  # checks every shape
    cfg = head.body.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.head_vocab_size) == (4, 512, 32768)
    return head


def test_shipped_feature_head_is_intact_small_and_drafts_from_features():
    head = intact_head(SHIPPED_HEAD)
    assert not head.body.config.block_size
    ids, positions = torch.tensor([[151643, 750, 15801]]), torch.arange(3)[None]
    head.body.setup_cache(1, 8)
    features = torch.randn(1, 3, 1536, generator=torch.Generator().manual_seed(0))
    logits, predicted = head(ids, positions, features)
    head.body.setup_cache(1, 8)
    other_logits, _ = head(ids, positions, features * 0)
    assert predicted.shape == (1, 3, 1536) and torch.isfinite(logits).sum() == 3 * 32768
    assert not torch.equal(logits, other_logits)  # the target's features change what it proposes


def test_shipped_block_head_is_intact_and_drafts_a_block_in_one_pass():
    """The block head (K = 4): one pass of 3 committed rows and 3 mask rows (features zero, as `BlockFeatureDrafter`
    feeds them) gives the 4 drafts' logits, over the head's 32k ids only; the committed rows' features change them."""
    head = intact_head(SHIPPED_BLOCK_HEAD)
    cfg = head.body.config
    assert cfg.block_size == 4 and len(cfg.mask_ids) >= 3
    ids = torch.tensor([[151643, 750, 15801, *cfg.mask_ids[:3]]])
    positions, rows = torch.arange(6)[None], torch.arange(2, 6)
    features = with_mask_rows(torch.randn(3, 1536, generator=torch.Generator().manual_seed(0)), 4)[None]

    def drafts(feats):
        head.body.setup_cache(1, 8)
        logits, _ = head(ids, positions, feats, rows=rows)
        return logits

    logits = drafts(features)
    assert logits.shape == (1, 4, 151936) and torch.isfinite(logits).sum() == 4 * 32768
    assert not torch.equal(logits, drafts(features * 0))  # the committed rows' features change the block
