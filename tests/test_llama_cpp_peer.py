"""benchmarks/llama_cpp_peer.py on CPU: the parsers on real llama.cpp output (captured from the CPU build of
llama-cpp-python 0.3.36's vendored tree: tests/data/llama_*_cpu.*), the refusals, the build reuse, the merge."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from benchmarks import llama_cpp_peer as peer
from benchmarks.gpu_report import COPY_TB_S, report
from benchmarks.gpu_speed import main

DATA = Path(__file__).parent / "data"
SPEC_OUT = (DATA / "llama_speculative_cpu.txt").read_text()
BENCH_OUT = (DATA / "llama_bench_cpu.json").read_text()


def test_speculative_report_is_parsed_from_the_real_output():
    stats = peer.parse_speculative(SPEC_OUT)
    assert stats["prompt_tokens"] == 118 and stats["num_new_tokens"] == 11
    assert stats["encode_s"] == pytest.approx(16.944) and stats["decode_s"] == pytest.approx(7.954)
    assert stats["decode_tok_s"] == pytest.approx(1.383) and stats["draft_max"] == 4
    assert (stats["num_draft_tokens"], stats["num_accepted_tokens"]) == (8, 8)
    assert stats["num_verify_steps"] == 3  # 11 tokens = 8 accepted + one target token per step


def test_truncated_speculative_output_fails_with_its_tail():
    cut = SPEC_OUT[: SPEC_OUT.index("n_accept")]
    with pytest.raises(peer.PeerError, match="n_drafted = 8"):
        peer.parse_speculative(cut)


def test_generated_text_is_what_follows_the_echoed_prompt():
    stdout = SPEC_OUT[: SPEC_OUT.index("warning: no usable GPU")]  # the fixture is stdout, then stderr
    prompt = stdout[2: stdout.index("    for i in range")]
    assert peer.generated_text(stdout, prompt) == "    for i in range(len(numbers)):\n        for j"
    assert peer.generated_text(stdout, "another prompt") is None


def test_bench_json_becomes_a_row_per_repetition():
    (record,) = peer.parse_bench(BENCH_OUT)
    assert record["model_type"] == "qwen2 1.5B Q4_K - Medium" and record["n_gen"] == 4
    run = peer.bench_run("llama.cpp q4km tg", record)
    assert run["walls_s"] == pytest.approx([4 / 0.531916, 4 / 0.766283])
    assert run["tokens_per_s"] == pytest.approx(0.6491) and run["tokens"] is None and run["prompts"] == 0
    with pytest.raises(peer.PeerError, match="not the expected JSON"):
        peer.parse_bench("main: error: failed to load model\n")


def test_byte_decoder_inverts_byte_level_bpe():
    table = peer.byte_decoder()
    assert sorted(table.values()) == list(range(256))
    assert (table["Ġ"], table["Ċ"], table["a"], table["ÿ"]) == (32, 10, 97, 255)


def args_for(tmp_path, *extra) -> list[str]:
    gguf = tmp_path / "gguf"
    gguf.mkdir(exist_ok=True)
    return ["--phases", "llama_cpp", "--gguf-dir", str(gguf), "--work-dir", str(tmp_path / "w"),
            "--results", str(tmp_path / "res"), *extra]


def test_missing_source_and_build_is_refused_in_one_line(tmp_path, capsys):
    assert main(args_for(tmp_path, "--llama-src", str(tmp_path / "none.tar.gz"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "benchmarks/llama_cpp_source.sh" in err and "Traceback" not in err
    assert not (tmp_path / "res").exists()


def test_missing_gguf_and_tiny_are_refused(tmp_path, capsys):
    src = tmp_path / "src.tar.gz"
    src.write_bytes(b"x")
    assert main(args_for(tmp_path, "--llama-src", str(src))) == 2
    assert "qwen2.5-coder-1.5b-instruct.gguf not found" in capsys.readouterr().err
    assert main(args_for(tmp_path, "--llama-src", str(src), "--tiny")) == 2
    assert "drop --tiny" in capsys.readouterr().err


def fake_build(root: Path, stamp: dict | None) -> None:
    bins = root / "llama.cpp/build/bin"
    bins.mkdir(parents=True)
    for tool in peer.TOOLS:
        (bins / tool).write_text("")
    if stamp is not None:
        (root / "llama.cpp/DFVG_BUILD").write_text(json.dumps(stamp))


def tarball(path: Path, cmake_lists: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (("llama.cpp/CMakeLists.txt", cmake_lists), ("llama.cpp/DFVG_SOURCE", "test")):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def test_a_build_of_the_same_tarball_and_flags_is_reused(tmp_path):
    src = tarball(tmp_path / "src.tar.gz", "project(x)\n")
    import hashlib

    fake_build(tmp_path / "b", {"source_sha256": hashlib.sha256(src.read_bytes()).hexdigest(), "cuda": True})
    bins, info = peer.build(src, tmp_path / "b", cuda=True, jobs=2)
    assert info["reused"] and bins == tmp_path / "b/llama.cpp/build/bin"


def test_a_stale_build_is_rebuilt_and_a_failing_cmake_raises_with_its_output(tmp_path):
    src = tarball(tmp_path / "src.tar.gz", 'cmake_minimum_required(VERSION 3.14)\nmessage(FATAL_ERROR "boom 42")\n')
    fake_build(tmp_path / "b", {"source_sha256": "old", "cuda": False})
    with pytest.raises(peer.PeerError, match="boom 42"):
        peer.build(src, tmp_path / "b", cuda=False, jobs=2)
    assert not (tmp_path / "b/llama.cpp/build/bin/llama-bench").exists()  # the stale binaries are gone


def test_a_build_stopped_midway_resumes_without_unpacking_again(tmp_path):
    """Same stamp, binaries missing (a call killed mid-build): the unpacked tree is kept and cmake runs on it."""
    import hashlib

    src = tarball(tmp_path / "src.tar.gz", 'message(FATAL_ERROR "from the tarball")\n')
    tree = tmp_path / "b/llama.cpp"
    tree.mkdir(parents=True)
    (tree / "DFVG_BUILD").write_text(json.dumps({"source_sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
                                                 "cuda": False}))
    (tree / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.14)\nmessage(FATAL_ERROR "resumed")\n')
    with pytest.raises(peer.PeerError, match="resumed"):
        peer.build(src, tmp_path / "b", cuda=False, jobs=2)


def test_cuda_flags_only_for_cuda_and_only_the_three_tools():
    configure, build = peer.cmake_commands(Path("src"), cuda=True, jobs=15)
    assert "-DGGML_CUDA=ON" in configure and "-DCMAKE_CUDA_ARCHITECTURES=90" in configure
    assert build[-4:] == ["--target", "llama-bench", "llama-speculative", "llama-quantize"]
    assert "-DGGML_CUDA=ON" not in peer.cmake_commands(Path("src"), cuda=False, jobs=2)[0]


def run(walls: list[float], tokens: list[list[int]], stats=None) -> dict:
    n = sum(map(len, tokens))
    return {"walls_s": walls, "tokens": tokens, "stats": stats or [None] * len(tokens), "new_tokens": n,
            "tokens_per_s": n / sum(walls), "median_ms_per_token": 1.0}


def dstat(decode_s: float) -> dict:
    return {"num_draft_tokens": 0, "num_accepted_tokens": 0, "num_verify_steps": 4, "decode_s": decode_s,
            "num_new_tokens": 4}


def test_report_merges_llama_cpp_on_its_held_out_prompts(tmp_path):
    """4 prompts: index 0 validates, 1..3 are held out. DFVG k=2 is faster on the validation prompt, k=4 on the
    held-out ones: the comparison takes k=2 (chosen like llama.cpp's draft length), on prompts 1..3."""
    toks = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9], [4, 3, 2, 1]]
    plain = run([2.0, 2.0, 2.0, 2.0], toks, [dstat(0.004)] * 4)
    k2 = run([0.5, 1.0, 1.0, 1.0], [toks[0], toks[1], [9, 9, 0, 0], toks[3]])
    k4 = run([1.0, 0.5, 0.5, 0.5], toks)
    spec_stats = {**peer.parse_speculative(SPEC_OUT), "num_new_tokens": 4, "encode_s": 1.0, "decode_s": 1.0}
    prompts = [{"id": f"p{i}", "ids": [0] * 118} for i in range(4)]
    spec = peer.speculative_run("llama.cpp spec d=4", prompts, [1, 2, 3], lambda p: dict(spec_stats))
    bench = peer.bench_run("llama.cpp bf16 tg", {**peer.parse_bench(BENCH_OUT)[0], "samples_ts": [500.0],
                                                 "avg_ts": 500.0, "n_gen": 128})
    (tmp_path / "dfvg.json").write_text(json.dumps({"dfvg_plain": plain, "dfvg_spec_k2": k2, "dfvg_spec_k4": k4,
                                                    "weight_bytes": {"target": 3_000_000_000}}))
    (tmp_path / "llama_cpp.json").write_text(json.dumps({
        "llama_cpp_bf16_tg128": bench, "llama_cpp_spec_d4": spec,
        "llama_cpp_validation": {"prompt_indices": [0], "chosen_draft_max": 4}}))
    merged = report(tmp_path)
    rows = {r["variant"]: r for r in merged["rows"]}
    assert spec["tokens_per_s"] == pytest.approx(2.0) and spec["prompt_tokens_match"] == 3
    assert rows["dfvg_spec_k2"]["x_llama_cpp_spec"] == pytest.approx((12 / 3.0) / 2.0)
    assert rows["llama_cpp_spec_d4"]["x_dfvg_plain"] == pytest.approx(2.0 / (12 / 6.0))
    assert rows["llama_cpp_bf16_tg128"]["x_llama_cpp_spec"] is None and rows["llama_cpp_spec_d4"]["match_vs_hf"] is None
    vs = merged["vs_llama_cpp"]
    assert vs["dfvg_spec"] == "dfvg_spec_k2" and vs["dfvg_spec_over_llama_cpp_spec"] == pytest.approx(2.0)
    assert vs["dfvg_plain_decode_over_llama_cpp_bf16_tg128"] == pytest.approx(1000 / 1.0 / 500.0)
    assert merged["fraction_of_floor"] == pytest.approx(3e9 / (COPY_TB_S * 1e12) * 1e3 / 1.0)  # no GPU named: H200
    assert merged["spec_compared"] == "dfvg_spec_k4"  # the fastest speculative row over all prompts
    assert (merged["spec_identical_to_plain"], merged["prompts_compared"]) == (4, 4)


