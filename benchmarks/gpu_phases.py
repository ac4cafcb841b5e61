"""The phases of benchmarks/gpu_speed.py: correctness checks, DFVG variants, Hugging Face peers, FPGA drafter.

Each `phase_<name>(args, models) -> dict` returns a JSON-able payload; `timed_runs` (gpu_speed.py) does
the warm-up, the synchronized per-prompt timing and the per-prompt token lists.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpu_speed import KERNELS, cuda_median_ms, save, sync, timed_runs
from dfvg.drafter import TorchDrafter
from dfvg.engine import Engine
from dfvg.errors import UserError
from dfvg.generate import generate
from dfvg.gpu import fast
from dfvg.gpu.graph_drafter import GraphDrafter, draft_graph, graph_drafter
from dfvg.gpu.graph_head import GraphBlockFeatureDrafter, GraphFeatureDrafter
from dfvg.gpu.graphs import GraphVerifier, token_graph
from dfvg.gpu.tree_device import tree_room
from dfvg.verifier import TorchVerifier


def ks(args) -> list[int]:
    return list(args.ks)


def tree_depth(args) -> int:
    return getattr(args, "tree_depth", 4)


def cache_len(models, args) -> int:
    """Cache slots every DFVG row fits in (trees need their candidates' slots too), so no prompt reallocates
    a cache and recaptures graphs inside its timing."""
    longest = max(len(p["ids"]) for p in models["prompts"])
    trees = max((tree_room(spec, tree_depth(args)) for spec in getattr(args, "trees", [])), default=0)
    return longest + args.max_new_tokens + max(ks(args)) + 16 + trees


def graph_pair(args, models, kernels: str = "fused", draft: str = "draft") -> tuple[GraphVerifier, GraphDrafter | None]:
    """One verifier and drafter pair per kernel choice, kept in `models` so graphs are captured once."""
    key = ("graphs", kernels, draft)
    if key not in models:
        n = cache_len(models, args)
        opts = {"compile_blocks": kernels == "compiled", "fused_layers": kernels == "fused", "cache_len": n}
        if ("verifier", kernels) not in models:  # one target per kernel choice, shared by every draft
            models[("verifier", kernels)] = GraphVerifier(models["target"], **opts)
        drafter = None if models.get(draft) is None else graph_drafter(  # a chain's or a block drafter's
            models[draft], models["target"].config.vocab_size, **opts)
        models[key] = (models[("verifier", kernels)], drafter)
    return models[key]


ENGINES: dict[int, Engine] = {}


def engine_for(verifier) -> Engine:
    """One engine per verifier, as `dfvg generate` / `dfvg run` hold one: its captured steps are reused."""
    return ENGINES.setdefault(id(verifier), Engine(verifier))


def dfvg_runner(verifier, drafter, k: int, n: int, loop: str = "fast", tree=None):
    """The product's path: `Engine.decode` (the device step for a graph pair, the device tree step with
    `tree`); "host": the host step."""
    if loop == "fast":
        engine = engine_for(verifier)
        return lambda ids: _out(engine.decode(drafter, ids, n, k=k, tree=tree))
    return lambda ids: _out(generate(verifier, ids, n, drafter=drafter, draft_length=k))


def _out(result):
    return result.tokens, {**result.stats(), "per_position_acceptance": None}


def prefix_match(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def phase_check(args, models) -> dict:
    """Token match on 2 prompts x 32 tokens: HF greedy vs DFVG eager vs graph paths; logits difference."""
    n, prompts = 32, models["prompts"][:2]
    hf = models["hf_target"]
    eager = TorchVerifier(models["target"])
    draft = "draft" if models.get("draft") is not None else "distilled"  # --skip-draft: the distilled one
    verifier, drafter = graph_pair(args, models, args.kernels, draft)
    rows = []
    for p in prompts:
        ids = p["ids"]
        ref = hf_generate(hf, None, 0, n, args.device)(ids)[0]
        out = {"hf": ref, "dfvg_eager": generate(eager, ids, n).tokens,
               "dfvg_eager_spec_k4": generate(eager, ids, n, drafter=TorchDrafter(models[draft]),
                                              draft_length=4).tokens,
               "graph_plain": engine_for(verifier).decode(None, ids, n, k=0).tokens,
               "graph_fast_k4": engine_for(verifier).decode(drafter, ids, n, k=4).tokens,
               "graph_loop_k4": generate(verifier, ids, n, drafter=drafter, draft_length=4).tokens}
        rows.append({"id": p["id"], **{k: prefix_match(v, ref) for k, v in out.items()}})
    with torch.inference_mode():
        ids = torch.tensor([prompts[0]["ids"]], device=args.device)
        pos = torch.arange(ids.shape[1], device=args.device)
        models["target"].setup_cache(1, verifier.gm.cache_len)
        ref_logits = models["target"](ids, pos[None])[0].float()
        verifier.gm.ensure_cache(verifier.gm.cache_len - 32)
        got = verifier.gm.forward(ids, pos).float()
    rel = ((got - ref_logits).norm() / ref_logits.norm()).item()
    print(f"  prefix match with HF greedy (of {n}): {rows}\n  graph-forward vs eager logits rel. diff {rel:.2e}")
    return {"tokens": n, "prefix_match_vs_hf": rows, "graph_vs_eager_logits_rel_diff": rel}


def step_times(verifier: GraphVerifier, drafter: GraphDrafter, k_values: list[int], reps: int = 50) -> dict:
    """Median CUDA-event time of one graph replay: target T=1, target T=k+1, draft k-step block."""
    def timed(graph) -> float:
        return cuda_median_ms(graph.replay, reps)

    start = verifier.gm.scratch_pos - 40
    out = {"target_T1_ms": timed(token_graph(verifier.gm, [0], start, False).graph)}
    for k in k_values:
        out[f"target_T{k + 1}_ms"] = timed(token_graph(verifier.gm, [0] * (k + 1), start, False).graph)
        out[f"draft_k{k}_ms"] = timed(draft_graph(drafter.gm, k, verifier.vocab_size).graph)
        out[f"draft_over_target_k{k}"] = out[f"draft_k{k}_ms"] / out[f"target_T{k + 1}_ms"]
    return out


def phase_dfvg(args, models) -> dict:
    """DFVG plain and speculative (GPU draft) with the fused device loop; generic loop at k=4; the other
    kernel choices (compiled blocks, eager kernels) as plain (and k=4) rows; the distilled draft if loaded."""
    n, prompts, dev = args.max_new_tokens, models["prompts"], args.device
    verifier, drafter = graph_pair(args, models, args.kernels)
    start = time.perf_counter()
    engine_for(verifier).decode(None, prompts[0]["ids"], 4, k=0)
    runs = {"capture_plain_s": time.perf_counter() - start, "kernels": args.kernels,
            "why_not_fused": verifier.gm.why_not_fused}
    runs.update(chain_rows(args, "dfvg_plain", f"dfvg plain ({args.kernels})", prompts,
                           dfvg_runner(verifier, None, 0, n)))
    if drafter is not None:
        for k in ks(args):
            runs.update(chain_rows(args, f"dfvg_spec_k{k}", f"dfvg spec gpu-draft k={k}", prompts,
                                   dfvg_runner(verifier, drafter, k, n)))
        runs["dfvg_loop_k4"] = timed_runs("dfvg generic loop k=4", prompts,
                                          dfvg_runner(verifier, drafter, 4, n, "loop"), dev)
        runs.update(tree_runs(args, prompts, verifier, drafter, "dfvg_tree"))
        if dev.startswith("cuda"):  # CUDA events
            runs["step_times"] = step_times(verifier, drafter, ks(args))
            print(f"  step times {runs['step_times']}", flush=True)
    if "distilled" in models:
        _, small = graph_pair(args, models, args.kernels, "distilled")
        for k in ks(args):
            runs.update(chain_rows(args, f"dfvg_distilled_k{k}", f"dfvg spec distilled-draft k={k}", prompts,
                                   dfvg_runner(verifier, small, k, n)))
        runs.update(tree_runs(args, prompts, verifier, small, "dfvg_distilled_tree"))
        if dev.startswith("cuda"):
            runs["step_times_distilled"] = step_times(verifier, small, ks(args))
    for draft in [key for key in models if isinstance(key, str) and key.startswith("extra:")]:
        runs.update(extra_draft_rows(args, models, draft, verifier))
    if "feature_head" in models:
        head_verifier, head = feature_pair(args, models, prompts[0]["ids"])
        for k in ks(args):
            runs.update(chain_rows(args, f"dfvg_feature_k{k}", f"dfvg spec feature-head k={k}", prompts,
                                   dfvg_runner(head_verifier, head, k, n)))
        runs.update(tree_runs(args, prompts, head_verifier, head, "dfvg_feature_tree"))
    for key in [key for key in models if isinstance(key, str) and key.startswith("extra-head:")]:
        runs.update(extra_head_rows(args, models, key))
    for other in (kind for kind in KERNELS if kind != args.kernels and not args.one_kernel):
        other_verifier, _ = graph_pair(args, models, other)
        runs[f"dfvg_{other}_plain"] = timed_runs(f"dfvg plain ({other})", prompts,
                                                 dfvg_runner(other_verifier, None, 0, n), dev)
    if args.one_kernel:
        return runs
    eager = TorchVerifier(models["target"])
    runs["dfvg_plain_eager"] = timed_runs("dfvg plain (eager, 3 prompts)", prompts[:3],
                                          lambda ids: _out(generate(eager, ids, n)), dev)
    return runs


def extra_draft_rows(args, models: dict, draft: str, verifier: GraphVerifier) -> dict:
    """--extra-drafts: a standalone draft's rows at each --ks its blocks can hold (a block drafter's at most its
    block size), through the product's path, and the CUDA-event time of its k = 4 draft replay."""
    _, drafter = graph_pair(args, models, args.kernels, draft)
    name, runs = draft.split(":", 1), {}
    size = getattr(drafter, "block_size", None)
    for k in (k for k in ks(args) if size is None or k <= size):
        runs.update(chain_rows(args, f"dfvg_{name[1]}_k{k}", f"dfvg spec {name[1]} k={k}", models["prompts"],
                               dfvg_runner(verifier, drafter, k, args.max_new_tokens)))
    if args.device.startswith("cuda"):
        k = min(4, size or 4)
        graph = drafter._graph(k).graph if size else draft_graph(drafter.gm, k, verifier.vocab_size).graph
        runs[f"draft_block_k{k}_ms_{name[1]}"] = cuda_median_ms(graph.replay)
        print(f"  {name[1]}: k = {k} draft replay {runs[f'draft_block_k{k}_ms_{name[1]}']:.3f} ms", flush=True)
    return runs


