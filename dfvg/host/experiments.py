"""Running an experiment config: every variant on every prompt, repeated, metered, then the reports.

Owns: the order of work (each repetition takes the prompts group by group and runs every variant on the
group before the next, so load bursts on a shared machine hit all variants alike), warm-up (graph capture
and compilation, once per process, reported as `warmup_s`), which engine step each variant gets (through
`dfvg.engine.Engine.decode`, batches through `run_batch`), the board projection of FPGA drafts, energy
metering per variant and prompt group, the progress bar, and handing a `RunResults` to
`dfvg.reports.write_run_reports`. Each model is loaded once for the whole run.

Variants: `baseline` (the target alone, autoregressive, measured in this same process), `speculative`
(sync, float draft on the draft device), `fpga` (sync, the bit-exact FPGA datapath emulated here, with
board-modeled draft times), `overlap` (draft and verify overlapped by the host runtime), `adaptive`
(overlap with the runtime's adaptive draft length), `sweep` (sync speculative at each draft length).

Does not own: the config format (`experiment_config`), the decoding loop and its steps (`dfvg.generate`,
`dfvg.engine`, `dfvg.host.pipeline`), report formats (`dfvg.reports`).
"""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dfvg import reports
from dfvg.checkpoint import load_config, resolve_dtype
from dfvg.datasets import load_prompts
from dfvg.devices import resolve_device
from dfvg.energy import EnergyMeter, Nvml
from dfvg.engine import Engine, load_verifier, make_drafter
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams, DraftWorkload
from dfvg.fpga.datapath.drafter import FpgaOptions
from dfvg.generate import GenerationResult, max_seq_len
from dfvg.host.adaptive import AdaptiveDraftLength
from dfvg.host.batch import run_batch
from dfvg.host.device_config import AdaptiveConfig, DeviceConfig, load_device_config
from dfvg.host.experiment_config import ExperimentConfig, load_experiment_config
from dfvg.host.plans import DESCRIPTIONS, Plan, batch_size_of, max_batch_size, plans
from dfvg.host.projection import modeled_prefill_s, project_times
from dfvg.host.records import Generation, RunResults, VariantResult
from dfvg.host.resume import Progress
from dfvg.host.timeline import Timeline
from dfvg.outputs import check_writable, remove_stale_temps
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
    """The FPGA drafter (when a variant drafts on it), its board and the resource-estimate inputs."""
    draft_cfg = load_config(cfg.draft_model)
    board_name = options.pop("board", "u280")
    if any(p.drafter == "fpga" for p in plans(cfg)):
        ctx.fpga_drafter = make_drafter(cfg.draft_model, "fpga", dtype, ctx.engine.verifier.vocab_size,
                                        board=board_name, **options)
    drafter = ctx.fpga_drafter
    ctx.board = getattr(drafter, "board", None) or get_board(board_name)
    ctx.fpga_design = getattr(drafter, "design", None) or DesignParams()
    ctx.fpga_workload = getattr(drafter, "workload", None) or DraftWorkload.from_model_config(draft_cfg)
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
    device = resolve_device(verify_device)
    dtype = resolve_dtype(cfg.dtype if cfg.dtype != "auto" else
                          ("bfloat16" if device.type == "cuda" else "float32"))
    verifier = load_verifier(cfg.target_model, device, dtype, fast=not cfg.eager)
    fallbacks = [make_drafter(cfg.draft_model, d, dtype, verifier.vocab_size, fast=not cfg.eager,
                              **(fpga_options(devices) if d == "fpga" else {}))
                 for d in devices.faults.fallback] if cfg.uses_draft else []
    engine = Engine(verifier, devices.faults, fallbacks)
    ctx = Context(cfg, nvml, tokenizer, prompts, engine, eos_token_ids(cfg.target_model),
                  SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p),
                  draft_device if draft_device != "fpga" else verify_device, verify_device, devices)
    if any(p.drafter == "torch" for p in plans(cfg)):
        ctx.torch_drafter = make_drafter(cfg.draft_model, ctx.draft_device, dtype, engine.verifier.vocab_size,
                                         fast=not cfg.eager)
    if "speculative" in cfg.variants:
        for name, path in cfg.extra_drafts.items():
            check_compatible(tokenizer, load_tokenizer(path), path)
            ctx.extra_drafters[name] = make_drafter(path, ctx.draft_device, dtype, engine.verifier.vocab_size,
                                                    fast=not cfg.eager)
    if cfg.draft_model is not None:
        load_fpga(cfg, ctx, dtype, fpga_options(devices))
    ctx.dtype = dtype
    return ctx


