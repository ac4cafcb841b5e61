"""What one experiment loads once: tokenizer, encoded prompts, the engine on the target, every drafter its
variants use (the FPGA drafter with its board), and the lookup from a variant's plan to its drafter.

Split from `dfvg.host.experiments` (which runs the variants) so loading and running read apart. With
`tensor_parallel: N` every rank loads its own shard of the target here (`dfvg.parallel`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from dfvg.checkpoint import is_feature_head, load_config, resolve_dtype
from dfvg.datasets import load_prompts
from dfvg.devices import resolve_device
from dfvg.energy import Nvml
from dfvg.engine import Engine, load_verifier, make_drafter
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams
from dfvg.fpga.board.workload import draft_workload
from dfvg.fpga.datapath.drafter import FpgaOptions
from dfvg.host.device_config import DeviceConfig, load_device_config
from dfvg.host.experiment_config import ExperimentConfig
from dfvg.host.plans import Plan, plans
from dfvg.parallel import group
from dfvg.sampling import SamplingParams
from dfvg.stats import Metric
from dfvg.tokenizer import check_compatible, check_fits, encode, eos_token_ids, load_tokenizer
from dfvg.tokenizer import decode as decode_text


@dataclass
class Context:
    """Loaded models and encoded prompts of one experiment."""

    cfg: ExperimentConfig
    nvml: Nvml
    tokenizer: Any
    prompts: list[dict]  # {"id", "prompt", "ids"}
    engine: Engine
    eos_ids: list[int]
    sampling: SamplingParams
    draft_device: str
    verify_device: str
    devices: DeviceConfig | None = None
    torch_drafter: Any = None
    extra_drafters: dict = field(default_factory=dict)  # extra_drafts name -> its drafter
    fpga_drafter: Any = None
    fpga_power: Metric | None = None
    board: Any = None
    fpga_workload: Any = None
    fpga_design: Any = None
    dtype: torch.dtype = torch.float32
    warmup_s: float = 0.0
    batch_drafters: dict = field(default_factory=dict)  # drafter kind -> one drafter per batch row
    notes: list[str] = field(default_factory=list)

    def detokenize(self, tokens: list[int]) -> str:
        return decode_text(self.tokenizer, tokens)


def fpga_options(devices: DeviceConfig) -> dict:
    """FpgaDrafter options from the device config's fpga section (defaults when it has none)."""
    fpga = devices.fpga or FpgaOptions()
    return {k: v for k, v in dataclasses.asdict(fpga).items() if v is not None}


def load_prompts_ids(cfg: ExperimentConfig, tokenizer: Any) -> list[dict]:
    prompts = load_prompts(cfg.dataset, cfg.num_prompts)
    return [{**p, "ids": encode(tokenizer, p["prompt"])} for p in prompts]


def load_fpga(cfg: ExperimentConfig, ctx: Context, dtype: torch.dtype, options: dict) -> None:
    """The FPGA drafter (when a variant drafts on it), its board and the resource-estimate inputs (none for a
    feature head that no variant drafts on the FPGA: its board figures come from its integer artifact)."""
    drafts_on_fpga = any(p.drafter == "fpga" for p in plans(cfg))
    if is_feature_head(cfg.draft_model) and not drafts_on_fpga:
        return
    draft_cfg = load_config(cfg.draft_model)
    board_name = options.pop("board", "u280")
    if drafts_on_fpga:
        ctx.fpga_drafter = make_drafter(cfg.draft_model, "fpga", dtype, ctx.engine.verifier.vocab_size,
                                        verifier=ctx.engine.verifier, board=board_name, **options)
    drafter = ctx.fpga_drafter
    ctx.board = getattr(drafter, "board", None) or get_board(board_name)
    ctx.fpga_design = getattr(drafter, "design", None) or DesignParams()
    bits, group = options.get("bits", 8), options.get("group_size", 128)
    ctx.fpga_workload = getattr(drafter, "workload", None) or draft_workload(draft_cfg, bits, group)
    b = ctx.board
    ctx.fpga_power = Metric(b.power_w, "W", b.power_provenance, f"{b.name}: {b.power_source}")


def build_context(cfg: ExperimentConfig, nvml: Nvml) -> Context:
    """Load tokenizer, prompts, target and drafters once for the whole experiment."""
    devices = load_device_config(cfg.devices)
    draft_device, verify_device = devices.draft, devices.verify
    tokenizer = load_tokenizer(cfg.target_model)
    if cfg.uses_draft:
        check_compatible(tokenizer, load_tokenizer(cfg.draft_model), cfg.draft_model)
    prompts = load_prompts_ids(cfg, tokenizer)
    check_fits(prompts, cfg.max_new_tokens, load_config(cfg.target_model).max_position_embeddings, cfg.dataset)
    tensor_parallel = group.start(cfg.tensor_parallel, verify_device, cfg.target_model,
                                  flag=f"{cfg.source}: tensor_parallel")
    device = tensor_parallel.device if tensor_parallel else resolve_device(verify_device)
    dtype = resolve_dtype(cfg.dtype if cfg.dtype != "auto" else
                          ("bfloat16" if device.type == "cuda" else "float32"))
    verifier = load_verifier(cfg.target_model, device, dtype, fast=not cfg.eager, tensor_parallel=tensor_parallel)
    fallbacks = [make_drafter(cfg.draft_model, d, dtype, verifier.vocab_size, fast=not cfg.eager, verifier=verifier,
                              **(fpga_options(devices) if d == "fpga" else {}))
                 for d in devices.faults.fallback] if cfg.uses_draft else []
    engine = Engine(verifier, devices.faults, fallbacks)
    ctx = Context(cfg, nvml, tokenizer, prompts, engine, eos_token_ids(cfg.target_model),
                  SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p),
                  draft_device if draft_device != "fpga" else verify_device, verify_device, devices)
    if any(p.drafter == "torch" for p in plans(cfg)):
        ctx.torch_drafter = make_drafter(cfg.draft_model, ctx.draft_device, dtype, engine.verifier.vocab_size,
                                         fast=not cfg.eager, verifier=engine.verifier)
    if "speculative" in cfg.variants:
        for name, path in cfg.extra_drafts.items():
            check_compatible(tokenizer, load_tokenizer(path), path)
            ctx.extra_drafters[name] = make_drafter(path, ctx.draft_device, dtype, engine.verifier.vocab_size,
                                                    fast=not cfg.eager, verifier=engine.verifier)
    if cfg.draft_model is not None:
        load_fpga(cfg, ctx, dtype, fpga_options(devices))
    ctx.dtype = dtype
    return ctx


def drafter_of(plan: Plan, ctx: Context) -> Any:
    if plan.draft:
        return ctx.extra_drafters[plan.draft]
    return {"none": None, "torch": ctx.torch_drafter, "fpga": ctx.fpga_drafter}[plan.drafter]
