"""Running an experiment config: every variant on every prompt, repeated, metered, then the reports.

Owns: the order of work (each repetition takes the prompts group by group and runs every variant on the
group before the next, so load bursts on a shared machine hit all variants alike), warm-up (graph capture
and compilation, once per process, reported as `warmup_s`), which engine step each variant gets (through
`dfvg.engine.Engine.decode`, batches through `run_batch`), the board projection of FPGA drafts, energy
metering per variant and prompt group, the progress bar, and handing a `RunResults` to
`dfvg.reports.write_run_reports`. Each model is loaded once for the whole run. With `tensor_parallel: N`
(under torchrun) every rank runs the same plans in lockstep and rank 0 alone saves progress and writes reports.

Variants: `baseline` (the target alone, autoregressive, measured in this same process), `speculative`
(sync, float draft on the draft device), `fpga` (sync, the bit-exact FPGA datapath emulated here, with
board-modeled draft times), `overlap` (draft and verify overlapped by the host runtime), `adaptive`
(overlap with the runtime's adaptive draft length), `sweep` (sync speculative at each draft length).

Does not own: the config format (`experiment_config`), loading models and prompts (`context`), the decoding
loop and its steps (`dfvg.generate`, `dfvg.engine`, `dfvg.host.pipeline`), report formats (`dfvg.reports`).
"""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dfvg import reports
from dfvg.checkpoint import is_feature_head
from dfvg.energy import EnergyMeter, Nvml
from dfvg.engine import make_drafter
from dfvg.generate import GenerationResult, max_seq_len
from dfvg.gpu.graph_drafter import GraphDrafter
from dfvg.gpu.tree_device import tree_room
from dfvg.host.adaptive import AdaptiveDraftLength
from dfvg.host.context import Context, build_context, drafter_of, fpga_options
from dfvg.host.device_config import AdaptiveConfig
from dfvg.host.experiment_config import ExperimentConfig, load_experiment_config
from dfvg.host.plans import DESCRIPTIONS, Plan, batch_size_of, max_batch_size, plans
from dfvg.host.projection import modeled_prefill_s, project_times
from dfvg.host.records import Generation, RunResults, VariantResult
from dfvg.host.resume import Progress
from dfvg.host.timeline import Timeline
from dfvg.outputs import check_writable, remove_stale_temps
from dfvg.parallel import group


def decode(plan: Plan, ctx: Context, ids: list[int], seed: int,
           max_new_tokens: int | None = None) -> tuple[GenerationResult, list[dict]]:
    """Decode one prompt the way the plan says, through the engine; returns the result and its timeline."""
    drafter = drafter_of(plan, ctx)
    adaptive = AdaptiveDraftLength.from_config(plan.draft_length, ctx.devices.adaptive or AdaptiveConfig()) \
        if plan.adaptive else None
    timeline = Timeline()
    mode = plan.mode if plan.mode != "ar" else "sync"
    tree = ctx.cfg.tree if plan.drafter in ("torch", "fpga") and mode == "sync" and adaptive is None else None
    result = ctx.engine.decode(drafter, ids, max_new_tokens or ctx.cfg.max_new_tokens, k=plan.draft_length,
                               eos_ids=ctx.eos_ids, sampling=ctx.sampling, seed=seed, mode=mode,
                               timeline=timeline, adaptive=adaptive, tree=tree)
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
    if plan.drafter != "fpga" or ctx.fpga_drafter is None or not group.leads():  # rank 0 alone drafts and reports
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
    room = tree_room(ctx.cfg.tree, k) if ctx.cfg.tree is not None else 0
    ctx.engine.reserve(max_seq_len(len(longest), ctx.cfg.max_new_tokens, k) + room, max_batch_size(ctx.cfg),
                       [drafter_of(plan, ctx) for plan in plans_])
    return longest


def warm_up(plans_: list[Plan], ctx: Context) -> float:
    """Capture/compile every graph the run replays and first-touch the weights, once; returns seconds.
    The engine captures the greedy shapes; one short decode per plan then takes each plan's own path
    (overlap, adaptive, sampling, FPGA) through its first calls outside any timing."""
    drafters = list({id(d): d for d in (drafter_of(p, ctx) for p in plans_)}.values())
    longest = reserve(plans_, ctx)
    threshold = any(p.adaptive for p in plans_) and (ctx.devices.adaptive or AdaptiveConfig()).threshold is not None
    seconds = ctx.engine.warm_up(drafters, longest, largest_k(plans_, ctx), ctx.cfg.max_new_tokens,
                                 batch=max_batch_size(ctx.cfg), tree=ctx.cfg.tree, confidence=threshold)
    start = time.perf_counter()
    shapes = {(plan.name, min(batch_size_of(plan, ctx.cfg), end - first)): plan  # each (variant, group size)
              for plan, first, end in schedule(plans_, ctx.cfg, len(ctx.prompts))}
    with ctx.engine.warming():
        for (_, rows), plan in shapes.items():
            max_new_tokens = min(plan.draft_length + 3, ctx.cfg.max_new_tokens)
            if rows == 1:
                decode(plan, ctx, longest[:24], seed=0, max_new_tokens=max_new_tokens)
            else:
                decode_batch(plan, ctx, [{"id": "warm-up", "ids": longest[:24]}] * rows, 0, 0,
                             max_new_tokens=max_new_tokens)
    return seconds + time.perf_counter() - start


