"""The distillation loop: a small draft learns the target's next-token distribution on its own continuations.

What this module owns: building and initialising the draft (`build_draft`, optional PCA projection of the
target's embedding and head), the loss (`distill_loss`), teacher-forced batches, and the seeded training
loop, which can stop early and resume (the checkpoint itself is resume.py's). What it does not own: the
data (data.py, teacher.py), the exported draft folder (export.py).

Why this loss: speculative decoding accepts a draft token with probability sum_x min(p(x), q(x)), which
grows as q approaches p; forward KL(p || q) on the target's own continuations (DistillSpec's on-policy
data, teacher forced) pushes q towards p where the target actually goes. The target's distribution is kept
as its top-K ids and probabilities; everything else, and every top-K id outside the draft's head, is one
"tail" bucket, so the loss is the exact KL between the two distributions coarsened to
{top-K ids in the head} + {tail}: finite even though the draft gives ids outside its head probability 0.

Training runs the draft's real `Transformer.forward` (the same code the drafters run), in float32 (TF32
matmuls on a GPU); a fresh KV cache per step keeps autograd from reaching into the previous step's graph.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from dfvg.checkpoint import checkpoint_dir, is_feature_head, load_model, safetensors_files
from dfvg.devices import tf32_matmuls
from dfvg.distill import resume
from dfvg.distill.teacher import TeacherSequence
from dfvg.errors import UserError
from dfvg.feature_head import WEIGHTS_FILE as FEATURE_WEIGHTS_FILE
from dfvg.model import ModelConfig, Transformer

INIT_STD = 0.02


@dataclass(frozen=True)
class TrainParams:
    steps: int = 200
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0

    def check(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or not self.lr > 0 or self.warmup < 0:
            raise UserError(f"need --steps >= 1, --batch-size >= 1, --lr > 0, warmup >= 0; got {self}")


def build_draft(cfg: ModelConfig, head_ids: Tensor | None, seed: int, rows: Tensor | None = None) -> Transformer:
    """A seeded random draft (normal(0, 0.02) matrices, zero biases, unit norms), on the CPU in float32;
    `rows` is the token -> embedding-row table of a draft with `embed_rows`."""
    generator = torch.Generator().manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
        if head_ids is not None:
            model.head_token_ids.copy_(head_ids)
        if cfg.embed_rows:
            model.token_rows.copy_(rows)
    return model


@torch.no_grad()
def init_from_target(model: Transformer, embed: Tensor, head: Tensor) -> Tensor:
    """Start the draft's embedding and head as the target's [V, Dt] tensors projected on their shared top-D
    principal directions (the draft then begins with the target's token geometry, not noise); returns
    that basis [Dt, D] (a feature head starts its projections from it).

    Rows are rescaled to the target's per-element RMS; the head (and, with `embed_rows`, the embedding)
    keeps only the rows of the head's ids.
    """
    d = model.config.hidden_size
    if d > embed.shape[1]:
        raise UserError(f"--init target-pca needs --hidden <= the target's hidden size {embed.shape[1]}")
    head_rows = head[model.head_token_ids.cpu()] if model.config.head_vocab_size else head
    stacked = torch.cat([embed.float(), head_rows.float()])  # [V + Vh, Dt]
    covariance = stacked.T @ stacked  # [Dt, Dt]
    _, vectors = torch.linalg.eigh(covariance.double())
    basis = vectors[:, -d:].flip(-1).float()  # [Dt, d], largest component first
    embed_rows = embed[model.head_token_ids.cpu()] if model.config.embed_rows else embed
    for tensor, source in ((model.tok_embeddings.weight, embed_rows.float()), (model.output.weight, head_rows.float())):
        projected = source @ basis
        tensor.copy_(projected * (source.pow(2).mean().sqrt() / projected.pow(2).mean().sqrt().clamp_min(1e-12)))
    return basis


@torch.no_grad()
def init_from_draft(model: Transformer, directory: str) -> str:
    """Start `model` as the standalone draft in `directory` (--init-from: a feature head begins as the draft
    it extends, a draft trains on from an earlier run, a block drafter starts from a chain draft), or as the
    body of the feature head there (a head trains on: its projections are `feature.load_projections`'s);
    returns the sha256 of that folder's weight files (a head's projections included).

    The draft must have this run's shape (same --layers/--hidden/--vocab-top); anything else is refused in
    one line. The run's head vocabulary is that draft's (pipeline.build), so regenerated teacher data that
    counts tokens a little differently still continues it."""
    source = load_model(directory, feature_head_body=True)
    theirs, ours = source.state_dict(), model.state_dict()
    if "block_masks" in ours and "block_masks" not in theirs:  # a block drafter from a chain draft: its masks
        theirs["block_masks"] = ours["block_masks"]  # start from build_draft's seeded noise
    shapes = {n: tuple(t.shape) for n, t in ours.items()}
    if {n: tuple(t.shape) for n, t in theirs.items()} != shapes:
        raise UserError(f"--init-from {directory}: its shape differs from this run's draft; give the same "
                        "--layers, --hidden, --vocab-top and --block-size it was trained with")
    model.load_state_dict(theirs)
    files = safetensors_files(checkpoint_dir(directory))
    if is_feature_head(directory):
        files.append(checkpoint_dir(directory) / FEATURE_WEIGHTS_FILE)
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def distill_loss(logits: Tensor, topk_ids: Tensor, topk_probs: Tensor, rows: Tensor) -> Tensor:
    """Mean over positions of KL(p || q) on {top-K ids the draft can propose} + {tail}.

    logits [N, Vh] (the draft's `head_logits`: one per row of its head); topk_ids [N, K] long (token ids);
    topk_probs [N, K]; rows [V]: each token id's head row, -1 outside the head (`vocab.head_rows`).
    Example: p = (0.7 on a, 0.2 on b outside the head, 0.1 elsewhere): buckets {a: 0.7, tail: 0.3}.
    """
    if rows.dtype != torch.long:  # a bool mask (the table's form before 2026-12-06) would read row 1 for every id
        raise ValueError(f"distill_loss takes a table of head rows (torch.long, vocab.head_rows), not {rows.dtype}")
    log_q = torch.log_softmax(logits, dim=-1)  # [N, Vh]
    topk_rows = rows[topk_ids]  # [N, K]
    valid = topk_rows >= 0
    p = topk_probs * valid
    log_q_top = torch.where(valid, log_q.gather(-1, topk_rows.clamp_min(0)), torch.zeros((), device=logits.device))
    p_tail = (1 - p.sum(-1)).clamp_min(0)
    q_tail = (1 - (log_q_top.exp() * valid).sum(-1)).clamp_min(1e-9)
    top = torch.where(valid, p * (torch.log(p.clamp_min(1e-12)) - log_q_top), torch.zeros((), device=logits.device))
    tail = torch.where(p_tail > 0, p_tail * (torch.log(p_tail.clamp_min(1e-12)) - torch.log(q_tail)), 0.0)
    return (top.sum(-1) + tail).mean()


def make_batch(sequences: list[TeacherSequence], device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Teacher-forced inputs: ids, positions [B, T] (right-padded), loss mask [B, T], top-K ids/probs [N, K].

    Sequence prompt + continuation of L + n ids feeds its first L + n - 1; the logits at position L - 1 + i
    predict continuation[i], whose teacher row is topk[i]. Rows of the mask are taken in (b, t) order, the
    order `logits[mask]` returns, so the teacher rows line up by concatenation.
    """
    lengths = [len(s.prompt) + len(s.continuation) - 1 for s in sequences]
    width = max(lengths)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.bool)
    for b, (seq, length) in enumerate(zip(sequences, lengths, strict=True)):
        ids[b, :length] = torch.tensor((seq.prompt + seq.continuation)[:-1])
        mask[b, len(seq.prompt) - 1 : length] = True
    positions = torch.arange(width)[None].expand_as(ids)
    topk_ids = torch.cat([s.topk_ids for s in sequences]).long()
    topk_probs = torch.cat([s.topk_probs for s in sequences]).float()
    return tuple(t.to(device) for t in (ids, positions, mask, topk_ids, topk_probs))


def teacher_forced_states(model: Transformer, ids: Tensor, positions: Tensor) -> Tensor:
    """Run the draft over whole sequences with a fresh cache: [B, T] -> final hidden states [B, T, D] (before
    the final norm: `head_logits` and `logits` take them)."""
    model.max_batch = model.max_seq_len = 0  # force a fresh cache: no autograd history from the last step
    model.setup_cache(ids.shape[0], ids.shape[1])
    return model.run_layers(model.embed(ids), positions)


def lr_at(step: int, params: TrainParams) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < params.warmup:
        return params.lr * (step + 1) / params.warmup
    progress = (step - params.warmup) / max(1, params.steps - params.warmup)
    return params.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


BatchLoss = Callable[..., Tensor]  # (model, ids, positions, mask, topk_ids, topk_probs) -> scalar loss


def token_loss(rows: Tensor) -> BatchLoss:
    """A standalone draft's loss on a teacher-forced batch (`distill_loss` on the continuation positions: only
    their hidden states reach the LM head, over the head's own rows)."""
    def loss(model: Transformer, ids: Tensor, positions: Tensor, mask: Tensor, topk_ids: Tensor,
             topk_probs: Tensor) -> Tensor:
        hidden = teacher_forced_states(model, ids, positions)
        return distill_loss(model.head_logits(hidden[mask]), topk_ids, topk_probs, rows)
    return loss


def train(model: torch.nn.Module, data: list[TeacherSequence], params: TrainParams, rows: Tensor,
          device: torch.device, log=print, log_every: int = 10,
          ckpt: resume.Checkpointing | None = None, loss: BatchLoss | None = None,
          loss_settings: dict | None = None) -> resume.TrainState:
    """Seeded AdamW over shuffled epochs of `data`, from `ckpt.resume` when given; returns the state
    (the loss of every step so far; `step < params.steps` when this run stopped early to be resumed).
    `loss`: the batch loss (default: `token_loss`; a feature head brings its own, dfvg.distill.feature), and
    `loss_settings` its knobs, which a resumed run must share like the training parameters."""
    params.check()
    ckpt = ckpt or resume.Checkpointing()
    ckpt.check()
    if not data:
        raise UserError("no training sequences (every prompt was held out?)")
    generator = torch.Generator().manual_seed(params.seed)
    model.to(device).train().requires_grad_(True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": params.weight_decay},
                                   {"params": other, "weight_decay": 0.0}], lr=params.lr, betas=(0.9, 0.95))
    run = resume.fingerprint({**asdict(params), **(loss_settings or {})}, data, model)
    state = resume.TrainState()
    if ckpt.resume is not None:
        state = resume.load(ckpt.resume, model, optimizer, generator, run)
        log(f"train: resumed at step {state.step}/{params.steps} from {ckpt.resume}")
    with tf32_matmuls(True):  # speed; scoped, so float32 decoding after training stays exact
        _steps(model, data, params, loss or token_loss(rows), device, optimizer, generator, state, ckpt, run,
               log, log_every)
    if ckpt.directory is not None:
        resume.save(ckpt, model, optimizer, generator, state, run)
        log(f"train: checkpoint at step {state.step}/{params.steps} in {ckpt.directory}")
    model.eval().requires_grad_(False)
    return state


