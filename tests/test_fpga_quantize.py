"""The FPGA quantizer, its artifact and the integer datapath, on tiny real checkpoints (CPU, fast)."""

from __future__ import annotations

import json

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.errors import UserError
from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.artifact import FORMAT_VERSION, StaleArtifact, load_artifact, load_or_build
from dfvg.fpga.datapath.integer_model import IntegerDraftModel, rmsnorm_wide
from dfvg.fpga.datapath.quantize import builtin_calibration, calibrate, quantize_model, quantize_rows_int4, smooth

from .conftest import save_checkpoint

PROMPT = [5, 17, 33, 2, 90, 45, 12, 7, 64, 3, 8, 9, 10, 11, 50, 60, 21, 30, 41, 77]


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A 2-layer qwen2 with hidden 256: wide enough that quantization noise averages out as in real models."""
    directory = tmp_path_factory.mktemp("wide")
    save_checkpoint(directory, "qwen2", seed=3, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                    num_key_value_heads=2, initializer_range=0.05)
    return directory, load_model(directory)


def float_logits(model, ids: list[int]) -> torch.Tensor:
    model.setup_cache(1, len(ids))
    with torch.inference_mode():
        return model(torch.tensor([ids]), torch.arange(len(ids))[None])[0].double()  # [T, V]


def integer_logits(dm: IntegerDraftModel, ids: list[int]) -> torch.Tensor:
    """Logits after each prefix, feeding one token at a time (the drafting pattern)."""
    dm.setup_cache(len(ids))
    return torch.stack([dm.forward(torch.tensor([t]), i) for i, t in enumerate(ids)]).double()


@pytest.mark.parametrize("bits,min_top1,min_cos", [(8, 0.7, 0.95), (4, 0.5, 0.9)])
def test_integer_logits_track_the_float_model(wide_model, bits, min_top1, min_cos):
    directory, model = wide_model
    tensors, _ = quantize_model(model, bits=bits, group_size=32)
    ints = integer_logits(IntegerDraftModel(tensors, model.config, bits, "cpu"), PROMPT)
    floats = float_logits(model, PROMPT)
    top1 = (ints.argmax(-1) == floats.argmax(-1)).double().mean()
    cosine = torch.nn.functional.cosine_similarity(ints, floats, dim=-1).mean()
    assert top1 >= min_top1 and cosine >= min_cos, (float(top1), float(cosine))


def test_qwen3_qk_norm_runs_in_integers_and_tracks_the_float_model(tmp_path):
    """A wide Qwen3 (qk-norm): the quantizer keeps per-head q/k norm constants and the integer logits follow
    the float model; with the norms' gammas zeroed the integer logits change, so the norms really run."""
    save_checkpoint(tmp_path, "qwen3", seed=4, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, initializer_range=0.05)
    model = load_model(tmp_path)
    tensors, meta = quantize_model(model, bits=8)
    assert tensors["layers.0.attention.q_norm.gamma"].shape == (64,) and "q_in" in meta["scales"]["layers"][0]
    ints = integer_logits(IntegerDraftModel(tensors, model.config, 8, "cpu"), PROMPT)
    floats = float_logits(model, PROMPT)
    top1 = (ints.argmax(-1) == floats.argmax(-1)).double().mean()
    cosine = torch.nn.functional.cosine_similarity(ints, floats, dim=-1).mean()
    assert top1 >= 0.7 and cosine >= 0.95, (float(top1), float(cosine))
    flat = {**tensors, "layers.0.attention.q_norm.gamma": torch.zeros(64, dtype=torch.int16)}
    assert not torch.equal(integer_logits(IntegerDraftModel(flat, model.config, 8, "cpu"), PROMPT[:4]), ints[:4])


def test_smoothing_does_not_change_the_float_function(wide_model):
    _, model = wide_model
    smoothed = __import__("copy").deepcopy(model)
    smooth(smoothed, calibrate(smoothed, builtin_calibration(model.config.vocab_size)))
    assert not torch.equal(smoothed.layers[0].attention_norm.weight, model.layers[0].attention_norm.weight)
    torch.testing.assert_close(float_logits(smoothed, PROMPT), float_logits(model, PROMPT), rtol=1e-4, atol=1e-4)


def test_batched_prefill_equals_token_by_token(wide_model):
    """The position-indexed cache: feeding the prompt at once or one id at a time gives the same integers."""
    _, model = wide_model
    tensors, _ = quantize_model(model, bits=8)
    dm = IntegerDraftModel(tensors, model.config, 8, "cpu")
    one_by_one = integer_logits(dm, PROMPT)[-1]
    dm.setup_cache(len(PROMPT))
    assert torch.equal(dm.forward(torch.tensor(PROMPT), 0).double(), one_by_one)
    # Overwriting stale positions: feed garbage at 15.., then the real ids again from 15.
    dm.forward(torch.tensor([1, 2, 3]), 15)
    assert torch.equal(dm.forward(torch.tensor(PROMPT[15:]), 15).double(), one_by_one)


