"""Soak: well over 1,000 generations with draft faults at random points, and not one output lost or changed.

Part 1, the tiny pair (real checkpoints): each generation draws a schedule (sync host step, overlap, a batch
of 3, the captured device step, the FPGA datapath emulated, the FPGA through the simulated XRT backend), a
draft length k in 1..8, a prompt of 1..40 tokens, 4..20 new tokens, greedy or sampled (temperature 0.5 to
1.2, top-k on or off) and a fault: none, a device error, a hang caught by the watchdog, or a failure in the
middle of a block after it drew from the generator (each at a random proposal), sometimes with a fallback
drafter or a retry after back-off (greedy). Every greedy output must equal plain decoding; every sampled one
must equal, token for token, the same run with a drafter that simply stops where the fault struck - the
RNG stream of plain decoding, nothing consumed by the failed block.

Part 2, the output law: a context-free target (every token an independent draw from one known law) with a
context-dependent drafter, sampled at two temperatures with random faults, k and schedules; each
temperature's tokens must pass Pearson's chi-square test against the target's law at level ALPHA = 1e-3
(a correct engine fails one of the two groups with probability <= 2e-3; the seeds are fixed, so the outcome
is deterministic). With >= 5,000 tokens per group over 8 cells the test rejects a law at total variation
>= 0.05 with power >= 0.99 (stats_helpers.samples_for_power); a negative control drawn from a tilted law is
rejected at the same size.

About 1.5 minutes on 2 cores (75 s + 18 s measured on the shared dev box); counts and time are printed
(`pytest -s`).
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.drafter import TorchDrafter
from dfvg.engine import Engine
from dfvg.fallback import FaultInjection, FaultPolicy, GuardedDrafter, Slot
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.generate import generate
from dfvg.gpu.graph_drafter import GraphDrafter
from dfvg.gpu.graphs import GraphVerifier
from dfvg.host.batch import run_batch
from dfvg.sampling import SamplingParams, processed_probs
from dfvg.verifier import TorchVerifier
from tests.stats_helpers import chi_square_p_value, samples_for_power, tilted
from tests.test_fallback import MidBlockFailure, Stopped
from tests.test_sampling import PrefixModel

SEED = 19
GENERATIONS = 600  # part 1 (a batch counts its 3 rows); with part 2, 1,020 generations
LAW_GENERATIONS = 420  # part 2
ALPHA, TV, POWER = 1e-3, 0.05, 0.99
SCHEDULES = {"sync": 3, "overlap": 3, "batch": 2, "device": 2, "fpga": 1, "xrt": 1}  # the emulated FPGA is slow


class Pair:
    """The tiny pair's verifiers and drafters, made once: every generation brings its own guard."""

    def __init__(self, tiny_pair, tmp_path):
        target, draft = load_model(tiny_pair[0]), load_model(tiny_pair[1])
        self.target = TorchVerifier(target)
        self.engine = Engine(self.target)
        self.graph_engine = Engine(GraphVerifier(copy.deepcopy(target), compile_blocks=False, cache_len=96))
        self.drafters = {"torch": TorchDrafter(draft, 96), "backup": TorchDrafter(copy.deepcopy(target), 96),
                         "graph": GraphDrafter(copy.deepcopy(draft), 96, compile_blocks=False, cache_len=96),
                         "fpga": FpgaDrafter.from_checkpoint(tiny_pair[1], target_vocab_size=96)}
        xclbin = tmp_path / "dfvg_draft.xclbin"
        xclbin.write_bytes(b"xclbin2\0" + bytes(56))
        self.drafters["xrt"] = FpgaDrafter.from_checkpoint(tiny_pair[1], target_vocab_size=96, mode="xrt",
                                                           xclbin=xclbin, xrt_backend="simulated")
        self.rows = [TorchDrafter(copy.deepcopy(draft), 96) for _ in range(3)]
        self.plain: dict[tuple, list[int]] = {}

    def plain_tokens(self, prompt: list[int], n: int) -> list[int]:
        key = (tuple(prompt), n)
        if key not in self.plain:
            self.plain[key] = generate(self.target, prompt, n).tokens
        return self.plain[key]


