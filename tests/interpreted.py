"""Run test helpers under Triton's CPU interpreter, in a subprocess: TRITON_INTERPRET must be set before Triton is
imported, and the test process has imported it already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(module: str, expression: str, timeout: int = 900) -> str:
    """stdout of `print(<expression>)`, with `module` imported as t, under the interpreter (skips the test where
    this numpy is too new for the interpreter; a failure there fails the test with its stderr's tail)."""
    code = f"import {module} as t\nprint({expression})\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode and "only 0-dimensional arrays" in done.stderr:
        pytest.skip("this numpy is too new for Triton's interpreter")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