def test_the_best_draft_is_any_speculative_row_and_the_issue_goals_follow_it(tmp_path):
    """The feature head (dfvg_feature_k4) is the fastest draft on the validation prompt: the llama.cpp
    comparison takes it, not the 0.5B draft's dfvg_spec_k4, and so do both of issue 16's speculative goals,
    although its tree is the fastest row over all prompts (the fields spec_identical_to_plain and
    spec_compared). No plain row counts as speculative (dfvg_plain_eager is the fastest row here)."""
    toks = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9], [4, 3, 2, 1]]
    plain = run([2.0, 2.0, 2.0, 2.0], toks, [dstat(0.004)] * 4)
    head = run([0.25, 0.25, 0.25, 0.5], [toks[0], toks[1], toks[2], [4, 3, 0, 0]])
    spec_stats = {**peer.parse_speculative(SPEC_OUT), "num_new_tokens": 4, "encode_s": 1.0, "decode_s": 1.0}
    prompts = [{"id": f"p{i}", "ids": [0] * 118} for i in range(4)]
    spec = peer.speculative_run("llama.cpp spec d=4", prompts, [1, 2, 3], lambda p: dict(spec_stats))
    bench = peer.bench_run("llama.cpp bf16 tg", {**peer.parse_bench(BENCH_OUT)[0], "samples_ts": [500.0],
                                                 "avg_ts": 500.0, "n_gen": 128})
    (tmp_path / "dfvg.json").write_text(json.dumps({
        "dfvg_plain": plain, "dfvg_plain_eager": run([0.1] * 4, toks), "dfvg_spec_k4": run([1.0] * 4, toks),
        "dfvg_feature_k4": head, "dfvg_feature_tree_dynamic16": run([0.3, 0.2, 0.2, 0.2], toks),
        "weight_bytes": {"target": 3_000_000_000}}))
    (tmp_path / "llama_cpp.json").write_text(json.dumps({
        "llama_cpp_bf16_tg128": bench, "llama_cpp_spec_d4": spec,
        "llama_cpp_validation": {"prompt_indices": [0], "chosen_draft_max": 4}}))
    merged = report(tmp_path)
    vs = merged["vs_llama_cpp"]
    assert vs["dfvg_spec"] == "dfvg_feature_k4" and vs["dfvg_spec_over_llama_cpp_spec"] == pytest.approx(12 / 1.0 / 2.0)
    assert merged["spec_compared"] == "dfvg_feature_tree_dynamic16"
    assert (merged["spec_identical_to_plain"], merged["prompts_compared"]) == (4, 4)
    assert merged["identical_to_plain_by_row"] == {"dfvg_spec_k4": 4, "dfvg_feature_k4": 3,
                                                   "dfvg_feature_tree_dynamic16": 4}
    assert merged["tree_identical_to_plain"] == {"dfvg_feature_tree_dynamic16": 4}
    goals = merged["issue16_goals"]
    assert (goals["spec_row"], goals["spec_row_identical_to_plain"]) == ("dfvg_feature_k4", 3)
    assert goals["spec_3x_llama_cpp_spec"] is True  # 6x
    assert goals["spec_identical_to_plain_20_of_20"] is False  # the head's 3 of 4, not its tree's 4 of 4
    assert goals["plain_1.8x_llama_cpp_bf16"] is True  # 1000 tok/s decode-only against 500
    assert goals["plain_80pct_of_floor"] is False  # 3 GB at 4.3 TB/s: 0.70 ms floor against 1.0 ms