def drafter_of(plan: Plan, ctx: Context) -> Any:
    if plan.draft:
        return ctx.extra_drafters[plan.draft]
    return {"none": None, "torch": ctx.torch_drafter, "fpga": ctx.fpga_drafter}[plan.drafter]


def decode(plan: Plan, ctx: Context, ids: list[int], seed: int,
           max_new_tokens: int | None = None) -> tuple[GenerationResult, list[dict]]:
    """Decode one prompt the way the plan says, through the engine; returns the result and its timeline."""
    drafter = drafter_of(plan, ctx)
    adaptive = AdaptiveDraftLength.from_config(plan.draft_length, ctx.devices.adaptive or AdaptiveConfig()) \
        if plan.adaptive else None
    timeline = Timeline()
    mode = plan.mode if plan.mode != "ar" else "sync"
    result = ctx.engine.decode(drafter, ids, max_new_tokens or ctx.cfg.max_new_tokens, k=plan.draft_length,
                               eos_ids=ctx.eos_ids, sampling=ctx.sampling, seed=seed, mode=mode,
                               timeline=timeline, adaptive=adaptive)
    faults = [f.event().to_dict() for f in result.faults]
    if timeline.events:
        return result, [event_dict(e) for e in timeline.events] + faults
    draft_device = "fpga" if plan.drafter == "fpga" else ctx.draft_device
    return result, step_timeline(result, draft_device, ctx.verify_device) + faults  # a device step: one per step


def event_dict(event: Any) -> dict:
    """A host-runtime TimelineEvent as a plain dict (its extra fields, e.g. speculative, kept)."""
    return event.to_dict() if hasattr(event, "to_dict") else dataclasses.asdict(event)


def step_timeline(result: GenerationResult, draft_device: str, verify_device: str) -> list[dict]:
    """Timeline events rebuilt from measured step durations: in sync decoding the stages run back to back.
    Example: prefill 0.5 s, step 0 drafts 0.1 s and verifies 0.3 s -> draft [0.5, 0.6], verify [0.6, 0.9]."""
    events = [dict(stage="prefill", device=verify_device, start=0.0, end=result.prefill_s, tokens=0,
                   provenance="measured", step=-1)]
    t = result.prefill_s
    for i, s in enumerate(result.steps):
        if s.num_drafted:
            events.append(dict(stage="draft", device=draft_device, start=t, end=t + s.draft_s,
                               tokens=s.num_drafted, provenance="measured", step=i))
            t += s.draft_s
        events.append(dict(stage="verify", device=verify_device, start=t, end=t + s.verify_s,
                           tokens=s.num_accepted + 1, provenance="measured", step=i))
        t += s.verify_s
    return events


def project(plan: Plan, ctx: Context, result: GenerationResult, events: list[dict],
            prompt_len: int) -> tuple[float | None, str, str]:
    """(seconds, source, provenance) end to end with the draft on the modeled board; FPGA drafts only.

    dfvg.host.projection replays the measured schedule with each block's modeled time (the events carry it)."""
    if plan.drafter != "fpga" or ctx.fpga_drafter is None:
        return None, "", ""
    d = ctx.fpga_drafter
    prefill = modeled_prefill_s(d.workload, d.board, d.design, prompt_len)
    source = events if events and "modeled_s" in events[0] else result
    m = project_times(source, plan.mode, design=d.design, draft_prefill_s=prefill, board=d.board.name)
    return m["projected_s"].value, m["projected_s"].source, m["projected_s"].provenance


def largest_k(plans_: list[Plan], ctx: Context) -> list[int]:
    """Every draft length the plans use, the adaptive policy's k_max included."""
    ks = {p.draft_length for p in plans_ if p.drafter != "none"} | {1}
    if any(p.adaptive for p in plans_):
        ks.add((ctx.devices.adaptive or AdaptiveConfig()).k_max)
    return sorted(ks)


def reserve(plans_: list[Plan], ctx: Context) -> list[int]:
    """Size every graph cache for the run's longest prompt and largest batch up front (with or without a
    warm-up), so no prompt reallocates a cache and recaptures graphs inside its timing; the longest prompt."""
    longest = max(ctx.prompts, key=lambda p: len(p["ids"]))["ids"]
    k = max(largest_k(plans_, ctx))
    ctx.engine.reserve(max_seq_len(len(longest), ctx.cfg.max_new_tokens, k), max_batch_size(ctx.cfg))
    return longest


