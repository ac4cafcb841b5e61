"""Checking, before any work, that a place the user named for output can take it.

Root can write almost anywhere, so permission bits say little; what fails in practice is a path through
a regular file, a read-only or virtual file system (/proc), or a full disk. `check_writable` therefore
tries a throw-away directory in the nearest existing ancestor of the path and removes it again. Entry
points call it first, so a long run never ends in a traceback at its last step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dfvg.errors import UserError


def check_writable(directory: str | Path, flag: str) -> None:
    """Refuse, in one line naming `flag`, a directory that cannot be created or written; creates nothing."""
    directory = Path(directory).expanduser().absolute()
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    fix = f"pass a writable directory as {flag}"
    if not existing.is_dir():
        raise UserError(f"{directory} cannot be a directory: {existing} is a file; {fix}")
    try:
        tempfile.TemporaryDirectory(dir=existing, prefix=".dfvg-write-check-").cleanup()
    except OSError as err:
        raise UserError(f"{directory} is not writable ({err.strerror} in {existing}); {fix}") from None


def check_output_file(path: str | Path, flag: str) -> None:
    """Refuse an output file path that is a directory or whose folder cannot be written."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory; give a file name, e.g. {path / 'out.jsonl'}")
    check_writable(path.parent, flag)
