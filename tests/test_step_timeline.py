"""benchmarks/step_timeline.py's CPU parts: a profiler trace of graph replays read into what each launch kind adds
to the step (the GPU part needs a CUDA GPU and runs in a lease)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import step_timeline

ROOT = Path(__file__).resolve().parents[1]
LAYER = ("_qkv_rope_kernel", "_attention_split_kernel", "_attention_combine_kernel", "_linear_kernel",
         "_linear_kernel", "_linear_kernel")


def step_names(layers: int) -> list[str]:
    """The kernels of a step of `layers` layers as a graph replays them: the embedding, the layers, the LM head."""
    return ["void at::native::indexSelectSmallIndex<c10::BFloat16>(int)", *LAYER * layers, "_linear_kernel"]


def trace_of(replays: int, layers: int, overlap: float) -> dict:
    """A chrome trace of `replays` replays: kernels of 10 µs each, each starting `overlap` µs before the previous
    one ends (programmatic dependent launch), replays 100 µs apart, with CPU events and flows beside them."""
    events, t = [{"ph": "X", "cat": "cpu_op", "name": "replay", "ts": 0.0, "dur": 5.0}], 0.0
    for _ in range(replays):
        for name in step_names(layers):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": 10.0})
            events.append({"ph": "f", "cat": "ac2g", "name": "launch", "ts": t})
            t += 10.0 - overlap
        t += 100.0
    return {"traceEvents": events}


def test_each_kernel_is_charged_what_it_adds_and_the_charges_sum_to_the_span():
    kernels = step_timeline.kernel_events(trace_of(replays=3, layers=2, overlap=4.0))
    assert len(kernels) == 3 * 14  # the CPU event and the flows are not kernels
    replays = step_timeline.replays_of(kernels, 3)
    kinds = step_timeline.launch_kinds([name for name, _s, _e in replays[0]])
    assert kinds == ["other", "QKV + RoPE", "attention split", "attention merge", "O", "gate/up", "down",
                     "QKV + RoPE", "attention split", "attention merge", "O", "gate/up", "down", "LM head"]
    added = step_timeline.charges(replays[0])
    assert added == [10.0] + [6.0] * 13  # each later kernel ends 6 µs after the one before it
    table = step_timeline.kind_table(replays)
    assert table["span_us"] == pytest.approx(10.0 + 13 * 6.0) == pytest.approx(sum(added))
    assert table["kinds"]["QKV + RoPE"] == {"launches": 2.0, "duration_us": 20.0, "adds_us": 12.0}
    assert table["kinds"]["LM head"] == {"launches": 1.0, "duration_us": 10.0, "adds_us": 6.0}
    assert table["kinds"]["other"]["adds_us"] == 10.0
    assert sum(row["adds_us"] for row in table["kinds"].values()) == pytest.approx(table["span_us"])


def test_a_kernel_that_ends_inside_an_earlier_one_adds_nothing():
    replay = [("a", 0.0, 10.0), ("b", 2.0, 8.0), ("c", 9.0, 15.0)]
    assert step_timeline.charges(replay) == [10.0, 0.0, 5.0]


def test_a_trace_that_lost_kernels_is_refused():
    kernels = step_timeline.kernel_events(trace_of(replays=2, layers=1, overlap=0.0))
    with pytest.raises(ValueError, match="do not split into 3 replays"):
        step_timeline.replays_of(kernels, 3)
    with pytest.raises(ValueError, match="0 kernels"):
        step_timeline.replays_of([], 1)


@pytest.mark.parametrize("args, says", [(["--replays", "0"], "--replays must be at least 1"),
                                        (["--rows", "0"], "row counts"), (["--contexts", "x"], "contexts")])
def test_bad_flags_are_one_line(args, says):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_timeline.py"), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_without_a_gpu_it_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_timeline.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip() == \
        "error: step_timeline.py needs a CUDA GPU (this machine has none)"