def warm_up(plans_: list[Plan], ctx: Context) -> float:
    """Capture/compile every graph the run replays and first-touch the weights, once; returns seconds.
    The engine captures the greedy shapes; one short decode per plan then takes each plan's own path
    (overlap, adaptive, sampling, FPGA) through its first calls outside any timing."""
    drafters = list({id(d): d for d in (drafter_of(p, ctx) for p in plans_)}.values())
    longest = reserve(plans_, ctx)
    seconds = ctx.engine.warm_up(drafters, longest, largest_k(plans_, ctx), ctx.cfg.max_new_tokens,
                                 batch=max_batch_size(ctx.cfg))
    start = time.perf_counter()
    with ctx.engine.warming():
        for plan in plans_:
            if batch_size_of(plan, ctx.cfg) == 1:
                decode(plan, ctx, longest[:24], seed=0,
                       max_new_tokens=min(plan.draft_length + 3, ctx.cfg.max_new_tokens))
    return seconds + time.perf_counter() - start


def skip_reason(plan: Plan, ctx: Context) -> str | None:
    """Why a variant cannot run with this config, or None."""
    if batch_size_of(plan, ctx.cfg) > 1 and plan.drafter != "none" and plan.mode == "overlap":
        return f"the overlap schedule decodes one sequence; batch_size={ctx.cfg.batch_size} runs sync only"
    return None


def new_variant(plan: Plan, ctx: Context) -> VariantResult:
    base = plan.name.split(":")[0]
    description = DESCRIPTIONS[base] + (f" = {plan.draft_length}" if base == "sweep" else "")
    if plan.draft:
        description += f", draft {ctx.cfg.extra_drafts[plan.draft]}"
    draft_device = {"none": None, "torch": ctx.draft_device, "fpga": "fpga"}[plan.drafter]
    return VariantResult(plan.name, description, plan.mode, plan.drafter, draft_device, ctx.verify_device,
                         plan.draft_length, plan.adaptive, fpga_power=ctx.fpga_power if plan.drafter == "fpga"
                         else None, skipped=skip_reason(plan, ctx))


def run_group(plan: Plan, variant: VariantResult, ctx: Context, run: int, first: int, bar: tqdm,
              stop: int | None = None) -> None:
    """One variant on one group of batch_size prompts (batched when there are several), metered."""
    group = ctx.prompts[first:min(first + batch_size_of(plan, ctx.cfg), stop or len(ctx.prompts))]
    bar.set_postfix_str(f"run {run + 1} {plan.name} {group[0]['id']}")
    with EnergyMeter(ctx.nvml, ctx.cfg.cpu_watts_per_core) as meter:
        if len(group) > 1:
            variant.generations += decode_batch(plan, ctx, group, first, run)
        else:
            variant.generations += [decode_one(plan, ctx, p, first + i, run) for i, p in enumerate(group)]
    bar.update(len(group))
    variant.energy += [(run, m) for m in meter.measurements()]
    variant.gpu_samples += meter.gpu_samples


def decode_one(plan: Plan, ctx: Context, prompt: dict, index: int, run: int) -> Generation:
    ids = prompt["ids"]
    result, timeline = decode(plan, ctx, ids, seed=ctx.cfg.seed + index)
    projected, source, provenance = project(plan, ctx, result, timeline, len(ids))
    return Generation(plan.name, run, prompt["id"], len(ids), list(result.tokens), ctx.detokenize(result.tokens),
                      result.stats(), list(result.steps), timeline, projected, source, provenance)


def decode_batch(plan: Plan, ctx: Context, group: list[dict], first: int, run: int) -> list[Generation]:
    """batch_size prompts through the host runtime's run_batch: one target forward per step for all rows.
    The shared timeline goes with the group's first generation; each row is charged 1/B of the time."""
    kind = plan.draft or plan.drafter  # an extra draft by its name, else torch / fpga / none
    if kind == "none":  # batched plain decoding: the baseline at the same batch size
        ctx.batch_drafters[kind] = [None] * max_batch_size(ctx.cfg)
    if kind not in ctx.batch_drafters:  # one drafter (its own KV cache) per row, made once, guarded alone
        device = "fpga" if kind == "fpga" else ctx.draft_device
        options = fpga_options(ctx.devices) if kind == "fpga" else {}
        path = ctx.cfg.extra_drafts[plan.draft] if plan.draft else ctx.cfg.draft_model
        ctx.batch_drafters[kind] = [ctx.engine.guard(make_drafter(path, device, ctx.dtype,
                                                                  ctx.engine.verifier.vocab_size, fast=False,
                                                                  **options), fallbacks=False)
                                    for _ in range(max_batch_size(ctx.cfg))]
    timeline = Timeline()
    results = run_batch(ctx.engine.verifier, ctx.batch_drafters[kind][:len(group)], [p["ids"] for p in group],
                        ctx.cfg.max_new_tokens, eos_ids=ctx.eos_ids, sampling=ctx.sampling, seed=ctx.cfg.seed + first,
                        draft_length=plan.draft_length, timeline=timeline)
    events = [event_dict(e) for e in timeline.events] + [f.event().to_dict() for r in results for f in r.faults]
    return [Generation(plan.name, run, p["id"], len(p["ids"]), list(r.tokens), ctx.detokenize(r.tokens), r.stats(),
                       list(r.steps), events if i == 0 else [], batch_share=1 / len(group))
            for i, (p, r) in enumerate(zip(group, results, strict=True))]