def _out_of_time(ckpt: resume.Checkpointing, state: resume.TrainState, first: int, started: float,
                 slowest: float) -> bool:
    """This run's limits: --stop-after steps, or a --time-budget the next step could overrun (judged by
    the slowest step so far; every run takes at least one step, so a chain of leases always advances)."""
    taken = state.step - first
    if ckpt.stop_after and taken >= ckpt.stop_after:
        return True
    return bool(ckpt.time_budget_s) and taken > 0 and time.perf_counter() - started + slowest > ckpt.time_budget_s


def _steps(model: torch.nn.Module, data: list[TeacherSequence], params: TrainParams, batch_loss: BatchLoss,
           device: torch.device, optimizer, generator: torch.Generator, state: resume.TrainState,
           ckpt: resume.Checkpointing, run: dict, log, log_every: int) -> None:
    """Steps from state.step up to params.steps or this run's limit, updating `state` in place."""
    first, start, slowest = state.step, time.perf_counter(), 0.0
    while state.step < params.steps and not _out_of_time(ckpt, state, first, start, slowest):
        began, step = time.perf_counter(), state.step
        if len(state.order) < params.batch_size:
            state.order += torch.randperm(len(data), generator=generator).tolist()
        batch, state.order = [data[i] for i in state.order[: params.batch_size]], state.order[params.batch_size :]
        ids, positions, mask, topk_ids, topk_probs = make_batch(batch, device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, params)
        loss = batch_loss(model, ids, positions, mask, topk_ids, topk_probs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), params.grad_clip)
        optimizer.step()
        state.losses.append(loss.item())
        state.step += 1
        slowest = max(slowest, time.perf_counter() - began)
        if step % log_every == 0 or state.step == params.steps:
            log(f"train: step {state.step}/{params.steps} loss {state.losses[-1]:.4f} "
                f"({time.perf_counter() - start:.1f} s)")
        if ckpt.directory is not None and ckpt.every and state.step % ckpt.every == 0 and state.step < params.steps:
            resume.save(ckpt, model, optimizer, generator, state, run)
