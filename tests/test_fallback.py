"""A draft device that raises or hangs costs speed, never the output: every schedule, every drafter type.

Each test injects faults (dfvg.fallback.FaultInjection, as DFVG_FAIL_DRAFT_AFTER / DFVG_HANG_DRAFT_AFTER do)
or uses a drafter that fails by itself, and compares with plain decoding of the target: greedy token for
token, and sampled token for token too, because a failed block must leave the generator exactly as if it had
never been proposed (the reference is the same run with a drafter that simply stops drafting there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.cli import main
from dfvg.drafter import DraftBlock, TorchDrafter
from dfvg.engine import Engine
from dfvg.errors import UserError
from dfvg.fallback import FaultInjection, FaultPolicy, GuardedDrafter, Slot
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.generate import HostStep, decode, generate
from dfvg.gpu.graph_drafter import GraphDrafter
from dfvg.gpu.graphs import GraphVerifier
from dfvg.host.batch import run_batch
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID

REPO = Path(__file__).resolve().parents[1]
PROMPT = [5, 9, 14, 3, 22, 41, 7]
N = 24
GREEDY, SAMPLED = SamplingParams(), SamplingParams(0.9, top_k=20)
QUICK = FaultPolicy(deadline=0.3, retry_after_s=None)  # hangs are caught in 0.3 s


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchVerifier(load_model(tiny_pair[0]))


@pytest.fixture(scope="module")
def draft_model(tiny_pair):
    return load_model(tiny_pair[1])


def plain(target, prompt=PROMPT, n=N, sampling=GREEDY, seed=0):
    return generate(target, prompt, n, eos_ids=(EOS_ID,), sampling=sampling, seed=seed).tokens


def faulty_engine(target, policy=QUICK, fallbacks=(), **injection) -> Engine:
    engine = Engine(target, policy, fallbacks)
    engine.injection = FaultInjection(**injection, hang_s=5.0)
    return engine


class Counting:
    """Wraps a drafter and counts its proposals (the subclasses act on the n-th)."""

    def __init__(self, inner, at: int):
        self.inner, self.at, self.calls = inner, at, 0
        self.device, self.cached_len = inner.device, 0

    def prefill(self, prompt_ids, max_seq_len):
        self.inner.prefill(prompt_ids, max_seq_len)

    def rollback(self, num_valid):
        self.inner.rollback(num_valid)


class Stopped(Counting):
    """Reference drafter: the inner drafter's blocks up to proposal `at` - 1, then empty blocks, drawn
    without touching the generator: what a guard must make of a drafter that fails at proposal `at`."""

    def propose(self, context, k, sampling, generator):
        self.calls += 1
        if self.calls >= self.at:
            return DraftBlock([], None, 0.0)
        return self.inner.propose(context, k, sampling, generator)


class MidBlockFailure(Counting):
    """A torch drafter whose device dies in the middle of proposal `at`, after drawing from the generator
    and advancing its cache: what the engine discards must include that partial consumption."""

    def propose(self, context, k, sampling, generator):
        self.calls += 1
        if self.calls == self.at:
            self.inner.propose(context, max(1, k // 2), sampling, generator)
            torch.rand(3, generator=generator)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.inner.propose(context, k, sampling, generator)


@pytest.mark.parametrize("mode", ["sync", "overlap"])
@pytest.mark.parametrize("fail_after", [1, 2, 5])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_failing_drafter_gives_plain_decodings_tokens(target, draft_model, mode, fail_after, sampling):
    engine = faulty_engine(target, fail_after=fail_after)
    drafter = TorchDrafter(draft_model, target.vocab_size)
    result = engine.decode(drafter, PROMPT, N, k=3, eos_ids=(EOS_ID,), sampling=sampling, seed=4, mode=mode)
    reference = Engine(target).decode(Stopped(TorchDrafter(draft_model, target.vocab_size), fail_after), PROMPT,
                                      N, k=3, eos_ids=(EOS_ID,), sampling=sampling, seed=4, mode=mode)
    assert result.tokens == reference.tokens  # the same RNG stream: the failed block consumed nothing
    if sampling.greedy or fail_after == 1:  # a fault at the first proposal: plain decoding from the start
        assert result.tokens == plain(target, sampling=sampling, seed=4)
    stats = result.stats()
    [fault] = stats["faults"]
    assert stats["draft_faults"] == 1 and fault["kind"] == "error" and "DraftDeviceError" in fault["error"]
    assert fault["device"] == "cpu" and fault["fallback"] == "target only" and fault["at_s"] >= 0
    assert stats["tokens_without_draft"] == fault["tokens_without_draft"] >= 1
    assert all(s.num_drafted == 0 for s in result.steps[fault["step"] + 1:])  # overlap: the step drafting ahead


@pytest.mark.parametrize("fail_at", [1, 3])
def test_a_block_that_consumed_the_generator_before_failing_is_undone(target, draft_model, fail_at):
    """The drafter draws uniforms and feeds its cache, then raises: the stream goes on as if the block had
    never been proposed, so the output is the stopped reference's, token for token."""
    for seed in range(3):
        drafter = MidBlockFailure(TorchDrafter(draft_model, target.vocab_size), fail_at)
        got = Engine(target).decode(drafter, PROMPT, N, k=4, sampling=SAMPLED, seed=seed)
        ref = Engine(target).decode(Stopped(TorchDrafter(draft_model, target.vocab_size), fail_at), PROMPT, N,
                                    k=4, sampling=SAMPLED, seed=seed)
        assert got.tokens == ref.tokens and got.stats()["draft_faults"] == 1
        assert "illegal memory access" in got.faults[0].error