def test_int4_fast_path_equals_the_group_matmul_primitive(wide_model):
    _, model = wide_model
    tensors, _ = quantize_model(model, bits=4, group_size=32)
    dm = IntegerDraftModel(tensors, model.config, 4, "cpu")
    x = torch.randint(-128, 128, (3, 512), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    name = "layers.1.feed_forward.w2"
    groups = fp.int4_group_layout(fp.int4_unpack(tensors[name + ".weight_packed"]), 32)  # [K/G, N, G]
    want = fp.int4_group_matmul(x, groups, tensors[name + ".group_scales"])
    assert torch.equal(dm._acc(x, name), want)


def test_int4_weights_do_not_clip_and_round_to_half_a_step():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)) * torch.logspace(-2, 0, 64)
    w4, gs, row = quantize_rows_int4(w, 16)
    step = row[:, None] * gs.double().repeat_interleave(16, dim=1)  # [N, K]
    assert int(w4.min()) >= -8 and int(w4.max()) <= 7 and int(gs.min()) >= 1
    assert bool(((w.double() - w4.double() * step).abs() <= step / 2 + 1e-12).all())


def test_rmsnorm_wide_matches_the_primitive_and_is_scale_invariant():
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(-8000, 8000, (4, 64), generator=gen)
    c = fp.rmsnorm_setup(torch.rand(64, generator=gen) + 0.5, 1e-3, 0.02, 1e-6)
    params = (c["multiplier"], c["shift"], c["eps_term"])
    base = rmsnorm_wide(x, c["gamma_q"], params)
    assert torch.equal(base, fp.rmsnorm(x, c["gamma_q"], c["multiplier"], c["shift"], c["eps_term"]))
    wide = rmsnorm_wide(x * 256, c["gamma_q"], params)  # 8 more bits: shifted back before the norm
    assert (wide.int() - base.int()).abs().max() <= 1


def test_quantize_refuses_bad_bits(wide_model):
    with pytest.raises(UserError, match="8 or 4"):
        quantize_model(wide_model[1], bits=3)


def test_artifact_round_trip_and_reuse(tiny_pair, tmp_path):
    _, draft = tiny_pair
    where = tmp_path / "art"
    tensors, meta = load_or_build(draft, 8, 128, where)
    assert meta["format_version"] == FORMAT_VERSION and meta["bits"] == 8
    assert meta["source"]["path"] == str(draft.resolve()) and meta["calibration"] == "builtin-lcg"
    stamp = (where / "weights.safetensors").stat().st_mtime_ns
    again, meta2 = load_or_build(draft, 8, 128, where)
    assert (where / "weights.safetensors").stat().st_mtime_ns == stamp  # reloaded, not rebuilt
    assert tensors.keys() == again.keys() and meta2 == meta
    for name, t in tensors.items():
        assert again[name].dtype == t.dtype and torch.equal(again[name], t), name
    assert {t.dtype for t in again.values()} <= {torch.int8, torch.int16, torch.int32, torch.uint8}


def test_stale_artifact_is_refused_in_one_line_or_rebuilt(tiny_pair, tmp_path, capsys):
    _, draft = tiny_pair
    where = tmp_path / "art"
    load_or_build(draft, 8, 128, where)
    meta = json.loads((where / "meta.json").read_text())
    (where / "meta.json").write_text(json.dumps({**meta, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(StaleArtifact, match="format_version") as err:
        load_artifact(where)
    assert "\n" not in str(err.value)
    with pytest.raises(StaleArtifact, match="format_version"):
        load_or_build(draft, 8, 128, where, on_stale="refuse")
    _, rebuilt = load_or_build(draft, 8, 128, where)
    assert rebuilt["format_version"] == FORMAT_VERSION and "rebuilding" in capsys.readouterr().err
    with pytest.raises(StaleArtifact, match="bits"):
        load_artifact(where, {"bits": 4})
    with pytest.raises(StaleArtifact, match="source.config_sha256"):
        load_artifact(where, {"source.config_sha256": "0" * 64})


def test_datapath_switches_tf32_off_while_it_runs(wide_model):
    _, model = wide_model
    tensors, _ = quantize_model(model, bits=8)
    dm = IntegerDraftModel(tensors, model.config, 8, "cpu")
    dm.setup_cache(4)
    seen = []
    original = dm._forward
    dm._forward = lambda ids, pos, last: seen.append(torch.backends.cuda.matmul.allow_tf32) or original(ids, pos, last)
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        dm.forward(torch.tensor([3, 4]), 0)
        assert seen == [False] and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