@pytest.fixture(scope="module")
def pair(tiny_pair, tmp_path_factory) -> Pair:
    return Pair(tiny_pair, tmp_path_factory.mktemp("soak"))


def draw_case(rng: random.Random) -> dict:
    schedule = rng.choices(list(SCHEDULES), list(SCHEDULES.values()))[0]
    sampled = schedule != "device" and rng.random() < 0.4
    fault = rng.choices(["none", "fail", "hang", "mid"], [2, 5, 1, 2])[0]
    if fault == "mid" and schedule not in ("sync", "overlap"):
        fault = "fail"  # a torch drafter's mid-block failure; other drafters fail by injection
    return {"schedule": schedule, "k": rng.randint(1, 8), "n": rng.randint(4, 20), "fault": fault,
            "at": rng.randint(1, 5), "prompt": [rng.randrange(2, 96) for _ in range(rng.randint(1, 40))],
            "sampling": SamplingParams(rng.choice([0.5, 0.8, 1.2]), top_k=rng.choice([0, 20])) if sampled
            else SamplingParams(),
            "fallback": not sampled and schedule in ("sync", "overlap") and rng.random() < 0.2,
            "retry": not sampled and rng.random() < 0.2, "seed": rng.randrange(1000)}


def guard(drafter, case: dict, backup=None, deadline: float = 0.1) -> tuple[GuardedDrafter, FaultInjection]:
    """A fresh guard (its own health and injection) over a long-lived drafter, as the engine builds one. A
    first proposal waits the startup deadline, 4x the others: both far shorter than the hang (released once
    the run is over), longer than any block of the tiny models."""
    injection = FaultInjection(fail_after=case["at"] if case["fault"] == "fail" else None,
                               hang_after=case["at"] if case["fault"] == "hang" else None, hang_s=60.0)
    if case["fault"] == "mid":
        drafter = MidBlockFailure(drafter, case["at"])
    policy = FaultPolicy(deadline=deadline, startup_deadline_s=4 * deadline,
                         retry_after_s=1e-4 if case["retry"] else None)
    slots = [Slot(drafter)] + ([Slot(backup)] if backup is not None else [])
    return GuardedDrafter(slots, policy, injection), injection


def stopped(drafter, faults: list) -> object:
    """The reference for a sampled run: the drafter stopped at the proposal that failed (a fault the
    watchdog saw on a slow block, not the injected one, moves that point; it is counted apart)."""
    return Stopped(drafter, max(1, faults[0].proposal)) if faults else drafter


