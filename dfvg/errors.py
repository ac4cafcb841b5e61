"""How a user's mistake reaches the user: one line on stderr, never a traceback.

A `UserError` carries a single line that says what is wrong and how to fix it. The CLI and the scripts
print it without a traceback and exit with status 2; everything else is a bug and keeps its traceback.
`OneLineParser` gives argparse's own refusals (an unknown choice, a non-integer count) the same one line
and status 2, and `report_interrupt` turns Ctrl-C into one line and status 130 (128 + SIGINT).
"""

from __future__ import annotations

import argparse
import sys

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention for a command stopped by Ctrl-C


class UserError(Exception):
    """A bad input (missing file, wrong shape, unknown model type, bad config value)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (like every other DFVG user error), exit 2.
    Sub-command parsers made with `add_subparsers` inherit the class."""

    def error(self, message: str):
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def report_interrupt(resumable: bool = False) -> int:
    """The one line for Ctrl-C; returns the exit status. Reports are written whole or not at all, so an
    interrupted run has written none; a resumable run kept its completed repetitions (dfvg.host.resume)."""
    line = "no results written; rerun the same command to resume" if resumable else "nothing was written"
    print(f"interrupted: {line}", file=sys.stderr)
    return EXIT_INTERRUPTED
