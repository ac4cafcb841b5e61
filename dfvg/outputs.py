"""Output places: checked before any work, written whole or not at all, swept after a killed run.

Root can write almost anywhere, so permission bits say little; what fails in practice is a path through
a regular file, a read-only or virtual file system (/proc), or a full disk. `check_writable` therefore
tries a throw-away directory in the nearest existing ancestor of the path and removes it again. Entry
points call it first, so a long run never ends in a traceback at its last step.

Files and report folders are written under a hidden temporary name `.<name>.tmp-<pid>` and renamed into
place (`atomic_write`, `dfvg.reports.write_run_reports`): a reader sees the old state or the new one, never
half of one, even after `kill -9`. What such a kill leaves is only that hidden temporary, which
`remove_stale_temps` deletes on the next run once its process is gone.
"""

from __future__ import annotations

import os
import re
import shutil
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


TEMP_NAME = re.compile(r"^\..+\.tmp-(\d+)$")  # .<name>.tmp-<pid>


def temp_path(path: Path) -> Path:
    """The hidden temporary that `path` is written under before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write a file through a temporary and a rename: a crash or kill leaves the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def remove_stale_temps(directory: str | Path) -> list[Path]:
    """Delete the temporaries a killed process left in `directory` (those of live processes stay)."""
    directory, removed = Path(directory), []
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        match = TEMP_NAME.match(entry.name)
        if match and not process_alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
