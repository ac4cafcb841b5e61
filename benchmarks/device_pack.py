"""Ship large files to the device machine in chunks, and put them back together there, checked.

Why: a device call carries at most 64 MiB (the working tree included), and the machine keeps its files only
while warm. The target's GGUF (1.1 GB), the 0.5B draft's and the shipped drafts (118 MB, tracked, so they must
leave the tree for each call) travel as one stream cut into chunks, carried one per call. Until now that stream
was cut back apart by hand-written byte offsets in each lease script; a manifest now records each file's place
in the stream and its SHA-256, and `unpack` refuses anything that does not match, naming the chunk to carry again.

    python benchmarks/device_pack.py pack --out .chunks/p \\
        /root/.cache/dfvg/gguf/qwen2.5-coder-1.5b-instruct.gguf:gguf/qwen2.5-coder-1.5b-instruct.gguf \\
        drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768-fh:drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768-fh
    # there, after every chunk and manifest.json arrived in /root/p (the lease scripts: h200_weights.sh):
    python3 benchmarks/device_pack.py unpack --chunks /root/p --root /root/unpacked

A source that is a folder packs every file in it (a flat folder, as a draft's is). Destinations are relative
paths under unpack's --root; h200_weights.sh expects GGUFs under gguf/ and drafts under drafts/.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.download import sha256_file  # noqa: E402  (hashlib only: no torch on this import path)
from dfvg.errors import EXIT_USER_ERROR, OneLineParser, UserError  # noqa: E402

MANIFEST, FORMAT = "manifest.json", 1
BLOCK = 1 << 22  # bytes read at a time


def sources(pairs: list[str]) -> list[tuple[Path, str]]:
    """(file, destination) for each SRC:DEST argument, a folder's files under DEST/<name>."""
    out = []
    for pair in pairs:
        src, sep, dest = pair.rpartition(":")
        parts = Path(dest).parts
        if not sep or not src or not parts or Path(dest).is_absolute() or ".." in parts or parts == (".",):
            raise UserError(f"{pair!r}: give SRC:DEST with DEST a relative path (e.g. m.gguf:gguf/m.gguf)")
        path = Path(src)
        if path.is_dir():
            if any(f.is_dir() for f in path.iterdir()):
                raise UserError(f"{src} holds folders: pack its files, or each folder, as their own SRC:DEST")
            out += [(f, f"{dest}/{f.name}") for f in sorted(path.iterdir()) if f.is_file()]
        elif path.is_file():
            out.append((path, dest))
        else:
            raise UserError(f"{src} does not exist")
    dests = [Path(dest).as_posix() for _, dest in out]
    twice = sorted({d for d in dests if dests.count(d) > 1})
    if twice:
        raise UserError(f"two sources for {twice[0]}: give every file its own DEST")
    return out


def pack(pairs: list[str], out: Path, chunk_bytes: int) -> dict:
    """Write the files' concatenation as chunks c00, c01, ... of `chunk_bytes` and the manifest beside them."""
    files = sources(pairs)
    if not files:
        raise UserError("nothing to pack")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("c[0-9]*"), out / MANIFEST]:
        stale.unlink(missing_ok=True)
    chunks: list[dict] = []
    writer = ChunkWriter(out, chunk_bytes, chunks)
    entries = []
    for path, dest in files:
        digest, size = hashlib.sha256(), 0
        with path.open("rb") as f:
            while block := f.read(BLOCK):
                digest.update(block)
                size += len(block)
                writer.write(block)
        entries.append({"dest": dest, "size": size, "sha256": digest.hexdigest()})
    writer.close()
    manifest = {"format": FORMAT, "files": entries, "chunks": chunks}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


class ChunkWriter:
    """Cuts one byte stream into numbered chunk files, recording each one's size and SHA-256."""

    def __init__(self, out: Path, chunk_bytes: int, record: list[dict]):
        self.out, self.limit, self.record = out, chunk_bytes, record
        self.file, self.digest, self.size = None, None, 0

    def write(self, data: bytes) -> None:
        while data:
            if self.file is None:
                name = f"c{len(self.record):02d}"
                self.file, self.digest, self.size = (self.out / name).open("wb"), hashlib.sha256(), 0
                self.record.append({"name": name})
            take = data[: self.limit - self.size]
            self.file.write(take)
            self.digest.update(take)
            self.size += len(take)
            data = data[len(take):]
            if self.size == self.limit:
                self.close()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.record[-1].update(size=self.size, sha256=self.digest.hexdigest())
            self.file = None


def check_chunks(chunks: Path, manifest: dict) -> None:
    """Every chunk present, whole and intact, or one line naming those to carry again."""
    bad = []
    for chunk in manifest["chunks"]:
        path = chunks / chunk["name"]
        if not path.is_file() or path.stat().st_size != chunk["size"] or sha256_file(path) != chunk["sha256"]:
            bad.append(chunk["name"])
    if bad:
        raise UserError(f"chunks missing or damaged in {chunks}: {' '.join(bad)} (carry them again)")


def unpack(chunks: Path, root: Path) -> list[tuple[Path, str]]:
    """The manifest's files under `root`, each written to a temporary name and renamed once its SHA-256 checks."""
    if not (chunks / MANIFEST).is_file():
        raise UserError(f"{chunks / MANIFEST} not found: carry the manifest with the chunks")
    manifest = json.loads((chunks / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise UserError(f"{chunks / MANIFEST} has format {manifest.get('format')}, this script reads {FORMAT}")
    check_chunks(chunks, manifest)
    stream = ChunkReader([chunks / c["name"] for c in manifest["chunks"]])
    written = []
    for entry in manifest["files"]:
        target = root / entry["dest"]
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        with partial.open("wb") as f:
            for block in stream.read(entry["size"]):
                digest.update(block)
                f.write(block)
        if digest.hexdigest() != entry["sha256"]:
            partial.unlink()
            raise UserError(f"{entry['dest']}: SHA-256 differs from the manifest's (packed from other files?)")
        partial.replace(target)
        written.append((target, entry["sha256"]))
    return written


class ChunkReader:
    """The chunks read back as one stream, in blocks."""

    def __init__(self, paths: list[Path]):
        self.paths, self.file = list(paths), None

    def read(self, size: int):
        while size:
            if self.file is None:
                if not self.paths:
                    raise UserError("the chunks end before the manifest's files do")
                self.file = self.paths.pop(0).open("rb")
            block = self.file.read(min(BLOCK, size))
            if not block:
                self.file.close()
                self.file = None
                continue
            size -= len(block)
            yield block


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("pack", help="files (SRC:DEST) into chunks and a manifest")
    a.add_argument("pairs", nargs="+", metavar="SRC:DEST")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--chunk-mib", type=int, default=52, help="chunk size (a call carries at most 64 MiB in all)")
    b = sub.add_parser("unpack", help="check the chunks and write the manifest's files under --root")
    b.add_argument("--chunks", type=Path, required=True)
    b.add_argument("--root", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        if args.command == "pack":
            if args.chunk_mib < 1:
                raise UserError(f"--chunk-mib {args.chunk_mib} must be at least 1")
            manifest = pack(args.pairs, args.out, args.chunk_mib << 20)
            print(f"{len(manifest['files'])} files in {len(manifest['chunks'])} chunks in {args.out}")
        else:
            for path, sha in unpack(args.chunks, args.root):
                print(f"{sha}  {path}")  # sha256sum's format: the lease scripts keep it as sha256.txt
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
