"""llama.cpp as a peer of DFVG in benchmarks/gpu_speed.py (`--phases llama_cpp`), measured in the same lease.

Owns: building llama.cpp inside the benchmark from the carried source tarball (benchmarks/llama_cpp_source.sh;
the GPU machine has nvcc, cmake and ninja but no internet), the BF16 GGUF of the target, the llama-bench and
llama-speculative runs, and the parsing of their outputs. It does not own DFVG's timing or the table:
benchmarks/gpu_report.py merges `<results>/llama_cpp.json` with the other phase files.

Why a BF16 copy of the target: DFVG and the Hugging Face peers run the Q4_K_M GGUF dequantized to bf16, so
`llama-quantize --allow-requantize ... BF16` gives llama.cpp the same dequantized weights (the draft stays
Q4_K_M, as llama.cpp users run it). Every number comes from the tool's own report; a run whose output does not
parse raises with the raw tail, and the phase is recorded as failed, never filled in.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import statistics
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / ".peers/llama.cpp.tar.gz"
TOOLS = ("llama-bench", "llama-speculative", "llama-quantize")
BF16_NOTE = ("target BF16 = llama-quantize --allow-requantize of the Q4_K_M GGUF, i.e. the dequantized weights "
             "DFVG and the HF peers run in bf16; draft = the 0.5B Q4_K_M GGUF as shipped")


class PeerError(RuntimeError):
    """A llama.cpp step failed or printed something we cannot parse; the message carries the raw tail."""


def add_arguments(p) -> None:
    """The phase's options on gpu_speed.py's parser (draft lengths reuse its `draft_lengths` type)."""
    from benchmarks.gpu_speed import draft_lengths

    p.add_argument("--llama-src", default=str(SOURCE), help="llama.cpp source tarball (llama_cpp_source.sh)")
    p.add_argument("--llama-build", default=None, help="unpack and build here (default <work-dir>/peers); reused")
    p.add_argument("--llama-draft-max", default="4,8,16", type=draft_lengths,
                   help="llama-speculative draft lengths tried on the validation prompts")
    p.add_argument("--llama-validation", type=int, default=3, help="first N prompts choose the draft length")
    p.add_argument("--llama-jobs", type=int, default=15, help="cmake --build -j")
    p.add_argument("--llama-bench-reps", type=int, default=5)


def build_dir(args) -> Path:
    return Path(args.llama_build or Path(args.work_dir) / "peers")


def refusal(args) -> str | None:
    """The one-line reason this phase cannot start (checked before any phase runs), or None."""
    bins = build_dir(args) / "llama.cpp/build/bin"
    if args.tiny:
        return "error: --phases llama_cpp runs the real GGUFs; drop --tiny"
    if args.skip_draft:
        return "error: --phases llama_cpp needs the 0.5B draft GGUF; drop --skip-draft"
    if not Path(args.llama_src).is_file() and not all((bins / t).is_file() for t in TOOLS):
        return (f"error: no llama.cpp source at {args.llama_src} and no build in {bins}: run "
                "bash benchmarks/llama_cpp_source.sh here and carry .peers/llama.cpp.tar.gz")
    for name in ("qwen2.5-coder-1.5b-instruct.gguf", "qwen2.5-coder-0.5b-instruct.gguf"):
        if not (Path(args.gguf_dir) / name).is_file():
            return f"error: {Path(args.gguf_dir) / name} not found: pass --gguf-dir with both GGUFs"
    if not Path(args.prompts_file).is_file():
        return f"error: --prompts-file {args.prompts_file} not found: write it with gpu_speed.py --write-prompts"
    count = min(args.prompts, len(json.loads(Path(args.prompts_file).read_text())))
    if not 1 <= args.llama_validation < count:
        return (f"error: --llama-validation {args.llama_validation} must be >= 1 and leave held-out prompts "
                f"({count} prompts)")
    return None


def cmake_commands(source: Path, cuda: bool, jobs: int) -> list[list[str]]:
    """Configure and build only the three tools; CUDA for sm_90 (H200), no network, no server/tests/app."""
    configure = ["cmake", "-S", str(source), "-B", str(source / "build"), "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    if cuda:
        configure += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    return [configure, ["cmake", "--build", str(source / "build"), "-j", str(jobs), "--target", *TOOLS]]


def run_tool(cmd: list[str], log: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run one llama.cpp command; a non-zero exit raises PeerError with the last lines of its output."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        raise PeerError(f"{Path(cmd[0]).name} exited {done.returncode}: {tail(done.stdout + done.stderr)}")
    return done


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def build(src: Path, root: Path, cuda: bool, jobs: int) -> tuple[Path, dict]:
    """Unpack into root/llama.cpp and build; reuse a build of the same tarball and flags (a stamp file written
    right after unpacking, so a call stopped mid-build resumes it: cmake and ninja redo only what is missing)."""
    bins, stamp_file = root / "llama.cpp/build/bin", root / "llama.cpp/DFVG_BUILD"
    digest = hashlib.sha256(src.read_bytes()).hexdigest() if src.is_file() else None
    stamp = {"source_sha256": digest, "cuda": cuda}
    old = json.loads(stamp_file.read_text()) if stamp_file.is_file() else None
    if all((bins / t).is_file() for t in TOOLS) and (digest is None or old == stamp):
        return bins, {**(old or stamp), "reused": True}
    if digest is None:
        raise PeerError(f"no llama.cpp source at {src} to rebuild {bins}")
    if old != stamp:
        shutil.rmtree(root / "llama.cpp", ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(src) as tar:
            tar.extractall(root, filter="data")
        stamp_file.write_text(json.dumps(stamp))
    for cmd in cmake_commands(root / "llama.cpp", cuda, jobs):
        run_tool(cmd, root / "build.log", timeout=1800)
    version = (root / "llama.cpp/DFVG_SOURCE").read_text().strip()
    return bins, {**stamp, "reused": False, "source": version, "cmake": cmake_commands(Path("llama.cpp"), cuda, jobs)}


def bf16_target(bins: Path, q4: Path, work: Path) -> Path:
    """The target's BF16 GGUF (made once per work dir): Q4_K_M dequantized, as DFVG's bf16 weights are."""
    out = work / "qwen2.5-coder-1.5b-instruct-bf16.gguf"
    if not out.is_file():
        work.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        run_tool([str(bins / "llama-quantize"), "--allow-requantize", str(q4), str(partial), "BF16"], timeout=900)
        partial.rename(out)
    return out


def parse_bench(stdout: str) -> list[dict]:
    """llama-bench -o json: one record per test; keep what identifies it and every repetition's speed."""
    try:
        records = json.loads(stdout)
        return [{"model_type": r["model_type"], "model_size": r["model_size"], "n_prompt": r["n_prompt"],
                 "n_gen": r["n_gen"], "n_gpu_layers": r["n_gpu_layers"], "avg_ts": r["avg_ts"],
                 "samples_ts": r["samples_ts"], "build_commit": r.get("build_commit"),
                 "gpu_info": r.get("gpu_info"), "flash_attn": r.get("flash_attn")} for r in records]
    except (ValueError, KeyError, TypeError) as exc:
        raise PeerError(f"llama-bench output is not the expected JSON ({exc}): {tail(stdout)}") from None