def extra_head_rows(args, models: dict, key: str) -> dict:
    """--extra-heads: a feature head's rows at each --ks it can make in one block (a block feature head's at most its
    block size), through the product's path (`feature_pair`), and the CUDA-event time of its k = 4 block replay
    (the c = k + 1 catch-up graph, a full acceptance's)."""
    name = key.split(":", 1)[1]
    verifier, head = feature_pair(args, models, models["prompts"][0]["ids"], key)
    size, runs = head.block_size, {}
    for k in (k for k in ks(args) if size is None or k <= size):
        runs.update(chain_rows(args, f"dfvg_{name}_k{k}", f"dfvg spec {name} k={k}", models["prompts"],
                               dfvg_runner(verifier, head, k, args.max_new_tokens)))
    if args.device.startswith("cuda"):
        k = min(4, size or 4)
        runs[f"draft_block_k{k}_ms_{name}"] = cuda_median_ms(head._graph(k + 1, k).graph.replay)
        print(f"  {name}: k = {k} head block replay {runs[f'draft_block_k{k}_ms_{name}']:.3f} ms", flush=True)
    return runs


def chain_rows(args, name: str, label: str, prompts: list[dict], runner) -> dict:
    """The row `name` of `runner`; with --lookahead, the same runner again right after it with
    `dfvg.gpu.fast.LOOKAHEAD` flipped (the device step launching its next replay before the host reads this one's
    record), so both sides come from one process and one runner."""
    rows = {name: timed_runs(label, prompts, runner, args.device)}
    if args.lookahead:
        shipped = fast.LOOKAHEAD
        fast.LOOKAHEAD = not shipped
        try:
            suffix = "no_lookahead" if shipped else "lookahead"
            rows[f"{name}_{suffix}"] = timed_runs(f"{name}, {suffix.replace('_', ' ')}", prompts, runner, args.device)
        finally:
            fast.LOOKAHEAD = shipped
    return rows


