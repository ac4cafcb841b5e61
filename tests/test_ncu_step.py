"""benchmarks/ncu_step.py's CPU parts: ncu's raw CSV page read into the per-kernel table, the ncu command it
runs itself under, and the one-line refusals (no ncu here, bad --rows)."""

from __future__ import annotations

import pytest

from benchmarks import ncu_step

RAW = '''==PROF== Connected to process 4242 (python3)
==PROF== Profiling "_linear_kernel": 0%....50%....100% - 38 passes
"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum",\
"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed","launch__waves_per_multiprocessor",\
"launch__shared_mem_per_block_dynamic","launch__shared_mem_per_block_static",\
"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"
"","","","nsecond","byte","byte","%","","byte","byte","ratio","ratio","ratio"
"0","4242","_linear_kernel","20,000","55,050,240","0","56.1","1.06","91,136","0","7.5","0.4","1"
"1","4242","_attention_split","4,000","1,000,000","200,000","8.0","0.5","0","1,024","n/a","2.5","9"
==PROF== Disconnected from process 4242
'''


def test_the_raw_page_becomes_one_row_per_kernel_with_rates_against_the_copy_rate():
    kernels = ncu_step.parse_raw_csv(RAW)
    assert [k["Kernel Name"] for k in kernels] == ["_linear_kernel", "_attention_split"]  # units row dropped
    assert kernels[0]["dram__bytes_read.sum"] == 55_050_240.0  # thousands separators read as numbers
    linear, attention = ncu_step.launch_table(kernels, copy_tb_s=4.3, rows=16)
    assert linear["dram_tb_s"] == pytest.approx(55_050_240 / 20e-6 / 1e12)  # 2.75 TB/s
    assert linear["fraction_of_copy_rate"] == pytest.approx(linear["dram_tb_s"] / 4.3)
    assert linear["top_stall"] == "long_scoreboard" and attention["top_stall"] == "barrier"  # "n/a" is no number
    assert attention["dram_tb_s"] == pytest.approx(1_200_000 / 4e-6 / 1e12)  # reads and writes
    assert linear["waves_per_sm"] == 1.06 and attention["grid_size"] is None  # a metric ncu did not give: None
    assert linear["rows"] == attention["rows"] == 16
    ncu_step.print_table([linear, attention])
    [uncounted] = ncu_step.launch_table([{"Kernel Name": "k", "gpu__time_duration.sum": 1000.0}], 4.3, rows=1)
    assert uncounted["dram_tb_s"] is None and uncounted["fraction_of_copy_rate"] is None  # no bytes: no rate, not 0
    ncu_step.print_table([uncounted])


def test_output_without_a_header_is_no_kernel_and_ncus_own_line_says_why():
    log = "==PROF== Connected to process 1\n==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n"
    assert ncu_step.parse_raw_csv(log) == []
    assert ncu_step.ncu_message(log, "a torch warning\n") == log.splitlines()[-1]  # ncu's error, not the program's
    assert ncu_step.ncu_message("==PROF== Disconnected\n", "Traceback...\nRuntimeError: no GPU\n") == \
        "RuntimeError: no GPU"  # the program's own failure under ncu
    assert ncu_step.ncu_message("==PROF== Disconnected\n", "") == "==PROF== Disconnected"
    nothing = "==PROF== Disconnected\n==WARNING== No kernels were profiled.\n"  # --kernel-name matched nothing
    assert ncu_step.ncu_message(nothing, "a triton warning\n") == "==WARNING== No kernels were profiled."


def test_the_ncu_command_profiles_graph_nodes_of_the_bracketed_replay(tmp_path):
    command = ncu_step.ncu_command(16, 24, tmp_path / "log.csv")
    text = " ".join(command)
    for flag in ("--clock-control none", "--graph-profiling node", "--profile-from-start off", "--page raw",
                 "--print-units base", "--launch-count 24", "--section WarpStateStats", "--target --rows 16",
                 "--metrics dram__bytes_read.sum,dram__bytes_write.sum"):
        assert flag in text
    assert "--launch-count" not in ncu_step.ncu_command(1, 0, tmp_path / "log.csv")  # 0: every kernel
    assert ncu_step.ncu_command(1, 12, tmp_path / "log.csv", context=32704)[-2:] == ["--context", "32704"]


def test_refusals_are_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(ncu_step.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit) as stop:
        ncu_step.main(["--out", str(tmp_path)])
    assert "needs Nsight Compute's ncu" in str(stop.value) and "\n" not in str(stop.value)
    with pytest.raises(SystemExit):
        ncu_step.main(["--rows", "1,65"])
    err = capsys.readouterr().err
    assert "row counts 1..64" in err and "\n" not in err.strip()
    for bad in (["--context", "32705"], ["--context", "2048", "--launch", "w13"]):
        with pytest.raises(SystemExit):
            ncu_step.main(bad)
        err = capsys.readouterr().err
        assert "--context must be in 1..32704" in err and "\n" not in err.strip()


def test_one_launch_is_profiled_alone_with_its_source_and_a_report(tmp_path):
    """--launch: the GEMV kernels only, SourceCounters with the source imported, a report beside the CSV, and the
    target part told which launch and block sizes; the clocks are left alone as for the step."""
    log = tmp_path / "ncu_launch_w13_T1.csv"
    command = ncu_step.ncu_command(1, 24, log, "w13", '{"BK": 128}')
    text = " ".join(command)
    for flag in ("--clock-control none", "--section SourceCounters", "--import-source yes",
                 "--kernel-name regex:_linear_kernel|_qkv_rope_kernel", f"--export {tmp_path / 'ncu_launch_w13_T1'}",
                 "--profile-from-start off", "--target --rows 1 --launch w13"):
        assert flag in text
    assert command[-2:] == ["--config", '{"BK": 128}'] and "--launch-count" not in text
    assert "--force-overwrite" in command  # a rerun into the same folder replaces its report


def test_a_launch_config_is_a_json_object_of_block_sizes(capsys):
    import argparse

    assert ncu_step.block_config('{"BK": 128, "num_stages": 3}') == {"BK": 128, "num_stages": 3}
    for bad, says in (("BK=128", "JSON object of BN"), ("[128]", "JSON object"), ("{}", "JSON object"),
                      ('{"bk": 128}', "JSON object"), ('{"BK": 0}', "BK values are powers of two from 16"),
                      ('{"BK": "128"}', "powers of two"), ('{"BK": true}', "powers of two"),
                      ('{"BK": 48}', "powers of two"), ('{"num_warps": 64}', "powers of two from 1 to 32"),
                      ('{"num_stages": 0}', "whole numbers >= 1")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            ncu_step.block_config(bad)
    # runs of one launch with other block sizes keep their own files
    assert ncu_step.config_tag({"num_stages": 3, "BK": 128}) == "_BK128_num_stages3" and ncu_step.config_tag(None) == ""
    with pytest.raises(SystemExit):
        ncu_step.main(["--config", '{"BK": 128}'])
    err = capsys.readouterr().err
    assert "--config goes with --launch" in err and "\n" not in err.strip()