def test_unparsable_tool_output_fails_the_phase_with_the_raw_tail(tmp_path, capsys):
    """Scripts in place of the built tools: llama-quantize writes its output, llama-bench prints an error. The
    phase file records the failure and llama-bench's own words, and holds no speed."""
    import hashlib

    src = tarball(tmp_path / "src.tar.gz", "project(x)\n")
    root = tmp_path / "w/peers"
    fake_build(root, {"source_sha256": hashlib.sha256(src.read_bytes()).hexdigest(), "cuda": False})
    bins = root / "llama.cpp/build/bin"
    (bins / "llama-quantize").write_text('#!/bin/sh\ntouch "$3"\n')
    (bins / "llama-bench").write_text("#!/bin/sh\necho 'error: unknown model arch qwen9'\n")
    for tool in peer.TOOLS:
        (bins / tool).chmod(0o755)
    for name in ("qwen2.5-coder-1.5b-instruct.gguf", "qwen2.5-coder-0.5b-instruct.gguf"):
        (tmp_path / "gguf").mkdir(exist_ok=True)
        (tmp_path / "gguf" / name).write_bytes(b"")
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"id": f"p{i}", "ids": [1, 2]} for i in range(3)]))
    assert main(args_for(tmp_path, "--llama-src", str(src), "--prompts-file", str(prompts))) == 2
    assert "--llama-validation 3 must be >= 1 and leave held-out prompts (3 prompts)" in capsys.readouterr().err
    assert main(args_for(tmp_path, "--llama-src", str(src), "--device", "cpu", "--prompts-file", str(prompts),
                         "--llama-validation", "1")) == 0
    payload = json.loads((tmp_path / "res/llama_cpp.json").read_text())
    assert payload["failed"].startswith("PeerError: llama-bench output is not the expected JSON")
    assert "unknown model arch qwen9" in payload["failed_detail"]
    assert not any(isinstance(v, dict) and "tokens_per_s" in v for v in payload.values())