def feature_pair(args, models: dict, warm_ids: list[int],
                 key: str = "feature_head") -> tuple[GraphVerifier, GraphFeatureDrafter]:
    """The feature head's pair as `make_drafter` builds it on CUDA, warmed on `warm_ids`: a target verifier of
    its own (a head turns feature writes on; the shared one also serves the other rows of this process),
    every verify length and every block graph captured before anything is timed."""
    head_verifier = GraphVerifier(models["target"], compile_blocks=args.kernels == "compiled",
                                  fused_layers=args.kernels == "fused", cache_len=cache_len(models, args))
    kind = GraphBlockFeatureDrafter if models[key].body.config.block_size else GraphFeatureDrafter  # as make_drafter
    head = kind(models[key], head_verifier, head_verifier.vocab_size, compile_blocks=args.kernels == "compiled",
                cache_len=cache_len(models, args), fused_layers=args.kernels == "fused")
    dfvg_runner(head_verifier, head, max(ks(args)), args.max_new_tokens)(warm_ids)  # caches sized
    head_verifier.prepare(max(ks(args)) + 1)
    head.prepare(max(ks(args)))
    return head_verifier, head


def tree_runs(args, prompts: list[dict], verifier, drafter, prefix: str) -> dict:
    """Each `--trees` shape at draft length `--tree-depth` (4 unless given) through `Engine.decode(tree=...)`,
    greedy: the device tree step (a feature head's too, through its `FeatureFeeder`)."""
    runs, depth = {}, tree_depth(args)
    for spec in args.trees:
        name = f"{prefix}_{spec.label().replace(',', '-').replace(':', '')}" + ("" if depth == 4 else f"_d{depth}")
        # the product's warm-up (`dfvg run`, `dfvg generate`): it also captures the plain lead a prompt too short
        # for the tree takes, which warming on prompt 0 alone leaves to the first short prompt's timing
        engine_for(verifier).warm_up([drafter], prompts[0]["ids"], [depth], args.max_new_tokens, tree=spec)
        runs[name] = timed_runs(f"dfvg tree {spec.label()} depth {depth} ({prefix})", prompts,
                                dfvg_runner(verifier, drafter, depth, args.max_new_tokens, tree=spec), args.device)
    return runs