def test_draws_left_in_the_stream_would_change_the_output(target):
    """Negative control: had the failed block's draws stayed in the generator, the sampled output would differ
    (so the two tests above can fail)."""
    for seed in range(3):
        rng = torch.Generator().manual_seed(seed)
        torch.rand(3, generator=rng)  # what the failed block drew
        shifted = decode(HostStep(target, None, SAMPLED, rng), PROMPT, N, k=0, context_limit=512).tokens
        assert shifted != plain(target, sampling=SAMPLED, seed=seed)


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_a_hung_drafter_is_abandoned_after_the_deadline(target, draft_model, mode):
    engine = faulty_engine(target, hang_after=2)
    drafter = TorchDrafter(draft_model, target.vocab_size)
    start = time.perf_counter()
    result = engine.decode(drafter, PROMPT, N, k=3, eos_ids=(EOS_ID,), mode=mode)
    elapsed = time.perf_counter() - start
    engine.injection.release.set()  # let the abandoned call end (it would after hang_s anyway)
    assert result.tokens == plain(target)
    [fault] = result.faults
    assert fault.kind == "timeout" and "0.3 s" in fault.error and 0.3 <= fault.lost_s < 2.0
    assert elapsed < 4.0  # the block in flight plus the deadline, not the hang
    slot = engine.slots[id(drafter)]
    assert slot.proposals == 2  # never called again: the hung call may still hold its caches


def test_next_configured_drafter_takes_over(target, draft_model, tiny_pair):
    """The chain: the first drafter fails, the target itself (quantized on the FPGA datapath here) drafts on."""
    backup = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8)
    engine = faulty_engine(target, fallbacks=[backup], fail_after=2)
    result = engine.decode(TorchDrafter(draft_model, target.vocab_size), PROMPT, N, k=3, eos_ids=(EOS_ID,))
    assert result.tokens == plain(target)
    [fault] = result.faults
    assert fault.device == "cpu" and fault.fallback == "fpga"
    after = result.steps[fault.step + 1:]
    assert after and all(s.num_drafted > 0 for s in after[:-1]) and sum(s.num_accepted for s in after) > 0
    assert result.stats()["tokens_without_draft"] == 1  # only the failed step decoded alone


