"""One distillation run, end to end: prompts -> teacher data -> head vocabulary -> draft -> train -> eval -> save.

What this module owns: the run's options (`DistillOptions`, checked in one line each), the order of the
stages and what the recipe file records. Every stage is another module's: data.py / teacher.py (the
target's continuations, cached), vocab.py, train.py, evaluate.py, export.py, sizing.py. The script
`scripts/distill_draft.py` only parses flags into `DistillOptions` and prints the summary.

Validation and test prompts never reach training: neither their continuations nor their tokens' counts
(the head vocabulary is chosen from training continuations only). Their continuations are always greedy,
because the acceptance shortcut of evaluate.py is exact for greedy decoding. Validation is the end-of-run
evaluation (what runs and flags are compared on: `acceptance_before` / `acceptance_after`); test is
measured once at the end and only reported (`acceptance_test`): nothing here chooses by it.
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from dfvg.checkpoint import (
    checkpoint_dir,
    config_from_dict,
    is_feature_head,
    load_config,
    load_model,
    read_json,
    safetensors_files,
)
from dfvg.devices import resolve_device
from dfvg.distill import block, data, evaluate, export, feature, resume, sizing, teacher, train, vocab
from dfvg.errors import UserError
from dfvg.feature_head import FeatureHead, save_head_parts
from dfvg.sampling import SamplingParams
from dfvg.stats import Metric
from dfvg.tokenizer import eos_token_ids, load_tokenizer

INITS = ("target-pca", "random")
EMBEDS = ("head", "full")
SAVE_DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class DistillOptions:
    target: str
    output: str
    layers: int = 2
    hidden: int = 256
    heads: int = 0
    kv_heads: int = 0
    intermediate: int = 0
    vocab_top: int = 0  # 0 = full-vocabulary head
    embed: str = "head"  # input embedding over the head's rows, tied to it ("full": all rows, untied)
    save_dtype: str = "bfloat16"
    steps: int = 200
    batch_size: int = 8
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    prompts: str = "humaneval"
    val_fraction: float = 0.1  # what runs are judged and chosen on
    test_fraction: float = 0.25  # only reported; 0.25 = the first drafts' held-out set (data.split_of)
    max_prompt_tokens: int = 256
    max_new_tokens: int = 128
    teacher_top_k: int = 32
    teacher_temperature: float = 0.0
    sample_temperature: float = 0.7  # the extra continuations of a `source*N` prompt set
    teacher_batch: int = 16
    teacher_dtype: str = ""  # "" = bfloat16 on cuda, float32 on cpu
    init: str = "target-pca"
    init_from: str = ""  # a draft (or, with feature_head, a head) of this shape to start from (replaces --init's)
    eval_ks: tuple[int, ...] = (2, 4, 6, 8)
    board: str = "u280"
    verify_ms: float | None = None
    teacher_cache: str = ""  # "" = <output>/teacher
    checkpoint_dir: str = ""  # training checkpoints ("" = none, or --resume's folder when resuming)
    checkpoint_every: int = 0
    stop_after: int = 0  # steps this run may take, then checkpoint and stop (0 = all)
    time_budget: float = 0.0  # seconds of training this run may take, then checkpoint and stop (0 = no limit)
    resume: str = ""
    feature_head: bool = False  # an EAGLE-style head reading the target's features (dfvg.feature_head)
    feature_unroll: int = feature.UNROLL  # its loss: passes (the first reads the target's features) ...
    feature_weight: float = feature.FEATURE_WEIGHT  # ... and the weight of its feature regression
    block_size: int = 0  # > 0: a block drafter emitting that many tokens a pass (dfvg.block_draft); 0 = a chain

    def check(self) -> None:
        if self.vocab_top < 0 or self.teacher_top_k < 1 or self.max_new_tokens < 2 or self.max_prompt_tokens < 1:
            raise UserError("need --vocab-top >= 0, --teacher-top-k >= 1, --max-new-tokens >= 2, "
                            "--max-prompt-tokens >= 1")
        if self.embed not in EMBEDS or self.save_dtype not in SAVE_DTYPES:
            raise UserError(f"--embed must be one of {', '.join(EMBEDS)} and --save-dtype one of "
                            f"{', '.join(SAVE_DTYPES)}; got {self.embed!r} / {self.save_dtype!r}")
        if self.init not in INITS:
            raise UserError(f"--init must be one of {', '.join(INITS)}, got {self.init!r}")
        if self.teacher_batch < 1 or not self.eval_ks or min(self.eval_ks) < 1:
            raise UserError("need --teacher-batch >= 1 and --eval-k values >= 1")
        if self.verify_ms is not None and not self.verify_ms > 0:
            raise UserError(f"--verify-ms must be > 0, got {self.verify_ms}")
        SamplingParams(self.teacher_temperature)  # its own one-line check
        if not self.sample_temperature > 0:
            raise UserError(f"--sample-temperature must be > 0 (extra continuations are sampled), "
                            f"got {self.sample_temperature}")
        train.TrainParams(self.steps, self.batch_size, self.lr, seed=self.seed).check()
        if self.feature_unroll < 1 or not self.feature_weight >= 0:
            raise UserError(f"need --feature-unroll >= 1 and --feature-weight >= 0, got {self.feature_unroll} / "
                            f"{self.feature_weight}")
        self.checkpointing().check()
        self.shape()
        if self.block_size and max(self.eval_ks) > self.block_size:
            raise UserError(f"--block-size {self.block_size} trains a draft that drafts at most that many tokens a "
                            "pass: keep every --eval-k <= --block-size")

    def checkpointing(self) -> resume.Checkpointing:
        directory = self.checkpoint_dir or self.resume
        return resume.Checkpointing(Path(directory) if directory else None, self.checkpoint_every, self.stop_after,
                                    self.time_budget, Path(self.resume) if self.resume else None)

    def shape(self) -> export.DraftShape:
        embed_rows = self.embed == "head" and bool(self.vocab_top)  # a full-vocabulary head has all rows anyway
        return export.DraftShape(self.layers, self.hidden, self.heads, self.kv_heads, self.intermediate,
                                 self.vocab_top or None, embed_rows, self.block_size or None).resolved()


def teacher_sequences(opts: DistillOptions, prompts: list[data.Prompt], temperature: float, part: str,
                      loaded: dict, log) -> list[teacher.TeacherSequence]:
    """The target's continuations of `prompts`, from the cache when its recipe matches, else generated."""
    directory = Path(opts.teacher_cache or Path(opts.output) / "teacher") / part
    recipe = {"target": data.target_fingerprint(opts.target), "prompts_sha256": data.prompts_sha(prompts),
              "max_new_tokens": opts.max_new_tokens, "top_k": opts.teacher_top_k, "temperature": temperature,
              "seed": opts.seed, "dtype": teacher_dtype(opts), "batch": opts.teacher_batch}
    cached = data.load_teacher(directory, recipe)
    if cached is not None:
        log(f"teacher: reusing {len(cached)} cached {part} continuations from {directory}")
        return cached
    if "model" not in loaded:
        device = resolve_device(opts.device)
        loaded["model"] = load_model(opts.target, dtype=getattr(torch, teacher_dtype(opts)), device=device)
    sequences = teacher.generate_all(loaded["model"], [p.ids for p in prompts], opts.max_new_tokens,
                                     set(eos_token_ids(opts.target)), opts.teacher_top_k,
                                     SamplingParams(temperature), opts.seed, opts.teacher_batch, log)
    data.save_teacher(directory, sequences, recipe)
    return data.load_teacher(directory, recipe)  # as stored (fp16 probabilities): the same data on every resume