def hf_config(model, n: int):
    cfg = copy.deepcopy(model.generation_config)
    cfg.max_new_tokens, cfg.min_new_tokens, cfg.do_sample = n, None, False
    cfg.temperature = cfg.top_p = cfg.top_k = None
    cfg.eos_token_id, cfg.pad_token_id = None, 0  # fixed-length runs: EOS does not stop
    return cfg


def hf_generate(model, assistant, k: int, n: int, device: str, **extra):
    """A runner of HF generate(), assisted by `assistant` with k draft tokens when given. The assistant's own
    generation config is shared by every runner made with it, so each run sets its k there when it runs (runners
    of several k may exist at once: hf_assist chooses among them)."""
    cfg = hf_config(model, n)
    kwargs = dict(extra)
    if assistant is not None:
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = k, "constant"
        kwargs["assistant_model"] = assistant

    @torch.inference_mode()
    def run(ids: list[int]):
        if assistant is not None:
            a = assistant.generation_config
            a.num_assistant_tokens, a.num_assistant_tokens_schedule = k, "constant"
            a.assistant_confidence_threshold = 0.0
        x = torch.tensor([ids], device=device)
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=cfg, **kwargs)
        return out[0, len(ids):].tolist(), None

    return run


def phase_hf_eager(args, models) -> dict:
    run = hf_generate(models["hf_target"], None, 0, args.max_new_tokens, args.device)
    run(models["prompts"][0]["ids"][:64])  # short warm-up
    return {"hf_eager": timed_runs("hf generate() eager", models["prompts"], run, args.device, warm=False)}