def test_retry_after_backoff_brings_the_device_back(target, draft_model):
    engine = faulty_engine(target, FaultPolicy(deadline=0.3, retry_after_s=0.05), fail_after=2)
    drafter = TorchDrafter(draft_model, target.vocab_size)
    first = engine.decode(drafter, PROMPT, N, k=2, eos_ids=(EOS_ID,))
    time.sleep(0.06)
    second = engine.decode(drafter, PROMPT, N, k=2, eos_ids=(EOS_ID,))  # prefilled afresh, drafting again
    assert first.tokens == second.tokens == plain(target)
    assert len(first.faults) == 1 and second.faults == []
    assert second.stats()["num_draft_tokens"] > 0 and second.stats()["tokens_without_draft"] == 0


def test_backoff_doubles_and_waits_for_an_abandoned_call():
    from concurrent.futures import Future

    policy, slot = FaultPolicy(retry_after_s=0.05), Slot(Misused())
    slot.fail(10.0, None)
    assert not slot.usable(10.04, policy) and slot.usable(10.06, policy)
    slot.fail(20.0, None)
    assert not slot.usable(20.09, policy) and slot.usable(20.11, policy)
    hung: Future = Future()
    slot.fail(30.0, hung)
    assert not slot.usable(99.0, policy)  # still running: never called while it may hold the caches
    hung.set_result(None)
    assert slot.usable(99.0, policy) and not slot.usable(99.0, FaultPolicy())  # no retry configured


def test_no_retry_means_never_again(target, draft_model):
    engine = faulty_engine(target, fail_after=1)
    drafter = TorchDrafter(draft_model, target.vocab_size)
    first = engine.decode(drafter, PROMPT, N, k=2)
    later = engine.decode(drafter, PROMPT, N, k=2)  # the next prompt: still target only, no new fault
    assert first.tokens == later.tokens == plain(target)
    assert later.faults == [] and later.stats()["tokens_without_draft"] == N - 1  # the last step never drafts


class Misused:
    """A drafter asked for something it cannot do: a usage error, which must reach the user."""

    device, cached_len = torch.device("cpu"), 0

    def prefill(self, prompt_ids, max_seq_len):
        pass

    def rollback(self, num_valid):
        pass

    def propose(self, context, k, sampling, generator):
        raise UserError("run_block needs 1 <= k <= 16")


def test_a_usage_error_is_not_a_device_fault(target):
    guard = GuardedDrafter([Slot(Misused())], QUICK)
    with pytest.raises(UserError, match="1 <= k <= 16"):
        generate(target, PROMPT, 4, drafter=guard, draft_length=2)


def test_batch_rows_survive_their_own_drafters_faults(target, draft_model):
    prompts = [PROMPT, [7], list(range(2, 30))]
    engine = faulty_engine(target, fail_after=2)
    for sampling in (GREEDY, SAMPLED):
        drafters = [engine.guard(TorchDrafter(load_model_from(draft_model), 96), fallbacks=False) for _ in prompts]
        results = run_batch(target, drafters, prompts, N, eos_ids=(EOS_ID,), sampling=sampling, seed=7,
                            draft_length=3)
        refs = run_batch(target, [Stopped(TorchDrafter(load_model_from(draft_model), 96), 2) for _ in prompts],
                         prompts, N, eos_ids=(EOS_ID,), sampling=sampling, seed=7, draft_length=3)
        assert [r.tokens for r in results] == [r.tokens for r in refs]
        if sampling.greedy:
            assert [r.tokens for r in results] == [plain(target, p) for p in prompts]
        assert all(len(r.faults) == 1 for r in results)


def load_model_from(model):
    """A fresh copy of a draft model (batch rows must not share one: each keeps its own cache)."""
    import copy

    return copy.deepcopy(model)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
