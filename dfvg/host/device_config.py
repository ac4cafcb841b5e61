"""The device mapping YAML (`configs/device_config.yaml`) -> a frozen `DeviceConfig`, refusing mistakes in one line.

Owns: which device drafts (`fpga`, `cpu`, `cuda:N`), which verifies (`cpu`, `cuda:N`), the pipeline schedule
(`sync` | `overlap`), the FPGA options (board, emulate | xrt, xclbin, weight bits), the optional adaptive
draft-length options and what happens when the draft device fails (`faults`: fallback devices, watchdog
deadline, retry back-off; `dfvg.fallback.FaultPolicy`). Every key is checked against this machine: a
`cuda:N` that is not here, an `xrt` mode without its xclbin file, an unknown key, each is refused with one
line naming the key and what is allowed.

Does not own: model paths and experiment knobs (`dfvg.host.experiment_config`), building drafters
(`dfvg.engine.make_drafter`), the adaptive policy itself (`dfvg.host.adaptive`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from dfvg.config_file import read_yaml
from dfvg.devices import resolve_device
from dfvg.errors import UserError
from dfvg.fallback import FaultPolicy
from dfvg.fpga.board.boards import BOARDS as BOARD_TABLE
from dfvg.fpga.datapath.drafter import BITS, MODES, FpgaOptions

PIPELINES = ("sync", "overlap")
BOARDS = tuple(BOARD_TABLE)


@dataclass(frozen=True)
class AdaptiveConfig:
    """Adaptive draft length (dfvg.host.adaptive): k grows by `grow` after a fully accepted block, shrinks
    by `shrink` after a rejection, within [k_min, k_max]; drafting stops early below `threshold` confidence."""

    k_min: int = 1
    k_max: int = 16
    grow: int = 2
    shrink: int = 1
    threshold: float | None = None


@dataclass(frozen=True)
class DeviceConfig:
    draft: str = "cpu"  # "fpga" | "cpu" | "cuda:N"
    verify: str = "cpu"  # "cpu" | "cuda:N"
    pipeline: str = "sync"
    fpga: FpgaOptions | None = None  # set when draft is fpga or the file has an fpga: section
    adaptive: AdaptiveConfig | None = None  # None: fixed draft length
    source: str = "<dict>"
    faults: FaultPolicy = FaultPolicy()  # a failed or hung draft device: fallback, watchdog, retry


TOP_KEYS = ("draft", "verify", "pipeline", "fpga", "adaptive", "faults")


def _fail(source: str, key: str, allowed: str, value: Any) -> UserError:
    return UserError(f"{source}: {key} must be {allowed}, got {value!r}")


def _device(value: Any, key: str, source: str, allow_fpga: bool) -> str:
    """A device name that exists on this machine (resolve_device's refusal, prefixed with the key)."""
    allowed = "fpga, cpu or cuda:N" if allow_fpga else "cpu or cuda:N"
    if not isinstance(value, str):
        raise _fail(source, key, allowed, value)
    if allow_fpga and value == "fpga":
        return value
    if value == "fpga":
        raise _fail(source, key, allowed + " (the FPGA only drafts)", value)
    try:
        return str(resolve_device(value))
    except UserError as err:
        raise UserError(f"{source}: {key}: {err}") from None


def _choice(value: Any, key: str, options: tuple, source: str) -> Any:
    if value not in options or isinstance(value, bool):
        raise _fail(source, key, "one of " + ", ".join(map(str, options)), value)
    return value


def _int(value: Any, key: str, source: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(source, key, f"an integer >= {minimum}", value)
    return value


def _section(raw: Any, cls: type, key: str, source: str) -> dict:
    """The mapping under `key`, refusing unknown sub-keys."""
    if not isinstance(raw, dict):
        raise _fail(source, key, "a mapping of " + ", ".join(f.name for f in fields(cls)), raw)
    allowed = [f.name for f in fields(cls)]
    for sub in raw:
        if sub not in allowed:
            raise UserError(f"{source}: unknown key {key}.{sub} (allowed: {', '.join(allowed)})")
    return raw


def parse_fpga(raw: Any, source: str, base_dir: Path | None) -> FpgaOptions:
    values = _section(raw, FpgaOptions, "fpga", source)
    board = _choice(str(values.get("board", "u280")).lower(), "fpga.board", BOARDS, source)
    mode = _choice(values.get("mode", "emulate"), "fpga.mode", MODES, source)
    bits = _choice(values.get("bits", 8), "fpga.bits", BITS, source)
    xclbin = values.get("xclbin")
    if xclbin is not None:
        if not isinstance(xclbin, str) or not xclbin.endswith(".xclbin"):
            raise _fail(source, "fpga.xclbin", "a path to a .xclbin file", xclbin)
        path = Path(xclbin).expanduser()
        if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
            path = base_dir / path
        xclbin = str(path)
    if mode == "xrt" and (xclbin is None or not Path(xclbin).is_file()):
        raise UserError(f"{source}: fpga.mode xrt needs fpga.xclbin, an existing .xclbin file (got {xclbin!r}); "
                        "build it with the Vivado flow in fpga/ or use mode: emulate")
    emulate_device = values.get("emulate_device", "cpu")
    if not isinstance(emulate_device, str) or not (emulate_device == "cpu" or emulate_device.startswith("cuda")):
        raise _fail(source, "fpga.emulate_device", "cpu, cuda or cuda:N", emulate_device)
    group_size = values.get("group_size", 128)
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise _fail(source, "fpga.group_size", "an integer >= 1", group_size)
    return FpgaOptions(board, mode, xclbin, bits, emulate_device, group_size)


def parse_adaptive(raw: Any, source: str) -> AdaptiveConfig:
    values = _section({} if raw is True else raw, AdaptiveConfig, "adaptive", source)
    k_min = _int(values.get("k_min", 1), "adaptive.k_min", source, 1)
    k_max = _int(values.get("k_max", 16), "adaptive.k_max", source, k_min)
    grow = _int(values.get("grow", 2), "adaptive.grow", source, 0)
    shrink = _int(values.get("shrink", 1), "adaptive.shrink", source, 0)
    threshold = values.get("threshold")
    if threshold is not None:
        ok = isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and math.isfinite(threshold)
        if not ok or not 0 < threshold < 1:
            raise _fail(source, "adaptive.threshold", "a number in (0, 1) or null", threshold)
        threshold = float(threshold)
    return AdaptiveConfig(k_min, k_max, grow, shrink, threshold)


def parse_faults(raw: Any, source: str) -> FaultPolicy:
    values = dict(_section(raw, FaultPolicy, "faults", source))
    fallback = values.get("fallback", [])
    if isinstance(fallback, str):
        fallback = [fallback]
    if not isinstance(fallback, list):
        raise _fail(source, "faults.fallback", "a list of draft devices (fpga, cpu, cuda:N)", fallback)
    values["fallback"] = tuple(_device(d, "faults.fallback", source, allow_fpga=True) for d in fallback)
    try:
        return FaultPolicy(**values)
    except (UserError, TypeError) as err:
        raise UserError(f"{source}: {err}") from None


def build_device_config(raw: dict, source: str = "<dict>", base_dir: Path | None = None) -> DeviceConfig:
    """Validate a raw mapping into a DeviceConfig (devices checked against this machine)."""
    for key in raw:
        if key not in TOP_KEYS:
            raise UserError(f"{source}: unknown key {key!r} (allowed: {', '.join(TOP_KEYS)})")
    draft = _device(raw.get("draft", "cpu"), "draft", source, allow_fpga=True)
    verify = _device(raw.get("verify", "cpu"), "verify", source, allow_fpga=False)
    pipeline = _choice(raw.get("pipeline", "sync"), "pipeline", PIPELINES, source)
    fpga = None
    if raw.get("fpga") is not None or draft == "fpga":
        fpga = parse_fpga(raw.get("fpga") or {}, source, base_dir)
    adaptive = None
    if raw.get("adaptive") not in (None, False):
        adaptive = parse_adaptive(raw["adaptive"], source)
    faults = parse_faults(raw["faults"], source) if raw.get("faults") is not None else FaultPolicy()
    return DeviceConfig(draft, verify, pipeline, fpga, adaptive, source, faults)


def load_device_config(source: str | Path | dict | DeviceConfig) -> DeviceConfig:
    """A DeviceConfig from a YAML path or an already-parsed mapping (a DeviceConfig is returned as is)."""
    if isinstance(source, DeviceConfig):
        return source
    if isinstance(source, dict):
        return build_device_config(source)
    path = Path(source)
    return build_device_config(read_yaml(path, "device config"), str(path), path.resolve().parent)