def assist_split(args, count: int) -> tuple[list[int], list[int]]:
    """(validation, held-out) prompt indices of hf_assist: none choose k when --ks has one; else the first
    --hf-validation choose it, and at least one prompt must be left to quote it on (one line otherwise)."""
    if len(ks(args)) == 1:
        return [], list(range(count))
    if not 1 <= args.hf_validation < count:
        raise SystemExit(f"error: --hf-validation {args.hf_validation} must be >= 1 and leave held-out prompts "
                         f"({count} prompts)")
    return list(range(args.hf_validation)), list(range(args.hf_validation, count))


def phase_hf_assist(args, models) -> dict:
    """HF assisted generation with the 0.5B draft at each k of --ks. With several, k is chosen on the first
    --hf-validation prompts and quoted on the rest, held out from the choice (as llama.cpp's draft length): the
    peer's best k without choosing it on the prompts it is quoted on."""
    prompts, out = models["prompts"], {}
    valid, held = assist_split(args, len(prompts))
    runs = {}
    for k in ks(args):
        runs[k] = hf_generate(models["hf_target"], models["hf_draft"], k, args.max_new_tokens, args.device)
        runs[k](prompts[0]["ids"][:64])
    best = ks(args)[0]
    if valid:
        tried = {k: timed_runs(f"hf assisted k={k} (valid.)", [prompts[i] for i in valid], runs[k], args.device,
                               warm=False) for k in ks(args)}
        best = max(tried, key=lambda k: tried[k]["tokens_per_s"])
        out["hf_assist_validation"] = {"prompt_indices": valid, "chosen_k": best, **{
            f"k{k}": {"tokens_per_s": r["tokens_per_s"], "new_tokens": r["new_tokens"]} for k, r in tried.items()}}
        save(args, "hf_assist", dict(out))  # a timed-out call keeps the choice
    result = timed_runs(f"hf assisted k={best}", [prompts[i] for i in held], runs[best], args.device, warm=False)
    if valid:
        result["prompt_indices"] = held
    out[f"hf_assist_k{best}"] = result
    return out


def phase_hf_static(args, models) -> dict:
    """HF's documented fast path: a StaticCache of fixed length (one shape) and generate()'s auto-compile."""
    from transformers import StaticCache

    model = models["hf_target"]
    cache = StaticCache(config=model.config, max_cache_len=cache_len(models, args))
    run_inner = hf_generate(model, None, 0, args.max_new_tokens, args.device, past_key_values=cache)

    def run(ids):
        with torch.inference_mode():  # the cache's tensors were made under inference mode
            cache.reset()
        return run_inner(ids)

    start = time.perf_counter()
    run(models["prompts"][0]["ids"])
    run(models["prompts"][1]["ids"])
    warm_s = time.perf_counter() - start
    result = timed_runs("hf static cache + compile", models["prompts"], run, args.device, warm=False)
    return {"hf_static_compile": result, "warmup_compile_s": warm_s,
            "compiled": hasattr(model, "_compiled_call") and model._compiled_call is not None}