def bench_run(name: str, record: dict) -> dict:
    """A llama-bench tg record as a report row: one 'wall' per repetition, no prompt and no token list."""
    n, speeds = record["n_gen"], record["samples_ts"]
    if not n or not speeds:
        raise PeerError(f"llama-bench record without a generation test: {record}")
    return {"name": name, "walls_s": [n / s for s in speeds], "tokens": None, "stats": [None] * len(speeds),
            "new_tokens": n * len(speeds), "tokens_per_s": record["avg_ts"],
            "median_ms_per_token": 1000 / statistics.median(speeds), "prompts": 0,
            "what": f"llama-bench tg{n} -p 0 (empty context), {len(speeds)} repetitions", "bench": record,
            "provenance": "measured"}


SPEC_FIELDS = {  # llama-speculative's closing report (examples/speculative/speculative.cpp)
    "prompt_tokens": r"encoded\s+(\d+) tokens in",
    "encode_s": r"encoded\s+\d+ tokens in\s+([\d.]+) seconds",
    "num_new_tokens": r"decoded\s+(\d+) tokens in",
    "decode_s": r"decoded\s+\d+ tokens in\s+([\d.]+) seconds",
    "decode_tok_s": r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s",
    "draft_max": r"n_draft\s+=\s+(\d+)",
    "num_draft_tokens": r"n_drafted\s+=\s+(\d+)",
    "num_accepted_tokens": r"n_accept\s+=\s+(\d+)",
}


