"""Pure pieces of dfvg/distill/: head-vocabulary choice, the coarsened KL, the block schedule, sizing."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from dfvg.distill import data, evaluate, sizing, vocab
from dfvg.distill.train import distill_loss
from dfvg.errors import UserError
from dfvg.model import ModelConfig
from dfvg.stats import Metric


def test_choose_head_vocab_docstring_example_and_filler():
    assert vocab.choose_head_vocab(Counter({7: 5, 3: 5, 9: 1}), 3, 10, required=[1]).tolist() == [1, 3, 7]
    ids = vocab.choose_head_vocab(Counter({4: 2}), 4, 10, required=[9])
    assert ids.tolist() == [0, 1, 4, 9]  # EOS, the seen id, then the lowest unseen ids; ascending
    with pytest.raises(UserError, match="--vocab-top"):
        vocab.choose_head_vocab(Counter(), 11, 10)


def test_loss_is_exact_kl_with_full_top_k_and_zero_at_the_teacher():
    torch.manual_seed(0)
    teacher_logits, draft_logits = torch.randn(5, 12), torch.randn(5, 12)
    p = torch.softmax(teacher_logits, -1)
    probs, ids = p.topk(12, -1)
    everything = torch.arange(12)  # a full-vocabulary head: every id is its own row
    kl = (p * (p.log() - torch.log_softmax(draft_logits, -1))).sum(-1).mean()
    assert torch.allclose(distill_loss(draft_logits, ids, probs, everything), kl, atol=1e-5)
    assert float(distill_loss(teacher_logits, ids, probs, everything)) == pytest.approx(0.0, abs=1e-5)


def test_loss_is_finite_when_teacher_mass_lies_outside_the_head():
    rows = vocab.head_rows(torch.tensor([0, 1, 2, 3]), 8)
    assert rows.tolist() == [0, 1, 2, 3, -1, -1, -1, -1]
    logits = torch.randn(3, 4, requires_grad=True)  # the head's own rows
    ids = torch.tensor([[6, 0], [1, 7], [5, 4]])
    probs = torch.tensor([[0.7, 0.2], [0.5, 0.4], [0.9, 0.05]])
    loss = distill_loss(logits, ids, probs, rows)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    with pytest.raises(ValueError, match="table of head rows"):  # the bool mask of before would read row 1
        distill_loss(logits, ids, probs, rows >= 0)


def full_vocabulary_loss(full_logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor) -> torch.Tensor:
    """The loss as it was computed before head-row logits (the reference): on the full-vocabulary logits with
    -inf outside the head, the head being where they are finite."""
    log_q = torch.log_softmax(full_logits, -1)
    valid = torch.isfinite(full_logits)[torch.arange(len(topk_ids))[:, None], topk_ids]
    p = topk_probs * valid
    log_q_top = torch.where(valid, log_q.gather(-1, topk_ids), 0.0)
    p_tail, q_tail = 1 - p.sum(-1), (1 - (log_q_top.exp() * valid).sum(-1)).clamp_min(1e-9)
    top = torch.where(valid, p * (p.clamp_min(1e-12).log() - log_q_top), 0.0)
    return (top.sum(-1) + torch.where(p_tail > 0, p_tail * (p_tail.clamp_min(1e-12).log() - q_tail.log()), 0.0)).mean()


def test_head_row_loss_equals_the_full_vocabulary_loss_of_a_head_vocabulary_draft():
    """Training reads `head_logits` (one per head row) and `vocab.head_rows`; the value and the gradient must be
    those of the full-vocabulary logits that decoding sees (`logits`: -inf outside the head)."""
    from dfvg.model import Transformer

    config = ModelConfig("qwen2", vocab_size=40, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, head_vocab_size=12)
    model = Transformer(config)
    head_ids = torch.tensor(sorted(torch.randperm(40, generator=torch.Generator().manual_seed(1))[:12].tolist()))
    model.head_token_ids.copy_(head_ids)
    hidden = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    teacher = torch.softmax(torch.randn(6, 40, generator=torch.Generator().manual_seed(3)), -1)
    probs, ids = teacher.topk(8, -1)  # some of the teacher's top ids lie outside the head
    assert not torch.isin(ids, head_ids).all()
    losses = []
    for compute in (lambda: distill_loss(model.head_logits(hidden), ids, probs, vocab.head_rows(head_ids, 40)),
                    lambda: full_vocabulary_loss(model.logits(hidden), ids, probs)):
        model.zero_grad()
        loss = compute()
        loss.backward()
        losses.append((loss.detach(), model.output.weight.grad.clone()))
    assert torch.allclose(losses[0][0], losses[1][0], atol=1e-6) and float(losses[0][0]) > 0
    assert torch.allclose(losses[0][1], losses[1][1], atol=1e-6) and losses[0][1].abs().sum() > 0


def test_block_steps_docstring_example():
    steps = evaluate.block_steps(torch.tensor([1, 1, 0, 1, 1, 1, 1], dtype=torch.bool), 2)
    assert [(s.num_drafted, s.num_accepted) for s in steps] == [(2, 2), (2, 2), (0, 0)]


def test_parse_sources_and_split_validation():
    assert data.parse_sources("humaneval*8, sharegpt:2000,dir/x.jsonl,h:10*2") == [
        ("humaneval", None, 8), ("sharegpt", 2000, 1), ("dir/x.jsonl", None, 1), ("h", 10, 2)]
    for bad in ("humaneval*0", "humaneval*x", " , "):
        with pytest.raises(UserError):
            data.parse_sources(bad)
    prompts = [data.Prompt(f"s/{i}", [1]) for i in range(40)]
    train, val, test = data.split(prompts, 0.2, 0.25)
    assert len(train) + len(val) + len(test) == 40 and 3 <= len(test) <= 20 and 2 <= len(val) <= 16
    assert data.split(prompts, 0.2, 0.25) == (train, val, test)
    for val_fraction, test_fraction in ((0.0, 0.25), (0.2, 1.0), (0.5, 0.5)):
        with pytest.raises(UserError, match="--val-fraction and --test-fraction"):
            data.split(prompts, val_fraction, test_fraction)
    with pytest.raises(UserError, match="give more prompts"):
        data.split(prompts[:2], 0.2, 0.25)


def _cfg(layers, hidden, head_vocab, inter=None, heads=None, kv=None):
    h = heads or hidden // 64
    return ModelConfig("qwen2", 151936, hidden, inter or 3 * hidden, layers, h, kv or max(1, h // 4), hidden // h,
                       attention_bias=True, head_vocab_size=head_vocab)


def test_sizing_fpga_shape_fits_u280_and_the_05b_draft_does_not():
    small = sizing.size_draft(_cfg(4, 512, 32768), 8, "u280", k=4, context_len=256,
                              verify=Metric(0.02, "s", "assumed"))
    big = sizing.size_draft(_cfg(24, 896, None, 4864, 14, 2), 4, "u280", k=4, context_len=256)
    assert small.fits_on_chip and small.hides_behind_verify is True
    assert small.block_time.provenance == "modeled" and small.on_chip_weight_bytes.provenance == "modeled"
    assert not big.fits_on_chip and big.block_time.value > 10 * small.block_time.value
    assert big.hides_behind_verify is None
    int4 = sizing.size_draft(_cfg(4, 512, 32768), 4)
    assert int4.on_chip_weight_bytes.value < small.on_chip_weight_bytes.value
    with pytest.raises(UserError):
        sizing.size_draft(_cfg(2, 256, 4096), 3)


def test_a_feature_head_is_sized_with_its_projections_and_features_over_pcie():
    from dfvg.fpga.board.boards import get_board
    from dfvg.fpga.board.latency import DesignParams, model_block
    from dfvg.fpga.board.workload import draft_workload

    cfg, h = _cfg(4, 512, 32768), 1536
    plain, head = draft_workload(cfg, 8), draft_workload(cfg, 8, feature_size=h)
    projections = (h + 512) * 512 + 512 * h  # fuse [d, H + d] + predict [H, d]
    row_params = 8 * (512 + h)  # an int32 multiplier and shift per output row (head_quantize.py's int8 rows)
    assert head.streamed_weight_bytes() - plain.streamed_weight_bytes() == projections + row_params  # int8
    assert head.macs_per_token(100) - plain.macs_per_token(100) == projections
    design, board = DesignParams(), get_board("u280")
    extra = model_block(head, board, design, 4, 100, new_tokens=3).pcie_time.value - \
        model_block(plain, board, design, 4, 100, new_tokens=3).pcie_time.value
    assert extra == pytest.approx(3 * 2 * h / (design.pcie_gbps * 1e9))  # three bf16 features
    sized = sizing.size_draft(cfg, 8, "u280", k=4, context_len=256, feature_size=h)
    alone = sizing.size_draft(cfg, 8, "u280", k=4, context_len=256)
    assert sized.on_chip_weight_bytes.value - alone.on_chip_weight_bytes.value == projections + row_params
    assert sized.block_time.value > alone.block_time.value and sized.fits_on_chip


def test_a_prompt_file_named_like_a_builtin_set_gets_its_keys(tmp_path):
    from tests.conftest import build_tokenizer

    (tmp_path / "humaneval.jsonl").write_text('{"task_id": "HumanEval/3", "prompt": "w5 w6"}\n')
    prompts = data.load_prompt_ids(str(tmp_path / "humaneval.jsonl"), build_tokenizer(), 1)
    assert prompts == [data.Prompt("humaneval/HumanEval/3", [6])]
    (tmp_path / "sharegpt-code.jsonl").write_text('{"id": "abc_0", "prompt": "w5 w6"}\n')
    (tmp_path / "sharegpt.jsonl").write_text('{"id": "abc_0", "prompt": "w5 w6"}\n')
    prompts = data.load_prompt_ids(str(tmp_path / "sharegpt-code.jsonl"), build_tokenizer(), 1)
    assert [p.key for p in prompts] == ["sharegpt/abc_0"]  # the subset keeps its parent's keys, hence split
    with pytest.raises(UserError, match="same prompt twice"):
        data.load_prompt_ids(f"{tmp_path}/sharegpt.jsonl,{tmp_path}/sharegpt-code.jsonl", build_tokenizer(), 1)


def test_test_split_at_a_quarter_is_the_shipped_drafts_held_out_set():
    """data/humaneval-heldout.jsonl (the 46 prompts the shipped draft never trained on) is exactly the test
    split at --test-fraction 0.25, whatever --val-fraction; validation never takes one of them."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "humaneval-heldout.jsonl"
    shipped = {json.loads(line)["id"] for line in path.read_text().splitlines()}
    for val in (0.05, 0.1, 0.3):
        parts = {i: data.split_of(f"humaneval/HumanEval/{i}", val, 0.25) for i in range(164)}
        assert {f"HumanEval/{i}" for i, part in parts.items() if part == "test"} == shipped
    smaller = {i for i in range(164) if data.split_of(f"humaneval/HumanEval/{i}", 0.1, 0.1) == "test"}
    assert smaller and {f"HumanEval/{i}" for i in smaller} < shipped


