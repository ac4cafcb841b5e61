"""`python -m dfvg.fpga.rtl_run`: tokens from the simulated RTL equal the Python integer datapath's.

Tiny Llama, Qwen2 (q/k/v bias) and Qwen3 (qk-norm) drafts built here, int8 and int4 weights, a prompt pass
of several tokens then one-token passes (KV cache, causal mask, GQA). About 5-15 s each here (small tiles
P = W = 8 keep Icarus' start-up short). The shipped draft takes minutes per token: marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dfvg.fpga.rtl_run import main
from tests.conftest import save_checkpoint

pytestmark = pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
SHIPPED = Path(__file__).resolve().parents[1] / "drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768"


def _run(capsys, argv: list[str]) -> tuple[int, dict | None, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


@pytest.mark.parametrize("arch,bits", [("llama", 8), ("qwen2", 8), ("qwen3", 8), ("qwen2", 4)])
def test_rtl_tokens_equal_datapath_tokens(tmp_path, capsys, arch, bits):
    save_checkpoint(tmp_path, arch, seed=5)
    code, result, err = _run(capsys, ["--draft", str(tmp_path), "--prompt-ids", "5,9,14,3", "--tokens", "3",
                                      "--bits", str(bits), "--group-size", "16", "--tiles", "8,8,8",
                                      "--artifact-dir", str(tmp_path / "art"), "--json"])
    assert code == 0, err
    assert result["tokens"] == result["datapath_tokens"] and len(result["tokens"]) == 3
    assert [p["fed_tokens"] for p in result["passes"]] == [4, 1, 1]
    ops = set(result["passes"][1]["cycles_by_op"])
    assert {"embed", "rmsnorm", "wqkv", "rope", "scores", "softmax", "pv", "wo", "w13", "swiglu", "w2",
            "output"} <= ops
    assert ("qk_norm" in ops) == (arch == "qwen3")
    assert result["cycles_per_token"] == round(sum(p["cycles"] for p in result["passes"][1:]) / 2)
    assert result["provenance"] == "simulated" and "Icarus" in result["simulator"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    save_checkpoint(tmp_path, "llama", seed=1)
    capsys.readouterr()  # the checkpoint writer's progress bar
    base = ["--draft", str(tmp_path), "--prompt-ids", "1,2", "--artifact-dir", str(tmp_path / "art")]
    for extra, words in ((["--tiles", "8,6,8"], "--tiles"), (["--tokens", "0"], "--tokens"),
                         (["--bits", "4", "--group-size", "12"], "group size")):
        code, result, err = _run(capsys, base + extra)
        assert code == 2 and result is None and words in err and err.count("\n") == 1, err
    code, _, err = _run(capsys, ["--draft", str(tmp_path / "missing"), "--prompt-ids", "1"])
    assert code == 2 and err.count("\n") == 1
    monkeypatch.setenv("PATH", str(tmp_path))  # no iverilog on PATH
    code, _, err = _run(capsys, base)
    assert code == 2 and "iverilog" in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DFVG_SLOW") != "1", reason="set DFVG_SLOW=1 (the shipped draft: minutes)")
def test_shipped_draft_one_token(tmp_path, capsys):
    code, result, err = _run(capsys, ["--draft", str(SHIPPED), "--prompt-ids", "1,2,3", "--tokens", "1",
                                      "--artifact-dir", str(tmp_path / "art"), "--json"])
    assert code == 0, err
    assert result["tokens"] == result["datapath_tokens"]