def run_case(pair: Pair, case: dict) -> tuple[list[list[int]], list[list[int]], list]:
    """(outputs, what they must equal, faults) of one drawn case."""
    s, k, n, prompt, sampling, seed = (case[key] for key in ("schedule", "k", "n", "prompt", "sampling", "seed"))
    if s == "batch":
        prompts = [prompt, prompt[: max(1, len(prompt) // 2)], [*prompt[:3], 7]]
        guards = [guard(d, case, deadline=0.1) for d in pair.rows]
        results = run_batch(pair.target, [g for g, _ in guards], prompts, n, sampling=sampling, seed=seed,
                            draft_length=k)
        for _, injection in guards:
            injection.release.set()
        if sampling.greedy:
            want = [pair.plain_tokens(p, n) for p in prompts]
        else:
            references = [stopped(d, r.faults) for d, r in zip(pair.rows, results, strict=True)]
            want = [r.tokens for r in run_batch(pair.target, references, prompts, n, sampling=sampling, seed=seed,
                                                draft_length=k)]
        return [r.tokens for r in results], want, [f for r in results for f in r.faults]
    engine = pair.graph_engine if s == "device" else pair.engine
    drafter = pair.drafters[{"device": "graph", "sync": "torch", "overlap": "torch"}.get(s, s)]
    guarded, injection = guard(drafter, case, pair.drafters["backup"] if case["fallback"] else None,
                               deadline=0.3 if s in ("fpga", "xrt") else 0.1)  # an emulated block is slow
    mode = "overlap" if s == "overlap" else "sync"
    result = engine.decode(guarded, prompt, n, k=k, sampling=sampling, seed=seed, mode=mode)
    injection.release.set()
    if sampling.greedy:
        return [result.tokens], [pair.plain_tokens(prompt, n)], result.faults
    reference = engine.decode(stopped(drafter, result.faults), prompt, n, k=k, sampling=sampling, seed=seed,
                              mode=mode)
    return [result.tokens], [reference.tokens], result.faults


def test_soak_every_output_equals_plain_decoding(pair):
    rng, start = random.Random(SEED), time.perf_counter()
    counts: Counter = Counter()
    while counts["generations"] < GENERATIONS:
        case = draw_case(rng)
        outputs, want, faults = run_case(pair, case)
        assert outputs == want, case
        counts["generations"] += len(outputs)
        counts["sampled" if not case["sampling"].greedy else "greedy"] += len(outputs)
        counts[f"schedule {case['schedule']}"] += len(outputs)
        counts[f"injected {case['fault']}"] += 1
        kind = {"hang": "timeout", "none": None}.get(case["fault"], "error")
        counts.update(f"fault {f.kind}" + ("" if (f.kind, f.proposal) == (kind, case["at"]) else " unplanned")
                      for f in faults)
    elapsed = time.perf_counter() - start
    print(f"\nsoak part 1: {dict(sorted(counts.items()))} in {elapsed:.1f} s")
    assert counts["fault error"] > 100 and counts["fault timeout"] > 20  # the faults really struck


def law_case(rng: random.Random) -> tuple[dict, str]:
    """A random fault (at a random proposal) and schedule for part 2."""
    case = {"fault": rng.choice(["none", "fail", "fail", "hang", "mid"]), "at": rng.randint(1, 6), "retry": False}
    return case, rng.choice(["sync", "overlap"])


def test_soak_sampled_outputs_follow_the_target_law():
    """Part 2 (module docstring): chi-square per temperature, plus the tilted negative control."""
    rng, start, max_len = random.Random(SEED + 1), time.perf_counter(), 64
    target = TorchVerifier(PrefixModel(8, seed=5, context=0, max_len=max_len))
    drafter = TorchDrafter(PrefixModel(8, seed=6, context=2, max_len=max_len))
    engine, temperatures = Engine(target), (0.7, 1.3)
    tokens: dict[float, list[int]] = {t: [] for t in temperatures}
    faults = 0
    for i in range(LAW_GENERATIONS):
        temperature = temperatures[i % 2]
        case, mode = law_case(rng)
        guarded, injection = guard(drafter, case, deadline=0.05)
        prompt = [rng.randrange(8) for _ in range(rng.randint(1, 10))]
        result = engine.decode(guarded, prompt, 30, k=rng.randint(1, 6), sampling=SamplingParams(temperature),
                               seed=10_000 + i, mode=mode)
        injection.release.set()
        tokens[temperature] += result.tokens
        faults += len(result.faults)
    law_row = target.model.logits_at(0)
    needed = samples_for_power(TV, 8, ALPHA, POWER)
    for temperature, drawn in tokens.items():
        law = processed_probs(law_row, SamplingParams(temperature))
        assert len(drawn) >= needed
        counts = torch.bincount(torch.tensor(drawn), minlength=8)
        assert chi_square_p_value(counts, law) > ALPHA, temperature
        control = torch.multinomial(tilted(law, TV).float(), len(drawn), replacement=True,
                                    generator=torch.Generator().manual_seed(3))
        assert chi_square_p_value(torch.bincount(control, minlength=8), law) < ALPHA  # the test has power
    print(f"\nsoak part 2: {LAW_GENERATIONS} generations, {faults} faults survived, "
          f"{ {t: len(v) for t, v in tokens.items()} } tokens per temperature (>= {needed} needed) "
          f"in {time.perf_counter() - start:.1f} s")
    assert faults > LAW_GENERATIONS // 3