def check_fits_target(opts: DistillOptions, target_cfg) -> None:
    """The options that depend on the target, refused before the (slow) teacher phase writes anything."""
    if opts.vocab_top > target_cfg.vocab_size:
        raise UserError(f"--vocab-top must be in [1, {target_cfg.vocab_size}] (the target's vocabulary), "
                        f"got {opts.vocab_top}")
    if opts.init_from:
        check_init_shape(opts)
    if opts.init == "target-pca" and opts.shape().hidden > target_cfg.hidden_size:
        raise UserError(f"--init target-pca needs --hidden <= the target's hidden size {target_cfg.hidden_size}; "
                        "lower --hidden or pass --init random")


def check_init_shape(opts: DistillOptions) -> None:
    """--init-from's draft has this run's layers, width and head size (its head ids become this run's)."""
    if is_feature_head(opts.init_from) and not opts.feature_head:
        raise UserError(f"--init-from {opts.init_from} is a feature head: pass --feature-head to train it on (a "
                        "standalone draft cannot start from a head's body)")
    cfg, shape = load_config(opts.init_from), opts.shape()
    theirs = (cfg.num_layers, cfg.hidden_size, cfg.head_vocab_size or None)
    if theirs != (shape.layers, shape.hidden, shape.head_vocab):
        raise UserError(f"--init-from {opts.init_from}: its shape differs from this run's draft (layers, hidden, "
                        f"head vocabulary {theirs} against {(shape.layers, shape.hidden, shape.head_vocab)}); give "
                        "the --layers, --hidden and --vocab-top it was trained with")
    if cfg.block_size and cfg.block_size != shape.block_size:  # a chain draft may start a block run, not the reverse
        raise UserError(f"--init-from {opts.init_from} is a block drafter of size {cfg.block_size}, but this run's "
                        f"--block-size is {shape.block_size or 'not given'}; pass --block-size {cfg.block_size}")


