"""The board model's compute term takes the MAC efficiency from the simulated RTL run (draft_cycles.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfvg.errors import UserError
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams, DraftWorkload, model_block
from dfvg.fpga.board.rtl_cycles import compute_efficiency

NO_KERNELS = Path("/nonexistent/kernel_cycles.json")


def _report(path: Path) -> Path:
    """A run with a prompt pass (ignored) and one one-token pass: GEMV ops wqkv + output, plus an rmsnorm
    (not a GEMV op: not counted)."""
    one = {"fed_tokens": 1, "cycles_by_op": {"wqkv": 1000, "output": 3000, "rmsnorm": 500},
           "macs_by_op": {"wqkv": 200_000, "output": 700_000}}
    prompt = {"fed_tokens": 3, "cycles_by_op": {"wqkv": 1, "output": 1}, "macs_by_op": {"wqkv": 1, "output": 1}}
    path.write_text(json.dumps({"draft": "drafts/x", "simulator": "Icarus Verilog 11.0", "tiles": {"P": 16, "W": 16},
                                "gemv_ops": ["wqkv", "output"], "passes": [prompt, one]}))
    return path


def test_compute_term_uses_simulated_efficiency_hand_arithmetic(tmp_path):
    # efficiency = 900,000 MACs / (16 x 16 MAC slots x 4,000 cycles) = 900000 / 1024000 = 0.87890625
    design = DesignParams(cycles_file=NO_KERNELS, rtl_run_file=_report(tmp_path / "draft_cycles.json"))
    value, provenance, source = compute_efficiency(design)
    assert (value, provenance) == (0.87890625, "simulated") and "16 x 16" in source
    w = DraftWorkload(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                      head_dim=16, vocab_size=1000)
    est = model_block(w, get_board("u280"), design, k=1, context_len=10)
    # one pass: 2 layers x (64*(4+4)*16 + 4*16*64 + 3*64*128) + 2*2*4*16*10 attention + 1000*64 head MACs
    macs = 2 * (8192 + 4096 + 24576) + 2560 + 64_000
    assert w.macs_per_token(10) == macs == 140_288  # 73,728 + 2,560 + 64,000
    assert est.compute_time.value == pytest.approx(macs / (4096 * 1 * 0.87890625 * 250e6), rel=1e-12)
    assert any(a.startswith("simulated: MAC-array efficiency 0.8789") for a in est.assumptions)


def test_efficiency_is_assumed_without_report_or_when_set(tmp_path):
    missing = DesignParams(cycles_file=NO_KERNELS, rtl_run_file=tmp_path / "none.json")
    assert compute_efficiency(missing)[:2] == (1.0, "assumed")
    forced = DesignParams(dsp_efficiency=0.5, rtl_run_file=_report(tmp_path / "r.json"))
    assert compute_efficiency(forced)[:2] == (0.5, "assumed")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(UserError, match="draft_cycles"):
        compute_efficiency(DesignParams(rtl_run_file=bad))
