"""benchmarks/device_pack.py: files cut into chunks for the device machine come back whole, or are refused."""

from __future__ import annotations

import os

import pytest

from benchmarks.device_pack import MANIFEST, main, pack, unpack
from dfvg.errors import UserError


@pytest.fixture
def files(tmp_path):
    """A 'GGUF' of 2.5 chunks and a draft folder of two files, so files start and end inside chunks."""
    src = tmp_path / "src"
    (src / "draft").mkdir(parents=True)
    (src / "model.gguf").write_bytes(os.urandom(2500))
    (src / "draft" / "config.json").write_bytes(b'{"hidden_size": 8}')
    (src / "draft" / "model.safetensors").write_bytes(os.urandom(1234))
    return src


def test_the_files_come_back_bit_for_bit_where_the_manifest_puts_them(files, tmp_path):
    manifest = pack([f"{files / 'model.gguf'}:cache/gguf/model.gguf", f"{files / 'draft'}:repo/drafts/d"],
                    tmp_path / "chunks", 1000)
    assert [c["size"] for c in manifest["chunks"]] == [1000, 1000, 1000, 752]  # 2500 + 18 + 1234 bytes
    written = unpack(tmp_path / "chunks", tmp_path / "root")
    assert [p.relative_to(tmp_path / "root").as_posix() for p, _ in written] == [
        "cache/gguf/model.gguf", "repo/drafts/d/config.json", "repo/drafts/d/model.safetensors"]
    assert (tmp_path / "root/cache/gguf/model.gguf").read_bytes() == (files / "model.gguf").read_bytes()
    assert (tmp_path / "root/repo/drafts/d/model.safetensors").read_bytes() == \
        (files / "draft/model.safetensors").read_bytes()
    assert not list((tmp_path / "root").rglob("*.partial"))


def test_a_damaged_or_missing_chunk_is_named_and_nothing_is_written(files, tmp_path, capsys):
    chunks = tmp_path / "chunks"
    pack([f"{files / 'model.gguf'}:model.gguf"], chunks, 1000)
    data = bytearray((chunks / "c01").read_bytes())
    data[7] ^= 1
    (chunks / "c01").write_bytes(bytes(data))
    (chunks / "c02").unlink()
    assert main(["unpack", "--chunks", str(chunks), "--root", str(tmp_path / "root")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: chunks missing or damaged in {chunks}: c01 c02 (carry them again)"
    assert not (tmp_path / "root").exists()


def test_a_manifest_of_other_files_is_refused_at_the_file(files, tmp_path):
    chunks = tmp_path / "chunks"
    pack([f"{files / 'model.gguf'}:model.gguf"], chunks, 1000)
    manifest = (chunks / MANIFEST).read_text().replace('"sha256": "', '"sha256": "0', 1)  # the file's, not a chunk's
    (chunks / MANIFEST).write_text(manifest)
    with pytest.raises(UserError, match="model.gguf: SHA-256 differs"):
        unpack(chunks, tmp_path / "root")
    assert not list((tmp_path / "root").rglob("*"))  # no partial file left


def test_bad_arguments_are_one_line_errors(files, tmp_path, capsys):
    out = str(tmp_path / "c")
    for argv, message in [
        (["pack", "--out", out, str(files / "model.gguf")], "give SRC:DEST with DEST a relative path"),
        (["pack", "--out", out, f"{files / 'model.gguf'}:/abs"], "give SRC:DEST with DEST a relative path"),
        (["pack", "--out", out, f"{files / 'none'}:x"], "does not exist"),
        (["pack", "--out", out, f"{files / 'model.gguf'}:."], "give SRC:DEST with DEST a relative path"),
        (["pack", "--out", out, f"{files / 'model.gguf'}:x", f"{files / 'draft/config.json'}:x"], "two sources for x"),
        (["pack", "--out", out, f"{files}:d"], "holds folders"),
        (["pack", "--out", out, "--chunk-mib", "0", f"{files / 'model.gguf'}:x"], "must be at least 1"),
        (["unpack", "--chunks", str(tmp_path / "nowhere"), "--root", out], "carry the manifest with the chunks"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