def parse_speculative(text: str) -> dict:
    """The numbers llama-speculative prints at exit. Verify steps are derived, not printed: in greedy mode each
    step emits its accepted drafts plus one target token, so steps = decoded - accepted (`derived`)."""
    out = {}
    for key, pattern in SPEC_FIELDS.items():
        found = re.findall(pattern, text)
        if not found:
            raise PeerError(f"llama-speculative printed no {key!r} ({pattern}): {tail(text)}")
        out[key] = float(found[-1]) if "." in found[-1] else int(found[-1])
    out["num_verify_steps"] = out["num_new_tokens"] - out["num_accepted_tokens"]
    out["num_verify_steps_provenance"] = "derived"
    return out


def byte_decoder() -> dict[str, int]:
    """Inverse of byte-level BPE's byte-to-character map: printable Latin-1 bytes stand for themselves, the
    other 68 bytes were shifted to code points 256.. in byte order (how Qwen2's GGUF vocabulary spells tokens)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in keep]
    table = {chr(b): b for b in keep}
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


def detokenizer(gguf_path: Path):
    """ids -> text from the GGUF's own vocabulary: the prompts file holds token ids (DFVG's input); llama-speculative
    takes text, and its reported prompt token count is checked against the ids (`prompt_tokens_match`)."""
    from gguf import GGUFReader

    tokens = GGUFReader(gguf_path).fields["tokenizer.ggml.tokens"].contents()
    table = byte_decoder()
    return lambda ids: bytes(table[c] for i in ids for c in tokens[i]).decode("utf-8")


def speculative_cmd(bins: Path, target: Path, draft: Path, text: str, d: int, n: int, ngl: int) -> list[str]:
    """Greedy chain drafting (one draft sequence), fixed length: EOS ignored as in DFVG's runs; the prompt as
    an argument with escapes off (a file would lose its final newline; escapes would rewrite backslashes)."""
    return [str(bins / "llama-speculative"), "-m", str(target), "-md", str(draft), "-ngl", str(ngl), "-ngld", str(ngl),
            "--spec-draft-n-max", str(d), "--temp", "0", "--seed", "0", "-n", str(n), "--ignore-eos",
            "-c", "4096", "--no-escape", "-p", text]


def speculative_run(name: str, prompts: list[dict], indices: list[int], run_one) -> dict:
    """Prompts through llama-speculative, one process each; per-prompt time = llama.cpp's own encode + decode
    timers (model loading excluded, as DFVG's and HF's warm timings exclude it)."""
    stats = [run_one(prompts[i]) for i in indices]
    walls = [s["encode_s"] + s["decode_s"] for s in stats]
    n = sum(s["num_new_tokens"] for s in stats)
    result = {"name": name, "walls_s": walls, "tokens": None, "stats": stats, "new_tokens": n,
              "tokens_per_s": n / sum(walls), "decode_tokens_per_s": n / sum(s["decode_s"] for s in stats),
              "median_ms_per_token": statistics.median(1000 * w / s["num_new_tokens"] for w, s in zip(
                  walls, stats, strict=True)), "prompt_indices": indices, "provenance": "measured",
              "prompt_tokens_match": sum(s["prompt_tokens"] == len(prompts[i]["ids"]) for s, i in zip(
                  stats, indices, strict=True))}
    print(f"  {name:<28} {result['tokens_per_s']:9.1f} tok/s  (decode only {result['decode_tokens_per_s']:.1f})",
          flush=True)
    return result


def generated_text(stdout: str, prompt: str) -> str | None:
    """The continuation llama-speculative printed: its stdout is "\n\n" + prompt + new text + "\n\n" twice (None if
    the echoed prompt differs), kept so its text can be set beside DFVG's decoded tokens later."""
    head = "\n\n" + prompt
    return stdout[len(head):].removesuffix("\n\n\n\n") if stdout.startswith(head) else None


