"""The board latency model: calibration against published U280 designs and its accounting rules."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dfvg.errors import UserError
from dfvg.fpga.board.boards import BOARDS, get_board
from dfvg.fpga.board.latency import DesignParams, DraftWorkload, describe, layer_overhead, model_block

U280 = get_board("u280")


def _design(**kw) -> DesignParams:
    """A design with the assumed per-layer overhead and MAC efficiency: it never reads the repository's
    kernel_cycles.json or draft_cycles.json."""
    kw.setdefault("cycles_file", Path("/nonexistent/kernel_cycles.json"))
    kw.setdefault("rtl_run_file", Path("/nonexistent/draft_cycles.json"))
    return DesignParams(**kw)


def _llama2_7b_flightllm() -> DraftWorkload:
    # LLaMA2-7B shapes; FlightLLM streams 3.43 GB of sparse mixed-precision weights per token.
    return DraftWorkload(num_layers=32, hidden_size=4096, intermediate_size=11008, num_heads=32,
                         num_kv_heads=32, head_dim=128, vocab_size=32000, weight_bits=16, kv_bits=16,
                         weight_bytes=3_430_000_000, residency="none")


def _gpt2_medium_fp16() -> DraftWorkload:
    return DraftWorkload(num_layers=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                         num_kv_heads=16, head_dim=64, vocab_size=50257, weight_bits=16, kv_bits=16,
                         tie_word_embeddings=True, gated_ffn=False, residency="none")


def _qwen05(bits: float = 8) -> DraftWorkload:
    return DraftWorkload(24, 896, 4864, 14, 2, 64, 151936, weight_bits=bits)


@pytest.mark.parametrize("context, published_ms", [(128, 17.5), (512, 19.0)])
def test_flightllm_calibration(context, published_ms):
    design = _design(clock_mhz=225, bandwidth_efficiency=0.43, kv_on_chip=False)
    est = model_block(_llama2_7b_flightllm(), U280, design, k=1, context_len=context)
    assert est.time_per_token.value * 1e3 == pytest.approx(published_ms, rel=0.15)
    assert est.time_per_token.provenance == "modeled" and est.bound == "memory"


def test_dfx_calibration():
    design = _design(clock_mhz=200, bandwidth_efficiency=0.28, kv_on_chip=False, dsps_used=3600)
    est = model_block(_gpt2_medium_fp16(), U280, design, k=1, context_len=128)
    assert _gpt2_medium_fp16().streamed_weight_bytes() == pytest.approx(707e6, rel=0.01)
    assert est.time_per_token.value * 1e3 == pytest.approx(5.37, rel=0.15)


def test_resident_weights_are_not_charged_offchip_time():
    design = _design(kv_on_chip=True)
    w = _qwen05()
    streamed = model_block(dataclasses.replace(w, residency="none"), U280, design, 1, 64)
    resident = model_block(dataclasses.replace(w, bytes_resident_on_chip=20_000_000), U280, design, 1, 64)
    saved_s = 20_000_000 / (460e9 * design.bandwidth_efficiency)
    assert streamed.memory_time.value - resident.memory_time.value == pytest.approx(saved_s, rel=1e-9)
    assert streamed.offchip_bytes_per_token.value - resident.offchip_bytes_per_token.value == 20_000_000


def test_fully_resident_draft_has_no_weight_traffic():
    tiny = DraftWorkload(2, 256, 512, 4, 2, 64, 4096, weight_bits=8, residency="all")
    est = model_block(tiny, U280, _design(kv_on_chip=True), k=4, context_len=32)
    assert est.offchip_bytes_per_token.value == 0 and est.memory_time.value == 0
    assert est.bound == "compute"


def test_time_grows_with_context_when_kv_is_off_chip():
    design = _design(kv_on_chip=False)
    times = [model_block(_qwen05(), U280, design, 4, c).block_time.value for c in (0, 1024, 8192)]
    assert times[0] < times[1] < times[2]
    per_pos = _qwen05().kv_bytes_per_position()
    assert per_pos == 2 * 24 * 2 * 64  # int8 K and V, 2 KV heads
    # 4 passes, each reads 8192 - 1024 more positions
    expected = 4 * (8192 - 1024) * per_pos / (460e9 * design.bandwidth_efficiency)
    assert times[2] - times[1] == pytest.approx(expected, rel=1e-6)


def test_one_launch_per_block():
    w = _qwen05()
    design = _design(launch_overhead_us=100.0)
    one = model_block(w, U280, design, k=1, context_len=100)
    eight = model_block(w, U280, design, k=8, context_len=100)
    assert eight.launch_time.value == one.launch_time.value == pytest.approx(100e-6)
    no_launch = dataclasses.replace(design, launch_overhead_us=0.0)
    delta = eight.block_time.value - model_block(w, U280, no_launch, k=8, context_len=100).block_time.value
    assert delta == pytest.approx(100e-6)  # charged once for 8 tokens, not 8 times
    assert eight.time_per_token.value < one.time_per_token.value


def test_energy_is_power_times_time():
    est = model_block(_qwen05(4.125), U280, _design(), k=4, context_len=256)
    assert est.energy_per_block.value == pytest.approx(U280.power_w * est.block_time.value)
    assert est.board_power.provenance == "assumed"


def test_from_model_config_duck_typed():
    cfg = SimpleNamespace(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                          num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, tie_word_embeddings=False)
    w = DraftWorkload.from_model_config(cfg, weight_bits=8, weight_bytes=123_456)
    assert w == dataclasses.replace(_qwen05(), weight_bytes=123_456)
    assert w.streamed_weight_bytes() == 123_456
    params = DraftWorkload.from_model_config(cfg).num_layers * _qwen05().layer_params()
    assert params == 24 * (896 * 18 * 64 + 896 * 896 + 3 * 896 * 4864)


@pytest.mark.parametrize("bad", [dict(clock_mhz=-1), dict(bandwidth_efficiency=1.5), dict(macs_per_dsp=3),
                                 dict(bandwidth_efficiency=0), dict(launch_overhead_us=-1)])
def test_bad_design_params(bad):
    with pytest.raises(UserError):
        DesignParams(**bad)


def test_bad_board_names_the_known_boards():
    with pytest.raises(UserError, match="u280.*u55c|u250.*u280"):
        get_board("u999")
    assert get_board("Alveo-U280") is BOARDS["u280"]


def test_boards_on_chip_bytes_match_fpga_md():
    mib = {name: b.on_chip_bytes / 2**20 for name, b in BOARDS.items()}
    assert mib["u280"] == pytest.approx(42.6, abs=0.05) and mib["u250"] == pytest.approx(56.8, abs=0.05)
    assert mib["v80"] == pytest.approx(84.1, abs=0.05)
    assert all(b.source and b.power_provenance in ("assumed", "measured") for b in BOARDS.values())


def test_overcapacity_and_packing_errors():
    with pytest.raises(UserError, match="DSPs"):
        model_block(_qwen05(), U280, _design(dsps_used=20_000), 1, 0)
    with pytest.raises(UserError, match="WP486"):
        model_block(_qwen05(16), U280, _design(macs_per_dsp=2), 1, 0)
    with pytest.raises(UserError, match="residency='all'"):
        model_block(dataclasses.replace(_qwen05(), residency="all"), U280, _design(), 1, 0)
    with pytest.raises(UserError, match="max_context"):
        model_block(_qwen05(), U280, _design(kv_on_chip=True, max_context=64), 4, 62)


def test_layer_overhead_from_kernel_cycles_file(tmp_path):
    path = tmp_path / "kernel_cycles.json"
    kernels = {"gemv_int8": {"params": {"LANES": 16}, "latency_cycles": 20, "initiation_interval": 1,
                             "elements_per_cycle": 16},
               "rmsnorm": {"params": {}, "latency_cycles": 50, "initiation_interval": 1, "elements_per_cycle": 1},
               "softmax": {"params": {}, "latency_cycles": 30, "initiation_interval": 1, "elements_per_cycle": 1}}
    path.write_text(json.dumps({"simulator": "icarus", "kernels": kernels}))
    cycles, provenance, source = layer_overhead(DesignParams(cycles_file=path))
    assert (cycles, provenance) == (4 * 20 + 2 * 50 + 30 + 125, "assumed")  # no elementwise kernel yet
    assert "elementwise" in source and "gemv/norm/softmax" in source
    kernels["rope_silu_elementwise"] = dict(kernels["softmax"], latency_cycles=7)
    path.write_text(json.dumps({"simulator": "icarus", "kernels": kernels}))
    cycles, provenance, source = layer_overhead(DesignParams(cycles_file=path))
    assert (cycles, provenance) == (4 * 20 + 2 * 50 + 30 + 7, "simulated") and "'LANES': 16" in source
    assert layer_overhead(DesignParams(cycles_file=tmp_path / "missing.json"))[:2] == (1000.0, "assumed")
    path.write_text("{}")
    with pytest.raises(UserError, match="kernel_cycles"):
        layer_overhead(DesignParams(cycles_file=path))


def test_describe_lists_every_metric_and_assumption():
    est = model_block(_qwen05(), U280, _design(), k=4, context_len=128)
    text = "\n".join(describe(est))
    for name in est.metrics():
        assert name in text
    assert "[modeled]" in text and "[assumed]" in text and "WP486" not in text
    assert text.count("    - ") == len(est.assumptions)