def skip_reason(plan: Plan, ctx: Context) -> str | None:
    """Why a variant cannot run with this config, or None. A feature head (dfvg.feature_head) drafts from the
    features of the block just verified, one sequence at a time: with one as the draft, the baseline, its sync
    variants and the batch variant's plain rows still run, and the rest are reported as skipped."""
    batched = batch_size_of(plan, ctx.cfg) > 1 and plan.drafter != "none"
    if batched and plan.mode == "overlap":
        return f"the overlap schedule decodes one sequence; batch_size={ctx.cfg.batch_size} runs sync only"
    draft = ctx.cfg.extra_drafts[plan.draft] if plan.draft else ctx.cfg.draft_model
    if plan.drafter == "none" or draft is None or not is_feature_head(draft):
        return None
    if plan.mode == "overlap":
        return "a feature head drafts in the sync schedule only (it reads the features of the block just verified)"
    if batched:
        return f"a feature head drafts one sequence at a time; batch size {batch_size_of(plan, ctx.cfg)} needs a " \
               "standalone draft"
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


def batch_drafter_factory(plan: Plan, ctx: Context) -> Callable[[], Any] | None:
    """How a batch plan makes its drafters: first the run's own graph drafter (greedy on graph models, the
    engine lets it draft every row from a cache row per sequence: `Engine.batch_drafters`), then, and for
    every other drafter, a new eager one per call (each keeps one sequence's state)."""
    if plan.drafter == "none":
        return None
    device = "fpga" if plan.drafter == "fpga" else ctx.draft_device
    options = fpga_options(ctx.devices) if plan.drafter == "fpga" else {}
    path = ctx.cfg.extra_drafts[plan.draft] if plan.draft else ctx.cfg.draft_model
    fresh = lambda: make_drafter(path, device, ctx.dtype, ctx.engine.verifier.vocab_size, fast=False,  # noqa: E731
                                 verifier=ctx.engine.verifier, **options)
    single = drafter_of(plan, ctx)
    if not isinstance(single, GraphDrafter):
        return fresh
    unused = [single]  # a sampled batch takes it for its first row only: rows must not share a model
    return lambda: unused.pop() if unused else fresh()


def decode_batch(plan: Plan, ctx: Context, group: list[dict], first: int, run: int,
                 max_new_tokens: int | None = None) -> list[Generation]:
    """batch_size prompts through the engine's batch: one target forward per step for all rows.
    The shared timeline goes with the group's first generation; each row is charged 1/B of the time."""
    kind = plan.draft or plan.drafter  # an extra draft by its name, else torch / fpga / none
    if kind not in ctx.batch_drafters:  # made once: one graph drafter for all rows, or one per row
        ctx.batch_drafters[kind] = ctx.engine.batch_drafters(batch_drafter_factory(plan, ctx),
                                                             max_batch_size(ctx.cfg), ctx.sampling)
    timeline = Timeline()
    results = ctx.engine.decode_batch(ctx.batch_drafters[kind][:len(group)], [p["ids"] for p in group],
                                      max_new_tokens or ctx.cfg.max_new_tokens, k=plan.draft_length,
                                      eos_ids=ctx.eos_ids, sampling=ctx.sampling, seed=ctx.cfg.seed + first,
                                      timeline=timeline)
    events = [event_dict(e) for e in timeline.events] + [f.event().to_dict() for r in results for f in r.faults]
    return [Generation(plan.name, run, p["id"], len(p["ids"]), list(r.tokens), ctx.detokenize(r.tokens), r.stats(),
                       list(r.steps), events if i == 0 else [], batch_share=1 / len(group))
            for i, (p, r) in enumerate(zip(group, results, strict=True))]


def schedule(runnable: list[Plan], cfg: ExperimentConfig, num_prompts: int) -> Iterator[tuple[Plan, int, int]]:
    """(plan, first prompt of its group, end of the chunk) in run order: the prompts go in chunks of the lcm
    of the batch sizes, and within a chunk each variant takes them in turn, a group of its batch size at a
    time (the last group of a chunk may be smaller)."""
    chunk = math.lcm(*(batch_size_of(p, cfg) for p in runnable), 1)
    for first in range(0, num_prompts, chunk):
        end = min(first + chunk, num_prompts)
        for plan in runnable:
            for group_first in range(first, end, batch_size_of(plan, cfg)):
                yield plan, group_first, end


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
              dynamic_ncols=True, disable=None if group.leads() else True) as bar:  # no bar off a terminal
        for run in range(restored, cfg.num_runs):
            for plan, group_first, end in schedule(runnable, cfg, len(ctx.prompts)):
                run_group(plan, variants[plan.name], ctx, run, group_first, bar, stop=end)
            if group.leads():
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
    if not group.leads():  # a tensor-parallel rank other than 0 decoded in lockstep; rank 0 reports
        return root
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

