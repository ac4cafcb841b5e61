"""The device-config loader: the shipped file loads, and every mistake is refused in one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfvg.errors import UserError
from dfvg.fpga.datapath.drafter import FpgaOptions
from dfvg.host.device_config import AdaptiveConfig, DeviceConfig, load_device_config

SHIPPED = Path(__file__).resolve().parents[1] / "configs" / "device_config.yaml"


def test_shipped_config_loads():
    cfg = load_device_config(SHIPPED)
    assert (cfg.draft, cfg.verify, cfg.pipeline) == ("cpu", "cpu", "overlap")
    assert cfg.fpga == FpgaOptions("u280", "emulate", None, 8) and cfg.adaptive is None
    assert cfg.source == str(SHIPPED)


def test_defaults_and_full_mapping(tmp_path):
    assert load_device_config({}) == DeviceConfig()
    xclbin = tmp_path / "draft.xclbin"
    xclbin.write_bytes(b"xclbin2\0")
    cfg = load_device_config({"draft": "fpga", "verify": "cpu", "pipeline": "sync",
                              "fpga": {"board": "V80", "mode": "xrt", "xclbin": str(xclbin), "bits": 4},
                              "adaptive": {"k_max": 8, "threshold": 0.3}})
    assert cfg.fpga == FpgaOptions("v80", "xrt", str(xclbin), 4)
    assert cfg.adaptive == AdaptiveConfig(k_max=8, threshold=0.3)
    assert load_device_config({"draft": "fpga"}).fpga == FpgaOptions()  # fpga drafting gets default options
    assert load_device_config({"adaptive": True}).adaptive == AdaptiveConfig()


def test_relative_xclbin_is_found_next_to_the_config(tmp_path):
    (tmp_path / "k.xclbin").write_bytes(b"x")
    path = tmp_path / "devices.yaml"
    path.write_text("draft: fpga\nfpga:\n  mode: xrt\n  xclbin: k.xclbin\n")
    assert load_device_config(path).fpga.xclbin == str(tmp_path / "k.xclbin")


BAD = [
    ({"drafter": "cpu"}, "unknown key 'drafter'", "draft, verify, pipeline"),
    ({"draft": "gpu"}, "draft", "cpu, cuda or cuda:N"),
    ({"draft": 3}, "draft must be fpga, cpu or cuda:N", "got 3"),
    ({"verify": "fpga"}, "verify must be cpu or cuda:N", "only drafts"),
    ({"verify": "cuda:99"}, "verify", "cuda"),
    ({"draft": "cuda:99"}, "draft", "cuda"),
    ({"pipeline": "async"}, "pipeline must be one of sync, overlap", "'async'"),
    ({"fpga": "u280"}, "fpga must be a mapping of board, mode, xclbin, bits", "'u280'"),
    ({"fpga": {"boards": "u280"}}, "unknown key fpga.boards", "board, mode, xclbin, bits"),
    ({"fpga": {"board": "u300"}}, "fpga.board must be one of u280, u55c, u250, v80", "'u300'"),
    ({"fpga": {"mode": "hardware"}}, "fpga.mode must be one of emulate, xrt", "'hardware'"),
    ({"fpga": {"bits": 16}}, "fpga.bits must be one of 8, 4", "16"),
    ({"fpga": {"xclbin": "kernel.bin"}}, "fpga.xclbin must be a path to a .xclbin file", "kernel.bin"),
    ({"fpga": {"mode": "xrt"}}, "fpga.mode xrt needs fpga.xclbin", "emulate"),
    ({"fpga": {"mode": "xrt", "xclbin": "/nowhere/k.xclbin"}}, "fpga.mode xrt needs fpga.xclbin", "nowhere"),
    ({"adaptive": {"kmax": 4}}, "unknown key adaptive.kmax", "k_min, k_max, grow, shrink, threshold"),
    ({"adaptive": {"k_min": 0}}, "adaptive.k_min must be an integer >= 1", "got 0"),
    ({"adaptive": {"k_min": 4, "k_max": 2}}, "adaptive.k_max must be an integer >= 4", "got 2"),
    ({"adaptive": {"grow": 1.5}}, "adaptive.grow must be an integer >= 0", "1.5"),
    ({"adaptive": {"threshold": 1.0}}, "adaptive.threshold must be a number in (0, 1)", "1.0"),
    ({"adaptive": 7}, "adaptive must be a mapping", "7"),
]


@pytest.mark.parametrize("raw, first, second", BAD, ids=[str(b[0]) for b in BAD])
def test_each_mistake_is_one_line_naming_the_key(raw, first, second):
    with pytest.raises(UserError) as info:
        load_device_config(raw)
    message = str(info.value)
    assert "\n" not in message
    assert first in message and second in message


def test_absent_gpu_is_refused_on_a_machine_without_one():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UserError, match="verify: device 'cuda:0' requested but CUDA is not available"):
        load_device_config({"verify": "cuda:0"})


def test_file_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_device_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("draft: [cpu\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_device_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- cpu\n")
    with pytest.raises(UserError, match="must hold a YAML mapping"):
        load_device_config(tmp_path / "list.yaml")
    (tmp_path / "typo.yaml").write_text("draft: cpu\nverfy: cpu\n")
    with pytest.raises(UserError, match=r"typo.yaml: unknown key 'verfy'"):
        load_device_config(tmp_path / "typo.yaml")