@pytest.mark.parametrize("injected", [{"fail_after": 2}, {"hang_after": 3}])
def test_device_step_falls_back_to_the_host_step(tiny_pair, injected, device):
    """The captured greedy step (real CUDA graphs on a GPU, plain replays on a CPU) fails or hangs: that step
    and the rest of the generation go to the host step; fp32, so the tokens must equal the eager target's."""
    model, draft = load_model(tiny_pair[0], device=device), load_model(tiny_pair[1], device=device)
    verifier = GraphVerifier(model, compile_blocks=False, cache_len=96)
    engine = faulty_engine(verifier, **injected)
    drafter = GraphDrafter(draft, 96, compile_blocks=False, cache_len=96)
    result = engine.decode(drafter, PROMPT, N, k=3, eos_ids=(EOS_ID,))
    engine.injection.release.set()
    assert result.tokens == generate(TorchVerifier(model), PROMPT, N, eos_ids=(EOS_ID,)).tokens
    [fault] = result.faults
    assert fault.kind == ("error" if "fail_after" in injected else "timeout")
    assert isinstance(engine.device_steps[(id(drafter), 3)].host.drafter, GuardedDrafter)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
@pytest.mark.parametrize("injected", [{"fail_after": 2}, {"hang_after": 3}])
def test_device_batch_falls_back_to_the_host_batch(tiny_pair, injected, device):
    """A batch's captured step of all rows fails or hangs: the rows still decoding go on with the target alone
    on the host batch step, each with plain decoding's tokens (fp32), and the fault is reported once."""
    model, draft = load_model(tiny_pair[0], device=device), load_model(tiny_pair[1], device=device)
    engine = faulty_engine(GraphVerifier(model, compile_blocks=False, cache_len=96), **injected)
    prompts = [PROMPT, [4, 8], list(range(2, 30))]
    drafters = engine.batch_drafters(lambda: GraphDrafter(draft, 96, compile_blocks=False, cache_len=96),
                                     len(prompts), GREEDY)
    results = engine.decode_batch(drafters, prompts, N, k=3, eos_ids=(EOS_ID,))
    engine.injection.release.set()
    assert list(engine.device_rows) == [(id(drafters[0]), 3, len(prompts))]  # the device batch ran
    assert [r.tokens for r in results] == [generate(TorchVerifier(model), p, N, eos_ids=(EOS_ID,)).tokens
                                           for p in prompts]
    assert [len(r.faults) for r in results] == [1, 0, 0]
    assert results[0].faults[0].kind == ("error" if "fail_after" in injected else "timeout")


@pytest.mark.parametrize("hang", [False, True])
def test_fpga_board_failing_inside_xrt(tiny_pair, target, tmp_path, hang):
    """The simulated XRT backend's kernel dies (or never completes) on its third launch: the XRT driver's
    own error path, not the injection, reaches the engine."""
    xclbin = tmp_path / "dfvg_draft.xclbin"
    xclbin.write_bytes(b"xclbin2\0" + bytes(56))
    drafter = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8, mode="xrt", xclbin=xclbin,
                                          xrt_backend="simulated")
    kernel, launches, release = drafter.engine.xrt.kernel_fn, [0], __import__("threading").Event()

    def dying_kernel(weights, context, k):
        launches[0] += 1
        if launches[0] == 3:
            if hang:
                release.wait(10)
            else:
                raise RuntimeError("XRT: ERT_CMD_STATE_ERROR (kernel dfvg_draft)")
        return kernel(weights, context, k)

    drafter.engine.xrt.kernel_fn = dying_kernel
    result = Engine(target, QUICK).decode(drafter, PROMPT, N, k=3, eos_ids=(EOS_ID,))
    release.set()
    assert result.tokens == plain(target)
    [fault] = result.faults
    assert fault.device == "fpga" and fault.kind == ("timeout" if hang else "error")
    assert launches[0] == 3