def spec_runner(bins: Path, target: Path, draft: Path, decode, d: int, n: int, ngl: int):
    def run_one(prompt: dict) -> dict:
        text = decode(prompt["ids"])
        done = run_tool(speculative_cmd(bins, target, draft, text, d, n, ngl))
        return {"id": prompt["id"], **parse_speculative(done.stdout + done.stderr),
                "generated_text": generated_text(done.stdout, text)}

    return run_one


def phase_llama_cpp(args, prompts: list[dict], checkpoint=lambda payload: None) -> dict:
    """Build, BF16 copy, llama-bench tg for BF16 and Q4_K_M, then llama-speculative: the draft length chosen
    on the first `--llama-validation` prompts, quoted on the rest (held out from the choice). `checkpoint`
    saves what is measured so far, so a call stopped by its time limit keeps it."""
    cuda = args.device.startswith("cuda")
    ngl, gguf = (99 if cuda else 0), Path(args.gguf_dir)
    q4, draft = gguf / "qwen2.5-coder-1.5b-instruct.gguf", gguf / "qwen2.5-coder-0.5b-instruct.gguf"
    bins, built = build(Path(args.llama_src), build_dir(args), cuda, args.llama_jobs)
    out = {"llama_cpp_build": built, "llama_cpp_weights": BF16_NOTE}
    bf16 = bf16_target(bins, q4, Path(args.work_dir))
    for tag, model in (("bf16", bf16), ("q4km", q4)):
        done = run_tool([str(bins / "llama-bench"), "-m", str(model), "-ngl", str(ngl), "-p", "0",
                         "-n", str(args.max_new_tokens), "-r", str(args.llama_bench_reps), "-o", "json"])
        records = parse_bench(done.stdout)
        if len(records) != 1:
            raise PeerError(f"llama-bench gave {len(records)} records for one test: {tail(done.stdout)}")
        record = records[0]
        out[f"llama_cpp_{tag}_tg{args.max_new_tokens}"] = bench_run(f"llama.cpp {tag} tg", record)
        print(f"  llama-bench {tag} tg{args.max_new_tokens}: {record['avg_ts']:.1f} tok/s", flush=True)
        checkpoint(dict(out))
    decode = detokenizer(q4)
    runner = lambda d: spec_runner(bins, bf16, draft, decode, d, args.max_new_tokens, ngl)
    valid, held = list(range(args.llama_validation)), list(range(args.llama_validation, len(prompts)))
    tried = {d: speculative_run(f"llama.cpp spec d={d} (valid.)", prompts, valid, runner(d))
             for d in args.llama_draft_max}
    best = max(tried, key=lambda d: tried[d]["tokens_per_s"])
    out["llama_cpp_validation"] = {"prompt_indices": valid, "chosen_draft_max": best, **{
        f"d{d}": {k: v for k, v in r.items() if k != "walls_s"} for d, r in tried.items()}}
    checkpoint(dict(out))
    out[f"llama_cpp_spec_d{best}"] = speculative_run(f"llama.cpp spec d={best}", prompts, held, runner(best))
    return out
