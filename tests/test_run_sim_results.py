"""fpga/tests/run_sim.py's verdict on a cocotb results.xml: zero testcases, a missing or unparsable file, or a
failure is FAIL; only testcases that ran and passed are PASS. Loaded by path, never via sys.path: a repository
folder on sys.path can shadow installed packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SIM_RESULTS = Path(__file__).resolve().parents[1] / "fpga" / "tests" / "sim_results.py"


def load_check_results():
    spec = importlib.util.spec_from_file_location("dfvg_fpga_sim_results", SIM_RESULTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.check_results


def suite(*cases: str) -> str:
    return f'<testsuites><testsuite name="all" tests="{len(cases)}">{"".join(cases)}</testsuite></testsuites>'


PASS = '<testcase name="{}" classname="test_k" time="0.1"/>'
FAIL = '<testcase name="{}" classname="test_k"><failure message="mismatch"/></testcase>'
ERROR = '<testcase name="{}" classname="test_k"><error message="crash"/></testcase>'
SKIP = '<testcase name="{}" classname="test_k"><skipped/></testcase>'


@pytest.mark.parametrize("xml, passed, reason", [
    (suite(), False, "zero testcases ran"),
    (suite(SKIP.format("t0")), False, "zero testcases ran"),
    (suite(PASS.format("t0"), FAIL.format("t1")), False, "1 of 2 testcases failed: t1"),
    (suite(ERROR.format("t0")), False, "1 of 1 testcases failed: t0"),
    (suite(PASS.format("t0"), PASS.format("t1"), SKIP.format("t2")), True, "2 testcases passed"),
    ("<testsuites><testsuite", False, "unparsable results.xml"),
])
def test_verdicts(tmp_path, xml, passed, reason):
    path = tmp_path / "results.xml"
    path.write_text(xml)
    ok, why = load_check_results()(path)
    assert ok is passed and reason in why and "\n" not in why


def test_missing_results_file_is_a_failure(tmp_path):
    ok, why = load_check_results()(tmp_path / "results.xml")
    assert not ok and "did not run" in why and "\n" not in why


def test_run_sim_uses_this_check():
    """run_sim.py must decide with check_results, not a private copy of the old any-failure rule."""
    source = (SIM_RESULTS.parent / "run_sim.py").read_text()
    assert "from sim_results import check_results" in source and "return check_results(results)" in source
