"""The verdict on one cocotb results.xml, apart from run_sim.py so a unit test can load it without a simulator.

A kernel passes only when its results.xml names at least one testcase that ran and none failed: an empty
file (a test module that collected nothing) or a missing/unparsable one (a simulator that died first) is a
failure, not a quiet pass.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path


def check_results(path: str | Path) -> tuple[bool, str]:
    """(passed, one-line reason) for the cocotb JUnit results file at `path`."""
    try:
        root = ET.parse(path).getroot()
    except OSError as err:
        return False, f"no readable results.xml at {path} ({err.strerror or err}): the tests did not run"
    except ET.ParseError as err:
        return False, f"unparsable results.xml at {path} ({err})"
    ran = [tc for tc in root.iter("testcase") if tc.find("skipped") is None]
    if not ran:
        return False, f"zero testcases ran in {path}"
    failed = [tc.get("name", "?") for tc in ran if tc.find("failure") is not None or tc.find("error") is not None]
    if failed:
        return False, f"{len(failed)} of {len(ran)} testcases failed: {', '.join(failed)}"
    return True, f"{len(ran)} testcases passed"