def test_cli_generate_under_injected_failure_prints_plain_tokens(tiny_pair, capsys, monkeypatch):
    target_dir, draft_dir = tiny_pair
    base = ["generate", "--target", str(target_dir), "--prompt-ids", "5,9,14,3", "--max-new-tokens", "16",
            "--json", "--temperature", "0.8", "--seed", "2"]
    assert main(base + ["--no-draft"]) == 0
    expected = json.loads(capsys.readouterr().out)["tokens"]
    monkeypatch.setenv("DFVG_FAIL_DRAFT_AFTER", "1")
    for device in ("cpu", "fpga"):
        assert main(base + ["--draft", str(draft_dir), "--draft-device", device]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["tokens"] == expected and got["stats"]["draft_faults"] >= 1


def test_cli_generate_under_injected_hang_exits_with_plain_tokens(tiny_pair, capsys):
    """A subprocess: the hung call's thread must not keep the process from printing and exiting."""
    target_dir, draft_dir = tiny_pair
    args = ["generate", "--target", str(target_dir), "--prompt-ids", "5,9,14,3", "--max-new-tokens", "16"]
    assert main(args + ["--no-draft"]) == 0
    want = capsys.readouterr().out
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DFVG_")}, "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1", "DFVG_HANG_DRAFT_AFTER": "2"}
    got = subprocess.run([sys.executable, "-m", "dfvg", *args, "--draft", str(draft_dir), "--draft-deadline", "0.5"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 0 and got.stdout == want and want.strip()
    assert "1 draft fault(s) survived" in got.stderr


@pytest.mark.parametrize("environ,message", [({"DFVG_FAIL_DRAFT_AFTER": "0"}, "whole number >= 1"),
                                             ({"DFVG_HANG_DRAFT_AFTER": "soon"}, "DFVG_HANG_DRAFT_AFTER")])
def test_bad_injection_values_are_one_line_errors(environ, message):
    with pytest.raises(UserError, match=message):
        FaultInjection.from_env(environ)


def test_auto_deadline_follows_measured_block_times():
    from collections import deque

    policy = FaultPolicy()
    assert policy.deadline_s(deque(), startup=False) == policy.startup_deadline_s  # nothing measured yet
    assert policy.deadline_s(deque([0.01, 0.02]), startup=False) == policy.deadline_floor_s
    assert policy.deadline_s(deque([0.2, 0.5, 0.1]), startup=False) == pytest.approx(20 * 0.5)
    assert policy.deadline_s(deque([0.5]), startup=True) == policy.startup_deadline_s
    assert FaultPolicy(deadline=2.5).deadline_s(deque([9.0]), startup=False) == 2.5
    assert FaultPolicy(deadline="off").deadline_s(deque([0.1]), startup=False) is None


def test_experiment_reports_every_fault_and_keeps_every_output(tiny_pair, tmp_path, monkeypatch):
    """`dfvg run` with a failing draft device (each first drafter fails on its second proposal) and a fallback
    on the FPGA datapath: every output equals the baseline's; performance_summary.json, generations.jsonl and
    timeline.json record each fault."""
    from dfvg.host.experiments import run_experiments
    from tests.test_experiments import tiny_config

    monkeypatch.setenv("DFVG_FAIL_DRAFT_AFTER", "2")
    raw = tiny_config(tiny_pair, tmp_path, num_runs=1, num_prompts=2, variants=["baseline", "speculative", "fpga",
                      "batch"], batch_sizes=[2], devices={"draft": "cpu", "faults": {"fallback": ["fpga"]}})
    run_dir = run_experiments(raw)
    summary = json.loads((run_dir / "performance_summary.json").read_text())
    for name in ("speculative", "fpga", "batch:B=2:spec"):
        entry = summary["variants"][name]
        assert entry["acceptance"]["output_match_rate"]["value"] == 1.0, name
        assert entry["faults"]["draft_faults"]["value"] >= 1 and entry["faults"]["events"], name
        assert {"run", "prompt_id", "device", "error", "at_s", "tokens_without_draft"} <= set(
            entry["faults"]["events"][0])
    assert summary["variants"]["speculative"]["faults"]["events"][0]["fallback"] == "fpga"
    assert summary["variants"]["batch:B=2:spec"]["faults"]["events"][0]["fallback"] == "target only"
    rows = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert sum(r["stats"]["draft_faults"] for r in rows) == sum(
        summary["variants"][n]["faults"]["draft_faults"]["value"] for n in ("speculative", "fpga", "batch:B=2:spec"))
    events = [e for g in json.loads((run_dir / "timeline.json").read_text())["generations"] for e in g["events"]]
    assert any(e["stage"] == "fault" and e["end"] >= e["start"] >= 0 for e in events)