def fpga_drafter(args, models, verifier):
    """The FPGA drafter of the run's draft: a standalone draft's `FpgaDrafter`, or a feature head's
    `FpgaFeatureDrafter` reading `verifier`'s features (its scales calibrated on the same target)."""
    from dfvg.fpga.datapath.drafter import FpgaDrafter
    from dfvg.fpga.datapath.feature_drafter import FpgaFeatureDrafter

    vocab, artifact = models["target"].config.vocab_size, Path(args.work_dir) / "fpga_artifact"
    if args.fpga_head:  # calibrated on the target's checkpoint as this run saved it (hf_from_gguf)
        target_dir = Path(args.work_dir) / "target"
        if not (target_dir / "config.json").is_file():
            raise UserError(f"--fpga-head calibrates on the target's checkpoint, but {target_dir} holds none "
                            "(transformers did not save the GGUF-converted target); run without --fpga-head")
        return FpgaFeatureDrafter.from_checkpoint(args.fpga_head, verifier, target_dir, vocab,
                                                  emulate_device=args.device, artifact_dir=artifact.with_name(
                                                      "fpga_artifact_head"))
    draft_dir = Path(args.distilled_draft) if args.distilled_draft else Path(args.work_dir) / "draft"
    if args.tiny:
        draft_dir = Path(tempfile.mkdtemp()) / "draft"
        models["hf_draft"].save_pretrained(draft_dir)
    return FpgaDrafter.from_checkpoint(draft_dir, target_vocab_size=vocab, emulate_device=args.device,
                                       artifact_dir=artifact)


def fpga_runner(verifier, drafter, k: int, n: int, mode: str):
    """One prompt through the engine in `mode` (sync: the captured verify-and-accept fed with the board's
    drafts; overlap: the host pipeline), with its end-to-end time projected onto the modeled board:
    dfvg.host.projection replays the recorded schedule with each draft block's modeled time (discarded blocks
    drafted ahead included) and every verify step as measured (transfers, acceptance and sync included), so
    the overlap projection uses a pre-drafted block only where the pipeline did: block fully accepted and the
    bonus guessed."""
    from dfvg.host.projection import modeled_prefill_s, project_times
    from dfvg.host.timeline import Timeline

    engine = engine_for(verifier)

    def run(ids: list[int]):
        timeline = Timeline()
        result = engine.decode(drafter, ids, n, k=k, mode=mode, timeline=timeline)
        prefill = modeled_prefill_s(drafter.workload, drafter.board, drafter.design, len(ids))
        source = timeline if timeline.events else result  # the device step records steps, not events
        projected = project_times(source, mode, design=drafter.design, draft_prefill_s=prefill,
                                  board=drafter.board.name)["projected_s"]
        tokens, stats = _out(result)
        stats.update(projected_s=projected.value, projected_provenance=projected.provenance, mode=mode)
        return tokens, stats

    return run


def phase_fpga(args, models) -> dict:
    """FPGA-emulated draft (integer datapath on this GPU) in the sync and overlap schedules of the host
    pipeline: measured, and projected onto the board model (`fpga_runner`).

    The draft is the FPGA-sized distilled one (`--distilled-draft`; the 0.5B does not fit a board's memory),
    or the feature head of `--fpga-head` (sync only: a head drafts from the block just verified)."""
    n, dev = args.max_new_tokens, args.device
    prompts = models["prompts"][: max(3, args.prompts // 4)]
    verifier, _ = graph_pair(args, models, args.kernels)
    if args.fpga_head:  # a verifier of its own: a head turns feature writes on for good (as `feature_pair`)
        verifier = GraphVerifier(models["target"], compile_blocks=args.kernels == "compiled",
                                 fused_layers=args.kernels == "fused", cache_len=cache_len(models, args))
    start = time.perf_counter()
    drafter = fpga_drafter(args, models, verifier)
    out = {"fpga_build_s": time.perf_counter() - start, "fpga_prompts": len(prompts),
           "fpga_draft": str(args.fpga_head or args.distilled_draft or "0.5B work-dir copy")}
    from dfvg.fpga.datapath.feature_drafter import FpgaFeatureDrafter

    modes = ("sync",) if isinstance(drafter, FpgaFeatureDrafter) else ("sync", "overlap")
    for k in args.fpga_ks:
        for mode in modes:
            out[f"fpga_{mode}_k{k}"] = timed_runs(f"fpga-emulated {mode} k={k}", prompts,
                                                  fpga_runner(verifier, drafter, k, n, mode), dev)
        save(args, "fpga", dict(out))
    sync(dev)
    return out
