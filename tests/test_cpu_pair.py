"""benchmarks/cpu_pair.py on the tiny pair: prompt source, skip and truncation reach the run, and
speculative output equals plain greedy output (lossless) on every prompt."""

from __future__ import annotations

import argparse

import pytest

from dfvg.errors import UserError


def test_cpu_pair_takes_the_prompts_after_skip_truncated_and_stays_lossless(tiny_pair, tmp_path):
    from benchmarks.cpu_pair import run

    target, draft = tiny_pair
    args = argparse.Namespace(target=str(target), draft=str(draft), source="humaneval", skip=2, prompts=2,
                              max_prompt_tokens=8, max_new_tokens=6, draft_length=3, threads=1,
                              output=str(tmp_path / "out.json"))
    summary = run(args)
    assert [row["id"] for row in summary["rows"]] == ["HumanEval/2", "HumanEval/3"]
    assert all(row["prompt_tokens"] == 8 for row in summary["rows"])  # HumanEval prompts are longer than 8
    assert summary["all_outputs_match"] and summary["source"] == "humaneval" and summary["skip"] == 2
    assert summary["mean_accepted_length_with_bonus"] >= 1.0


def test_cpu_pair_refuses_a_skip_past_the_last_prompt_in_one_line(tiny_pair, tmp_path):
    from benchmarks.cpu_pair import run

    target, draft = tiny_pair
    args = argparse.Namespace(target=str(target), draft=str(draft), source="humaneval", skip=164, prompts=2,
                              max_prompt_tokens=None, max_new_tokens=6, draft_length=3, threads=1,
                              output=str(tmp_path / "out.json"))
    with pytest.raises(UserError, match="--skip 164 leaves no humaneval prompts"):
        run(args)
