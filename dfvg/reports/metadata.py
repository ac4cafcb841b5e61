"""`run_metadata.json` + `config.yaml`: what is needed to reproduce or question a run.

Owns: the resolved config, the git commit (and whether the tree had local changes), the versions of the
packages DFVG's numbers depend on, and the hardware: CPU model, cores, RAM, GPUs. Read-only: git is asked
`rev-parse HEAD` and `status --porcelain`, nothing else.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml

from dfvg.host.records import RunResults

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("dfvg", "torch", "transformers", "tokenizers", "safetensors", "numpy", "matplotlib", "pyyaml",
            "tqdm", "nvidia-ml-py", "gguf")


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state() -> dict:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def hardware(results: RunResults) -> dict:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpus_usable": affinity,
            "ram_bytes": ram_bytes(), "gpus": results.gpu_names, "gpu_note": results.gpu_reason or None,
            "platform": platform.platform(), "python": sys.version.split()[0]}


def config_dict(cfg) -> dict:
    """The resolved config as plain YAML/JSON types (paths as strings, tuples as lists)."""
    def plain(value):
        if isinstance(value, Path):
            return str(value)
        if dataclasses.is_dataclass(value):
            return plain(dataclasses.asdict(value))
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {f.name: plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def config_text(cfg) -> str:
    """The config file as written (when it came from a file), else the resolved config as YAML."""
    source = Path(cfg.source)
    if cfg.source != "<dict>" and source.is_file():
        return source.read_text()
    return yaml.safe_dump(config_dict(cfg), sort_keys=False)


def run_metadata(results: RunResults) -> dict:
    return {"run_id": results.run_id, "started_utc": results.started_utc, "finished_utc": results.finished_utc,
            "command": sys.argv, "config_source": results.config.source, "config": config_dict(results.config),
            "git": git_state(), "packages": package_versions(), "hardware": hardware(results),
            "notes": results.notes}
