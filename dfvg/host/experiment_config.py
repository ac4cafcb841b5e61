"""The experiment YAML (`configs/*.yaml`) -> a frozen `ExperimentConfig`, refusing mistakes in one line.

Owns: the accepted keys and their allowed values, the seed's upper-case aliases (`TARGET_MODEL`,
`DRAFT_MODEL`, `BATCH_SIZE`), the optional `draft_params:` file (`configs/draft_params.yaml`), model pairs
registered by name in `configs/models.yaml` (`pair:`), and resolving relative paths. Model shapes never
appear here: they come from each checkpoint's `config.json`.

Does not own: the device mapping (`devices:`, a mapping or a YAML path such as
`configs/device_config.yaml`, is parsed by `dfvg.host.device_config`), running anything
(`dfvg.host.experiments`).

Relative paths are looked up in the working directory, then the config's folder, then its parent (so
`models/...` in `configs/default.yaml` works from anywhere inside or above the repository).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dfvg.config_file import read_yaml
from dfvg.errors import UserError
from dfvg.host.device_config import DeviceConfig, build_device_config, load_device_config
from dfvg.tree import TreeSpec, parse_tree_spec

VARIANTS = ("baseline", "speculative", "fpga", "overlap", "adaptive", "sweep", "batch")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ALIASES = {"TARGET_MODEL": "target_model", "DRAFT_MODEL": "draft_model", "BATCH_SIZE": "batch_size",
           "DRAFT_LENGTH": "draft_length", "MAX_NEW_TOKENS": "max_new_tokens", "NUM_RUNS": "num_runs"}
DRAFT_PARAMS_KEYS = ("draft_length", "draft_length_sweep")
REGISTRY = Path(__file__).resolve().parents[2] / "configs" / "models.yaml"


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: which models, which prompts, which variants, how often."""

    name: str
    target_model: Path
    draft_model: Path | None
    extra_drafts: dict[str, Path] = field(default_factory=dict)  # name -> checkpoint: speculative:<name> too
    dataset: str = "humaneval"
    num_prompts: int = 4
    max_new_tokens: int = 64
    draft_length: int = 4
    draft_length_sweep: tuple[int, ...] = ()
    tree: TreeSpec | None = None  # token trees for the sync speculative and fpga variants (dfvg.tree_step)
    batch_size: int = 1
    batch_sizes: tuple[int, ...] = ()  # the `batch` variant: plain and speculative at each batch size
    devices: DeviceConfig = field(default_factory=DeviceConfig)
    dtype: str = "auto"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    num_runs: int = 1
    warmup: bool = True
    eager: bool = False  # CUDA: the eager torch step instead of CUDA graphs + fused layers (debugging)
    tensor_parallel: int = 1  # ranks the target is split over (torchrun --nproc-per-node N; dfvg.parallel)
    variants: tuple[str, ...] = ("baseline", "speculative")
    cpu_watts_per_core: float | None = None
    threads: int | None = None
    output_dir: Path = Path("results")
    source: str = "<dict>"  # the file this came from, for messages and the report's provenance

    @property
    def uses_draft(self) -> bool:
        return any(v != "baseline" for v in self.variants)


# ---- value parsers: each returns the parsed value or raises ValueError("what is allowed") -------------