def execute(cfg: ExperimentConfig, ctx: Context, progress: Progress) -> dict[str, VariantResult]:
    chosen = plans(cfg)
    variants = {p.name: new_variant(p, ctx) for p in chosen}
    runnable = [p for p in chosen if variants[p.name].skipped is None]
    if cfg.warmup and runnable:
        ctx.warmup_s = warm_up(runnable, ctx)
    elif runnable:
        reserve(runnable, ctx)
    total = cfg.num_runs * len(runnable) * len(ctx.prompts)
    restored = progress.restore(variants)  # repetitions an interrupted run of the same command completed
    if restored:
        ctx.notes.append(f"the first {restored} of {cfg.num_runs} repetitions were measured by an interrupted "
                         "earlier run of the same command (dfvg.host.resume)")
    with tqdm(total=total, initial=total * restored // cfg.num_runs, desc=cfg.name, unit="gen", file=sys.stderr,
              dynamic_ncols=True, disable=None) as bar:  # no bar when stderr is not a terminal
        for run in range(restored, cfg.num_runs):
            chunk = math.lcm(*(batch_size_of(p, cfg) for p in runnable), 1)  # each variant takes these in turn
            for first in range(0, len(ctx.prompts), chunk):
                for plan in runnable:
                    end = min(first + chunk, len(ctx.prompts))
                    for group_first in range(first, end, batch_size_of(plan, cfg)):
                        run_group(plan, variants[plan.name], ctx, run, group_first, bar, stop=end)
            progress.save(run + 1, variants)
    return variants


def run_experiments(config: str | Path | dict | ExperimentConfig, output: str | Path | None = None) -> Path:
    """Run every configured variant and write one report directory; returns its path."""
    cfg = config if isinstance(config, ExperimentConfig) else load_experiment_config(config)
    root = Path(output) if output else cfg.output_dir
    check_writable(root, "--output (or output_dir)")
    progress = Progress.of(cfg, root)
    for swept in (root, progress.directory):  # what a killed earlier run left half-written
        remove_stale_temps(swept)
    done = progress.finished(root)
    if done is not None:  # an earlier run of this command was killed once its reports were written
        progress.clear()
        print(f"already finished: an interrupted earlier run of the same command wrote {done}", file=sys.stderr)
        print(f"reports: {done}")
        return done
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    started = datetime.now(timezone.utc)
    nvml = Nvml.open()
    with torch.inference_mode():  # the overlap pipeline's draft thread follows this mode (pipeline.py)
        ctx = build_context(cfg, nvml)
        variants = execute(cfg, ctx, progress)
    results = RunResults(
        config=cfg, run_id=f"{cfg.name}-{started.strftime('%Y%m%dT%H%M%SZ')}", variants=variants,
        started_utc=started.isoformat(timespec="seconds"),
        finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        board=ctx.board, fpga_workload=ctx.fpga_workload, fpga_design=ctx.fpga_design,
        gpu_reason=nvml.reason, gpu_names=nvml.names,
        peak_rss_b=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0, notes=ctx.notes,
        warmup_s=ctx.warmup_s)
    run_dir = reports.write_run_reports(results, root, before_rename=progress.finishing)
    progress.clear()
    print_summary(results, run_dir)
    return run_dir


def print_summary(results: RunResults, run_dir: Path) -> None:
    """One line per variant on stdout, then where the reports are."""
    from dfvg.host.records import fault_summary, mean_std, tokens_per_second_by_run

    base, _ = mean_std(tokens_per_second_by_run(results.baseline))
    for v in results.variants.values():
        if v.skipped:
            print(f"{v.name:<14} skipped: {v.skipped}")
            continue
        tps, std = mean_std(tokens_per_second_by_run(v))
        speedup = tps / base if base else 0.0
        faults = fault_summary(v)["draft_faults"]
        print(f"{v.name:<14} {tps:8.3f} ± {std:.3f} tok/s  speedup {speedup:5.2f}x  (measured)"
              + (f"  {faults} draft fault(s) survived" if faults else ""))
    print(f"reports: {run_dir}")