def teacher_dtype(opts: DistillOptions) -> str:
    if opts.teacher_dtype:
        if opts.teacher_dtype not in ("float32", "bfloat16"):
            raise UserError(f"--teacher-dtype must be float32 or bfloat16, got {opts.teacher_dtype!r}")
        return opts.teacher_dtype
    return "bfloat16" if resolve_device(opts.device).type == "cuda" else "float32"


def target_end_tensors(target_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's embedding and LM head [V, Dt] in float32 (read alone, not the whole model)."""
    found = {}
    for file in safetensors_files(Path(target_dir)):
        with safe_open(str(file), framework="pt") as handle:
            for name in ("model.embed_tokens.weight", "lm_head.weight"):
                if name in handle.keys():
                    found[name] = handle.get_tensor(name).float()
    embed = found["model.embed_tokens.weight"]
    return embed, found.get("lm_head.weight", embed)


def build(opts: DistillOptions, train_seqs, target_raw: dict):
    """The untrained draft (seeded; PCA-initialised ends unless --init random), its config, head ids, token
    counts, shape and the PCA basis (None with --init random)."""
    target_cfg = load_config(opts.target)
    shape = opts.shape()
    counts = vocab.count_tokens(s.continuation for s in train_seqs)
    head_ids = None
    if opts.vocab_top and opts.init_from:  # the draft's rows stay the same tokens, whatever this data counts
        head_ids = vocab.head_ids_of(opts.init_from)
    elif opts.vocab_top:
        head_ids = vocab.choose_head_vocab(counts, opts.vocab_top, target_cfg.vocab_size, eos_token_ids(opts.target))
    hf_config = export.draft_hf_config(target_cfg, target_raw, shape)
    ends = target_end_tensors(opts.target) if shape.embed_rows or opts.init == "target-pca" else None
    rows = vocab.token_rows(ends[0], head_ids, resolve_device(opts.device)) if shape.embed_rows else None
    model = train.build_draft(config_from_dict(hf_config), head_ids, opts.seed, rows)
    basis = train.init_from_target(model, *ends) if opts.init == "target-pca" else None
    return model, hf_config, head_ids, counts, shape, basis


def sizing_report(cfg, opts: DistillOptions, log, feature_size: int = 0) -> dict:
    """Modeled U280 (or --board) fit and block time at int8 and int4, printed and returned for the recipe."""
    verify = None if opts.verify_ms is None else Metric(opts.verify_ms / 1e3, "s", "assumed", "--verify-ms")
    out = {}
    for bits in (8, 4):
        result = sizing.size_draft(cfg, bits, opts.board, k=max(opts.eval_ks), context_len=opts.max_prompt_tokens,
                                   feature_size=feature_size,
                                   verify=verify)
        for line in result.lines():
            log(f"sizing: {line}")
        out[f"int{bits}"] = {k: (v.to_dict() if isinstance(v, Metric) else v) for k, v in result.__dict__.items()}
    return out


def teacher_data(opts: DistillOptions, train_prompts: list[data.Prompt], val_prompts: list[data.Prompt],
                 test_prompts: list[data.Prompt], log) -> tuple[list, list, list]:
    """(train, validation, test) continuations; validation and test are greedy (evaluate.py is exact then)."""
    loaded: dict = {}
    train_seqs = teacher_sequences(opts, train_prompts, opts.teacher_temperature, "train", loaded, log)
    extra = [p for p in train_prompts for _ in range(p.samples - 1)]
    if extra:  # duplicates sit in one batch with their own uniforms, so each is a different sample
        train_seqs += teacher_sequences(opts, extra, opts.sample_temperature, "train-samples", loaded, log)
    val_seqs = teacher_sequences(opts, val_prompts, 0.0, "validation", loaded, log)
    test_seqs = teacher_sequences(opts, test_prompts, 0.0, "test", loaded, log)
    loaded.clear()
    gc.collect()
    return train_seqs, val_seqs, test_seqs


def acceptance(model, seqs: list[teacher.TeacherSequence], opts: DistillOptions, target=None,
               groups: list[str] | None = None) -> dict:
    """The draft's greedy acceptance table over `seqs` at every --eval-k (evaluate.py's exact shortcut; a
    feature head's steps are replayed with the target's features, dfvg.distill.feature). With `groups` (a
    name per sequence, e.g. its prompt source): (that table, {name: the table of its sequences}) from the same
    one pass."""
    ks = list(opts.eval_ks)
    if isinstance(model, FeatureHead) and model.body.config.block_size:  # teacher forced: exact, as a block's
        matches = block.block_matches(model, seqs, target=target)

        def table(rows):
            return block.block_table([matches[i] for i in rows], ks, opts.max_new_tokens)
    elif isinstance(model, FeatureHead):
        per_seq = feature.sequence_steps(model, target, seqs, ks, opts.max_new_tokens)

        def table(rows):
            return evaluate.steps_table({k: [s for i in rows for s in per_seq[i][k]] for k in ks})
    elif model.config.block_size:
        matches = block.block_matches(model, seqs)

        def table(rows):
            return block.block_table([matches[i] for i in rows], ks, opts.max_new_tokens)
    else:
        matches = evaluate.greedy_matches(model, seqs)

        def table(rows):
            return evaluate.acceptance_table([matches[i] for i in rows], ks, opts.max_new_tokens)
    everything = table(range(len(seqs)))
    if groups is None:
        return everything
    return everything, {n: table([i for i, g in enumerate(groups) if g == n]) for n in sorted(set(groups))}


def source_of(prompt: data.Prompt) -> str:
    """The prompt set a key came from ("humaneval/7" -> "humaneval", "pystdlib/json:dumps" -> "pystdlib")."""
    return prompt.key.split("/", 1)[0]


def as_feature_head(opts: DistillOptions, body, basis, rows, device) -> tuple[FeatureHead, object, train.BatchLoss]:
    """--feature-head: the body wrapped in a `FeatureHead`, the frozen target that gives its features (in the
    teacher's dtype), and the loss that reads them (a block feature head's with --block-size)."""
    target = load_model(opts.target, dtype=getattr(torch, teacher_dtype(opts)), device=device)
    head = FeatureHead(body, target.config.hidden_size)
    if opts.init_from and is_feature_head(opts.init_from):
        feature.load_projections(head, opts.init_from)
    else:
        feature.init_projections(head, basis, opts.seed, feature_in=not opts.init_from)
    if opts.block_size:
        return head, target, block.block_feature_loss(target, rows, opts.feature_weight)
    return head, target, feature.feature_loss(target, rows, opts.feature_unroll, opts.feature_weight)


def what_trains(opts: DistillOptions, body, basis, rows, device) -> tuple:
    """(the model trained, on `device`; the target a feature head reads, or None; its batch loss, None = the chain
    draft's; the loss's knobs, which a resumed run must share): a chain draft, a feature head or a block drafter."""
    if opts.feature_head:
        head, target, loss = as_feature_head(opts, body, basis, rows, device)
        knobs = {"feature_unroll": opts.feature_unroll, "feature_weight": opts.feature_weight}
        return head.to(device), target, loss, knobs | ({"block_size": opts.block_size} if opts.block_size else {})
    if opts.block_size:
        return body.to(device), None, block.block_loss(rows), {"block_size": opts.block_size}
    return body.to(device), None, None, {}


def feature_head_report(head: FeatureHead) -> dict:
    """What a feature head adds to its body: parameters, and the bytes of features sent per committed token."""
    return {"target_hidden_size": head.target_hidden_size,
            "projection_parameters": head.fuse.weight.numel() + head.predict.weight.numel(),
            "feature_bytes_per_token_bf16": 2 * head.target_hidden_size}


def vocab_source(opts: DistillOptions, train_prompts: int) -> str:
    """Where the head's ids came from, for draft_vocab.json."""
    if opts.init_from:
        return f"kept from --init-from {opts.init_from}"
    return f"continuations of {train_prompts} training prompts"


def run(opts: DistillOptions, log=print) -> dict:
    """Run every stage; write the draft to opts.output; return the summary (also in distill_recipe.json).

    A run stopped early by --stop-after / --time-budget returns {"finished": False, ...} after writing its
    training checkpoint, and exports nothing: the run that reaches --steps evaluates and exports."""
    opts.check()
    target_dir = checkpoint_dir(opts.target)
    device = resolve_device(opts.device)
    target_raw = read_json(target_dir / "config.json", "config.json")
    check_fits_target(opts, load_config(target_dir))
    prompts = data.load_prompt_ids(opts.prompts, load_tokenizer(target_dir), opts.max_prompt_tokens)
    train_prompts, val_prompts, test_prompts = data.split(prompts, opts.val_fraction, opts.test_fraction)
    log(f"data: {len(train_prompts)} train / {len(val_prompts)} validation / {len(test_prompts)} test prompts, "
        f"{sum(p.samples for p in train_prompts)} training continuations")
    train_seqs, val_seqs, test_seqs = teacher_data(opts, train_prompts, val_prompts, test_prompts, log)
    body, hf_config, head_ids, counts, shape, basis = build(opts, train_seqs, target_raw)
    init_sha = train.init_from_draft(body, opts.init_from) if opts.init_from else None
    rows = vocab.head_rows(body.head_token_ids if body.config.head_vocab_size else None, body.config.vocab_size, device)
    model, target, loss, settings = what_trains(opts, body, basis, rows, device)
    before = acceptance(model, val_seqs, opts, target)
    params = train.TrainParams(opts.steps, opts.batch_size, opts.lr, warmup=max(1, opts.steps // 20), seed=opts.seed)
    state = train.train(model, train_seqs, params, rows, device, log, ckpt=opts.checkpointing(), loss=loss,
                        loss_settings=settings)
    del loss  # a feature head's loss keeps the target's features (up to 16 GiB of the GPU): freed here
    splits = {"train_prompts": [p.key for p in train_prompts], "validation_prompts": [p.key for p in val_prompts],
              "test_prompts": [p.key for p in test_prompts]}
    if state.step < opts.steps:
        log(f"stopped at step {state.step}/{opts.steps}: continue with --resume {opts.checkpointing().directory}")
        return {"finished": False, "step": state.step, "checkpoint": str(opts.checkpointing().directory),
                "losses": state.losses, **splits}
    after = acceptance(model, val_seqs, opts, target)
    test, by_source = acceptance(model, test_seqs, opts, target, [source_of(p) for p in test_prompts])
    how = "replayed with the target's features" if opts.feature_head and not opts.block_size else "teacher-forced exact"
    for k in opts.eval_ks:
        log(f"eval (measured, greedy, {how}): k={k} validation acceptance "
            f"{before[k]['acceptance_rate']:.3f} -> {after[k]['acceptance_rate']:.3f}, tau "
            f"{after[k]['mean_accepted_length']:.2f}; test (reported only) {test[k]['acceptance_rate']:.3f}, tau "
            f"{test[k]['mean_accepted_length']:.2f}; by source: " +
            ", ".join(f"{n} {t[k]['mean_accepted_length']:.2f}" for n, t in by_source.items()))
    summary = {"finished": True, "options": asdict(opts), "shape": export.shape_dict(shape), **splits,
               "losses": state.losses, "acceptance_before": before, "acceptance_after": after,
               "acceptance_test": test,
               "acceptance_test_by_source": by_source, "init_from_sha256": init_sha,
               "head_coverage_of_train_tokens": vocab.coverage(counts, head_ids) if head_ids is not None else 1.0,
               "sizing": sizing_report(body.config, opts, log,
                                       model.target_hidden_size if opts.feature_head else 0)}
    if opts.feature_head:
        summary["feature_head"] = feature_head_report(model)
    output = Path(opts.output)
    export.save_draft(body.cpu(), output, hf_config, target_dir, summary, getattr(torch, opts.save_dtype))
    if opts.feature_head:
        save_head_parts(model, output, getattr(torch, opts.save_dtype))
    if head_ids is not None:
        vocab.save_vocab(output, head_ids, counts, vocab_source(opts, len(train_prompts)))
    return summary