def _int(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return value
    return parse


def _float(low: float, high: float, low_open: bool = False) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value > high or value < low or (low_open and value == low):
            raise ValueError(f"must be a number in {'(' if low_open else '['}{low}, {high}]")
        return float(value)
    return parse


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return value
    return parse


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _int_list(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                              for v in value):
        raise ValueError("must be a list of integers >= 1, e.g. [1, 2, 4, 8]")
    return tuple(value)


def _variants(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or any(v not in VARIANTS for v in value):
        raise ValueError(f"must be a non-empty list drawn from {', '.join(VARIANTS)}")
    chosen = [v for v in VARIANTS if v in value]  # canonical order, baseline first, duplicates dropped
    return tuple(chosen if "baseline" in chosen else ["baseline", *chosen])  # speedups need the baseline


def _mapping_or_path(value: Any) -> Any:
    if not isinstance(value, (dict, str)):
        raise ValueError("must be a mapping (e.g. {draft: cpu, verify: cuda:0}) or a YAML file path")
    return value


def _named_paths(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                              for k, v in value.items()):
        raise ValueError("must be a mapping of names to checkpoint directories, e.g. {0.5b: models/DIR}")
    return dict(value)


def _tree(value: Any) -> TreeSpec:
    try:
        return parse_tree_spec(str(value))
    except UserError:
        raise ValueError("must be branching factors per depth (e.g. 2,2,1) or dynamic:N") from None


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else parse(value)


PARSERS: dict[str, Callable[[Any], Any]] = {
    "name": _text, "target_model": _text, "draft_model": _optional(_text), "pair": _text,
    "extra_drafts": _named_paths,
    "dataset": _text, "num_prompts": _int(1), "max_new_tokens": _int(1), "draft_length": _int(1),
    "draft_length_sweep": _int_list, "tree": _optional(_tree), "draft_params": _text, "batch_size": _int(1),
    "batch_sizes": _int_list,
    "devices": _mapping_or_path, "device_config": _text, "dtype": _choice(DTYPES),
    "temperature": _float(0.0, 100.0), "top_k": _int(0), "top_p": _float(0.0, 1.0, low_open=True),
    "seed": _int(0), "num_runs": _int(1), "warmup": _bool, "eager": _bool, "variants": _variants,
    "cpu_watts_per_core": _optional(_float(0.0, 1000.0, low_open=True)), "threads": _optional(_int(1)),
    "output_dir": _text, "tensor_parallel": _int(1),
}
PATH_KEYS = ("target_model", "draft_model", "draft_params", "device_config", "output_dir")


def canonical_keys(raw: dict, source: str) -> dict:
    """Map aliases to canonical keys and refuse unknown or duplicated ones."""
    out: dict = {}
    for key, value in raw.items():
        name = ALIASES.get(key, key)
        if name not in PARSERS:
            raise UserError(f"{source}: unknown key {key!r} (allowed: {', '.join(sorted(PARSERS))}; "
                            f"aliases: {', '.join(ALIASES)})")
        if name in out:
            raise UserError(f"{source}: {key!r} and {name!r} both given; keep one")
        out[name] = value
    return out


def parse_values(raw: dict, source: str) -> dict:
    parsed = {}
    for key, value in raw.items():
        try:
            parsed[key] = PARSERS[key](value)
        except ValueError as err:
            raise UserError(f"{source}: {key} {err}, got {value!r}") from None
    return parsed


def find_path(text: str, bases: tuple[Path, ...]) -> Path:
    """The first existing interpretation of a (relative) path; the first base's when none exists."""
    path = Path(text).expanduser()
    if path.is_absolute():
        return path
    for base in bases:
        if (base / path).exists():
            return (base / path).resolve()
    return (bases[0] / path).resolve()


def load_registry(path: Path = REGISTRY) -> dict[str, dict]:
    """Registered model pairs by name (configs/models.yaml, written by scripts/add_model.py)."""
    if not path.is_file():
        return {}
    pairs = read_yaml(path, "model registry").get("pairs") or {}
    if not isinstance(pairs, dict):
        raise UserError(f"{path}: 'pairs' must be a mapping of name -> {{target, draft}}")
    return pairs


def apply_pair(values: dict, source: str) -> None:
    """Fill target_model / draft_model from a registered pair name (explicit keys win)."""
    name = values.pop("pair", None)
    if name is None:
        return
    pairs = load_registry()
    if name not in pairs:
        raise UserError(f"{source}: pair {name!r} is not registered in {REGISTRY} (known: "
                        f"{', '.join(sorted(pairs)) or 'none'}); add it with scripts/add_model.py")
    values.setdefault("target_model", pairs[name]["target"])
    values.setdefault("draft_model", pairs[name].get("draft"))


def merge_draft_params(values: dict, bases: tuple[Path, ...], source: str) -> None:
    """`draft_params: FILE` supplies draft_length / draft_length_sweep unless the config sets them."""
    if "draft_params" not in values:
        return
    path = find_path(values.pop("draft_params"), bases)
    extra = read_yaml(path, "draft_params")
    unknown = sorted(set(extra) - set(DRAFT_PARAMS_KEYS))
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r} (allowed: {', '.join(DRAFT_PARAMS_KEYS)})")
    for key, value in parse_values(extra, str(path)).items():
        values.setdefault(key, value)


def check_model_dir(path: Path, key: str, source: str) -> None:
    if not (path / "config.json").is_file():
        raise UserError(f"{source}: {key} {path} is not a checkpoint directory (no config.json); download the "
                        f"model (python scripts/download_models.py) or edit the path in {source}")


def check_models(values: dict, source: str) -> None:
    check_model_dir(values["target_model"], "target_model", source)
    if any(v != "baseline" for v in values.get("variants", ExperimentConfig.variants)):
        if values["draft_model"] is None:
            raise UserError(f"{source}: the variants besides baseline need draft_model (a checkpoint "
                            "directory), or run only variants: [baseline]")
        check_model_dir(values["draft_model"], "draft_model", source)


def devices(value: dict | str | None, bases: tuple[Path, ...], source: str) -> DeviceConfig:
    """The device mapping: inline (checked here, named after this config) or a device_config YAML file."""
    if value is None:
        return DeviceConfig()
    if isinstance(value, str):
        return load_device_config(find_path(value, bases))
    return build_device_config(value, f"{source}: devices", bases[-1])


def build_config(raw: dict, source: str = "<dict>", base_dir: Path | None = None) -> ExperimentConfig:
    """Validate a raw mapping (from YAML or a script) into an ExperimentConfig."""
    bases = tuple(dict.fromkeys([Path.cwd()] + ([base_dir, base_dir.parent] if base_dir else [])))
    values = parse_values(canonical_keys(raw, source), source)
    apply_pair(values, source)
    merge_draft_params(values, bases, source)
    if "device_config" in values:
        if "devices" in values:
            raise UserError(f"{source}: give either devices or device_config, not both")
        values["devices"] = values.pop("device_config")
    if "target_model" not in values:
        raise UserError(f"{source}: target_model is required (the target checkpoint directory), or pair: NAME")
    for key in PATH_KEYS:
        if values.get(key) is not None:
            values[key] = find_path(str(values[key]), bases)
    values["extra_drafts"] = {name: find_path(path, bases) for name, path in values.get("extra_drafts", {}).items()}
    values.setdefault("name", Path(source).stem if source != "<dict>" else "experiment")
    values.setdefault("draft_model", None)
    values["devices"] = devices(values.get("devices"), bases, source)  # first: a GPU config refuses a CPU machine
    check_models(values, source)
    for name, path in values["extra_drafts"].items():
        check_model_dir(path, f"extra_drafts.{name}", source)
    cfg = ExperimentConfig(**values, source=source)
    if "sweep" in cfg.variants and not cfg.draft_length_sweep:
        raise UserError(f"{source}: variant sweep needs draft_length_sweep, e.g. [1, 2, 4, 8]")
    if "batch" in cfg.variants and not cfg.batch_sizes:
        raise UserError(f"{source}: variant batch needs batch_sizes, e.g. [1, 4, 16]")
    check_tensor_parallel(cfg)
    check_fpga_tree(cfg)
    if cfg.batch_sizes and max(cfg.batch_sizes) > cfg.num_prompts:
        raise UserError(f"{source}: batch_sizes {list(cfg.batch_sizes)} needs num_prompts >= {max(cfg.batch_sizes)}")
    return cfg


def check_fpga_tree(cfg: ExperimentConfig) -> None:
    """The fpga variant grows greedy trees only (`dfvg.fpga.datapath.tree_drafter`): refuse a sampled one at
    load, not after the other variants have run."""
    if cfg.tree is None or "fpga" not in cfg.variants:
        return
    if cfg.temperature > 0:
        raise UserError(f"{cfg.source}: a tree with temperature {cfg.temperature} cannot run on the fpga variant "
                        "(its datapath grows greedy trees); use temperature 0, or drop fpga from variants")


def check_tensor_parallel(cfg: ExperimentConfig) -> None:
    """A tensor-parallel target runs the sync schedule on one sequence: every rank must take the same steps,
    and the overlap schedule's draft thread and the batched forward have no sharded form yet."""
    unsupported = [v for v in ("overlap", "adaptive", "batch") if v in cfg.variants]
    if cfg.tensor_parallel > 1 and cfg.tree is not None:
        raise UserError(f"{cfg.source}: tree with tensor_parallel {cfg.tensor_parallel} is not supported yet; "
                        "drop tree or set tensor_parallel: 1")
    if cfg.tensor_parallel > 1 and (unsupported or cfg.batch_size > 1):
        what = f"variants {', '.join(unsupported)}" if unsupported else f"batch_size {cfg.batch_size}"
        raise UserError(f"{cfg.source}: tensor_parallel {cfg.tensor_parallel} runs the sync schedule at batch 1; "
                        f"drop {what} or set tensor_parallel: 1")


def load_experiment_config(source: str | Path | dict) -> ExperimentConfig:
    """An ExperimentConfig from a YAML path or an already-parsed mapping."""
    if isinstance(source, dict):
        return build_config(source)
    path = Path(source)
    return build_config(read_yaml(path), str(path), path.resolve().parent)


# ---- the pair registry (configs/models.yaml), written by scripts/add_model.py ---------------------------

REGISTRY_HEADER = """\
# DFVG model-pair registry: target -> draft, by name. scripts/add_model.py validates and adds pairs here
# (checkpoints load, safetensors present, tokenizers compatible); experiment configs can say `pair: NAME`
# and scripts/run_all.py picks the draft registered for a target. Paths are relative to the repository.
"""


def resolve_model(name_or_dir: str, role: str, registry: Path = REGISTRY) -> Path:
    """A checkpoint directory from a path, a folder name under models/, or (target only) a registered pair."""
    repo = registry.parent.parent
    for candidate in (Path(name_or_dir).expanduser(), repo / "models" / name_or_dir):
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    pairs = load_registry(registry)
    if name_or_dir in pairs:
        return find_path(pairs[name_or_dir]["target" if role == "target" else "draft"], (repo,))
    raise UserError(f"--{role} {name_or_dir!r} is neither a checkpoint directory (with config.json) nor a folder "
                    f"under {repo / 'models'}; download it (python scripts/download_models.py) or give its path")


def registered_draft(target: Path, registry: Path = REGISTRY) -> Path | None:
    """The draft registered for this target directory, if any."""
    repo = registry.parent.parent
    for entry in load_registry(registry).values():
        if find_path(str(entry.get("target", "")), (repo,)) == target.resolve() and entry.get("draft"):
            return find_path(str(entry["draft"]), (repo,))
    return None


def register_pair(name: str, target: Path, draft: Path, registry: Path = REGISTRY) -> None:
    """Add or replace `name` in the registry; written to a temp file and renamed (never half-written)."""
    repo = registry.parent.parent.resolve()

    def rel(path: Path) -> str:
        path = path.resolve()
        return str(path.relative_to(repo)) if path.is_relative_to(repo) else str(path)

    pairs = load_registry(registry)
    pairs[name] = {"target": rel(target), "draft": rel(draft)}
    text = REGISTRY_HEADER + yaml.safe_dump({"pairs": pairs}, sort_keys=False)
    tmp = registry.with_name(f".{registry.name}.tmp-{os.getpid()}")
    try:
        registry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, registry)
    except OSError as err:
        raise UserError(f"cannot write the model registry {registry} ({err.strerror}); make its folder "
                        "writable or pass another --registry") from None
    finally:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