def test_token_rows_map_head_tokens_to_their_rows_and_others_to_the_nearest():
    embed = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.2, 0.8], [-1.0, 0.05]])
    rows = vocab.token_rows(embed, torch.tensor([0, 1, 4]), chunk=2)
    assert rows.tolist() == [0, 1, 0, 1, 2]


def test_training_restores_the_callers_tf32_setting():
    """train() turns TF32 on for its own matmuls only: float32 decoding after it must stay exact."""
    import torch

    from dfvg.devices import tf32_matmuls

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with tf32_matmuls(True):
            assert torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32 is False
        try:
            with tf32_matmuls(True):
                raise RuntimeError("a failing step")
        except RuntimeError:
            pass
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_target_features_are_each_sequences_own_kept_once_and_bounded_by_the_budget():
    """`feature.TargetFeatures` gives a batch the batched teacher-forced pass's features (each sequence's own
    pass, zeros past its length), runs the target once per kept sequence, and keeps nothing past its budget."""
    from dfvg.distill import feature
    from dfvg.distill.teacher import TeacherSequence
    from dfvg.distill.train import make_batch
    from dfvg.model import Transformer

    torch.manual_seed(0)
    target = Transformer(ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e4,
                                     attention_bias=True)).eval()

    def seq(prompt, continuation):
        return TeacherSequence(prompt, continuation, torch.zeros(len(continuation), 2, dtype=torch.int32),
                               torch.zeros(len(continuation), 2))

    seqs = [seq([3, 4, 5], [6, 7]), seq([9], [10, 11, 12, 13, 14, 15]), seq([1, 2, 3, 4, 5, 6], [7])]
    ids, positions, mask, _, _ = make_batch(seqs, torch.device("cpu"))
    lengths = [len(s.prompt) + len(s.continuation) - 1 for s in seqs]
    passes = 0
    run_layers = target.run_layers

    def counted(*args, **kwargs):
        nonlocal passes
        passes += 1
        return run_layers(*args, **kwargs)

    target.run_layers = counted
    store = feature.TargetFeatures(target, budget=1 << 20)
    got = store.batch(ids, mask)
    assert passes == 3 and len(store.kept) == 3
    want = feature.target_features(target, ids, positions)
    for row, length in enumerate(lengths):
        torch.testing.assert_close(got[row, :length], want[row, :length], rtol=1e-5, atol=1e-5)
        assert not got[row, length:].any()
    assert not torch.allclose(got[0, :4], got[1, :4])  # control: rows are their own sequences' features
    passes = 0
    assert torch.equal(store.batch(ids, mask), got) and passes == 0  # kept: no second pass
    unkept = feature.TargetFeatures(target, budget=0)
    assert torch.equal(unkept.batch(ids, mask), got) and not unkept.kept and passes == 3
    half = feature.TargetFeatures(target.to(torch.bfloat16), budget=1 << 20)  # kept as the target computes them
    half.batch(ids, mask)
    assert {f.dtype for f in half.kept.values()} == {torch.bfloat16} and half.kept_bytes == sum(lengths) * 32 * 2
    partly = feature.TargetFeatures(target, budget=(lengths[0] + lengths[1]) * 32 * 2)
    partly.batch(ids, mask)
    assert [len(k) for k in partly.kept] == lengths[:2]  # the third sequence no longer fits
