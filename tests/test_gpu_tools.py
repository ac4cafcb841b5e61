"""The GPU benchmarks' tools that run without a GPU: gpu_rows.py's block-size sweep options and
gpu/compile_sm90.py's compile report (instruction, shared memory, registers, programs per SM)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sweep_grid_tries_wide_blocks_for_wide_weights_only():
    """BN 128 (x read from L2 4x less often by a many-row verify) for the gate/up and LM-head shapes; RMSNorm
    launches split K at most 4 ways; no split is left without a BK step (split-K of any count: 11 splits of 1536
    columns in 256-column pieces would leave 5 empty)."""
    from benchmarks.gpu_rows import sweep_grid
    from dfvg.gpu.gemv_stream import split_columns

    wide, narrow = sweep_grid(8960, 1536, norm=True), sweep_grid(1536, 1536, norm=False)
    assert {c["BN"] for c in wide} == {16, 32, 64, 128} and {c["BN"] for c in narrow} == {16, 32, 64}
    assert max(c["SPLIT_K"] for c in wide) <= 4
    assert all((c["SPLIT_K"] - 1) * split_columns(1536, c["SPLIT_K"], c["BK"]) < 1536 for c in wide + narrow)
    assert {c["SPLIT_K"] for c in sweep_grid(1536, 1536, False, {"SPLIT_K": (6, 11), "BK": (128,)})} == {6}


def test_sweep_space_replaces_only_the_lists_it_names():
    """`--sweep-space` (deeper pipelines for the gate/up and down launches): a named list replaces sweep_grid's,
    the others stay; the split and BK rules still hold; a bad word is refused in one line."""
    from benchmarks.gpu_rows import sweep_grid, sweep_space

    space = sweep_space("BK=64,512 num_stages=5,6")
    grid = sweep_grid(1536, 8960, norm=False, space=space)
    assert {c["BK"] for c in grid} == {64, 512} and {c["num_stages"] for c in grid} == {5, 6}
    assert {c["BN"] for c in grid} == {16, 32, 64} and {c["num_warps"] for c in grid} == {4, 8}
    assert all(8960 // c["SPLIT_K"] >= c["BK"] for c in grid)  # (every split has a BK step)
    assert max(c["SPLIT_K"] for c in sweep_grid(8960, 1536, norm=True, space=space)) <= 4
    assert sweep_space("num_stages=3,5 SPLIT_K=1,2") == {"num_stages": (3, 5), "SPLIT_K": (1, 2)}
    assert sweep_space("SPLIT_K=5,11") == {"SPLIT_K": (5, 11)}  # any count of pieces: 24 blocks x 11 = 2 per SM
    assert {c["SWAP_AB"] for c in grid} == {0}  # the MMA as shipped unless the space names SWAP_AB
    both = sweep_grid(1536, 8960, norm=False, space=sweep_space("SWAP_AB=0,1"))
    assert len(both) == 2 * len(sweep_grid(1536, 8960, norm=False)) and {c["SWAP_AB"] for c in both} == {0, 1}
    for bad, says in (("BK=", "whole numbers"), ("BK=x", "whole numbers"), ("stages=3", "KEY is one of"),
                      ("BK", "whole numbers"), ("BK=64 BK=128", "each once"), ("SPLIT_K=0", "from 1 to 64"),
                      ("BK=48", "powers of two"), ("BN=-16", "powers of two"), ("num_stages=0", ">= 1"),
                      ("BK=8", "powers of two from 16"), ("num_warps=64", "powers of two from 1 to 32"),
                      ("SWAP_AB=2", "0 or 1")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            sweep_space(bad)


@pytest.mark.parametrize("args, says", [
    (["--sweep-space", "BK=64"], "go with --sweep"),
    (["--sweep-shapes", "w13"], "go with --sweep"),
    (["--sweep", "--sweep-shapes", "w9"], "unknown launch(es) ['w9']"),
    (["--sweep", "--sweep-shapes", "w13", "--sweep-space", "SPLIT_K=8"], "leave w13 none to try"),
    (["--sweep", "--sweep-shapes", "wqkv", "--sweep-space", "BN=128"], "leave wqkv none to try"),
    (["--sweep", "--sweep-space", "SPLIT_K=0"], "whole numbers from 1"),
    (["--tuned", "no-such-tuned.json"], "not a sweep's tuned.json"),
])
def test_gpu_rows_refuses_a_sweep_it_cannot_run_in_one_line_before_any_gpu_time(args, says, capsys):
    """Checked before the GPU is asked for (this machine has none): one line on stderr, exit 2."""
    from benchmarks import gpu_rows

    with pytest.raises(SystemExit) as exited:
        gpu_rows.main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and says in err and err.count("\n") == 1, err


def test_sweep_rows_are_row_counts_a_launch_takes():
    from benchmarks.gpu_rows import row_counts

    assert row_counts("1,5,16,64") == (1, 5, 16, 64)
    for bad in ("", "1,x", "0", "65"):
        with pytest.raises(argparse.ArgumentTypeError, match="row counts 1..64"):
            row_counts(bad)


def test_a_modes_only_run_plots_the_first_mode_against_context(tmp_path):
    """gpu_rows.py --modes-only over several contexts writes gpu_rows.png from the first (shipped) mode's rows; over
    one context there is no curve to draw, and no file."""
    from benchmarks.gpu_rows import plot_first_mode

    rows = [{"mode": mode, "context": context, "T": t, "ms": 1.0 + context / 1e4 + t / 100}
            for mode in ("shipped", "other") for context in (512, 2048) for t in (1, 5, 16, 64)]
    plot_first_mode({"gpu": "NVIDIA H100 80GB HBM3", "launch_modes": rows}, tmp_path / "two.png")
    plot_first_mode({"gpu": "NVIDIA H200", "launch_modes": [r for r in rows if r["context"] == 512]},
                    tmp_path / "one.png")
    plot_first_mode({"gpu": "NVIDIA H200", "launch_modes": []}, tmp_path / "none.png")
    assert (tmp_path / "two.png").stat().st_size > 0
    assert not (tmp_path / "one.png").exists() and not (tmp_path / "none.png").exists()


def test_sm90_compile_report_names_each_launchs_instruction_and_shared_memory():
    """gpu/compile_sm90.py compiles without a GPU: 16-row tiles take mma.sync and every launch of the target
    reports its shared memory; a height that is not a power of two >= 16 is one line."""
    from dfvg.gpu.kernels import HAVE_TRITON

    if not HAVE_TRITON:
        pytest.skip("Triton is not installed")
    tool = ROOT / "gpu" / "compile_sm90.py"
    done = subprocess.run([sys.executable, str(tool), "16"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 5 and all("mma.sync" in line for line in lines)
    assert all(float(line.split("shared")[1].split()[0]) > 0 for line in lines)
    if all("regs   ?" not in line for line in lines):  # Triton ships cuobjdump: registers and programs per SM
        assert all(0 < int(line.split("regs")[1].split()[0]) <= 255 for line in lines)
        assert all(int(line.split("programs/SM")[1].split()[0]) >= 1 for line in lines)
        assert all(float(line.split("waves at T = 1")[1].split()[0]) > 0 for line in lines)
    bad = subprocess.run([sys.executable, str(tool), "12"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.strip() == "error: a row-tile height is a power of two >= 16, got 12"
    space = subprocess.run([sys.executable, str(tool), "--shape", "8960x1536", "--space",
                            "BN=32 BK=128 num_warps=4 num_stages=2,3"], capture_output=True, text=True, timeout=600)
    assert space.returncode == 0, space.stderr[-2000:]
    assert len(space.stdout.splitlines()) == 3 * 2  # split-K 1, 2, 4 (an RMSNorm launch) x 2 stage counts
    swapped = subprocess.run([sys.executable, str(tool), "--shape", "8960x1536", "--space",
                              "BN=64 BK=128 SPLIT_K=1 num_warps=8 num_stages=3 SWAP_AB=0,1"],
                             capture_output=True, text=True, timeout=600)
    assert swapped.returncode == 0, swapped.stderr[-2000:]
    # weights as the MMA's M side (SWAP_AB) is a wgmma from shared memory; the 16-row tile as M is an mma.sync
    assert ["wgmma" in line for line in swapped.stdout.splitlines()] == [False, True], swapped.stdout
    h100 = subprocess.run([sys.executable, str(tool), "--gpu", "H100", "16"], capture_output=True, text=True,
                          timeout=600)
    assert h100.returncode == 0, h100.stderr[-2000:]
    # the Hopper table (H100 and H200) swaps every launch, the LM head too (since 2026-12-07)
    assert ["wgmma" in line for line in h100.stdout.splitlines()] == [True] * 5, h100.stdout
    for args, says in ((["--shape", "10x10"], "--shape is one of"), (["--space", "BK=x"], "--space"),
                       (["--space", "SPLIT_K=8"], "the block sizes asked for leave w13 none to try"),
                       (["--shape"], "--shape needs a value, e.g. --shape 8960x1536"),
                       (["--gpu", "A100"], "--gpu is one of H100")):
        bad = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and bad.stderr.startswith(f"error: {says}"), bad.stderr


def test_sm90_compile_report_lists_the_attention_split_at_each_width():
    """--attention: one line per split width (64, 128, 256 cache slots), each with its shared memory; with the
    registers, programs per SM that shrink as a split's tile grows (more shared memory a program); then the merge
    launch by columns and with a head merged at once (`MERGE_HEAD_AT_ONCE`), each compiled for sm_90."""
    from dfvg.gpu.kernels import HAVE_TRITON

    if not HAVE_TRITON:
        pytest.skip("Triton is not installed")
    done = subprocess.run([sys.executable, str(ROOT / "gpu" / "compile_sm90.py"), "--attention"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines, merges = done.stdout.splitlines()[:3], done.stdout.splitlines()[3:]
    assert [int(line.split("split")[1].split()[0]) for line in lines] == [64, 128, 256], lines
    assert [line.split()[2] for line in merges] == ["by", "head"], merges  # the merge compiles both ways
    shared = [float(line.split("shared")[1].split()[0]) for line in lines]
    assert shared == sorted(shared) and shared[0] > 0
    if all("regs   ?" not in line for line in lines):
        per_sm = [int(line.split("programs/SM")[1].split()[0]) for line in lines]
        assert per_sm == sorted(per_sm, reverse=True) and per_sm[-1] >= 1, lines


def compile_tool(needs_triton: bool = False):
    """gpu/compile_sm90.py as a module (the tests that compile skip without Triton)."""
    from dfvg.gpu.kernels import HAVE_TRITON

    if needs_triton and not HAVE_TRITON:
        pytest.skip("Triton is not installed")
    sys.path.insert(0, str(ROOT / "gpu"))
    try:
        import compile_sm90
    finally:
        sys.path.pop(0)
    return compile_sm90


def test_programs_per_sm_follow_registers_and_shared_memory():
    """gpu/compile_sm90.py's occupancy: the gate/up launch's 250 registers x 4 warps leave room for 2 programs (as
    Nsight Compute counted on an H100); 158 registers for 3; shared memory and the warp limit bound it too."""
    compile_sm90 = compile_tool()
    assert compile_sm90.programs_per_sm(250, 4, 89 * 1024) == 2
    assert compile_sm90.programs_per_sm(158, 4, 44 * 1024) == 3
    assert compile_sm90.programs_per_sm(32, 4, 120 * 1024) == 1  # shared memory binds
    assert compile_sm90.programs_per_sm(16, 32, 0) == 2  # 64 warps an SM
    assert compile_sm90.programs_per_sm(255, 4, 281 * 1024) == 0  # BN 128 x BK 256 gate/up: does not fit
    # programs of a one-row launch (weight blocks x K splits): gate/up's 8960 / 32 blocks; QKV's 16 heads x 2 pieces x 4
    assert compile_sm90.one_row_programs((8960, 1536), {"BN": 32, "SPLIT_K": 1}) == 280
    assert compile_sm90.one_row_programs((2048, 1536), {"BN": 32, "SPLIT_K": 4}) == 128


def test_a_block_size_triton_cannot_build_is_one_line_of_the_report(monkeypatch):
    """--space over block sizes: a config that does not compile is a line of the report (as gpu_rows.py's sweep
    counts it), not a traceback that ends the listing."""
    compile_sm90 = compile_tool()

    def fails(*_args):
        raise RuntimeError("out of resource: shared memory, Required: 287744\nHardware limit: 232448")

    monkeypatch.setattr(compile_sm90, "describe", fails)
    line = compile_sm90.describe_or_why_not(16, (8960, 1536), False, {"BN": 128})
    assert line.endswith("does not compile: out of resource: shared memory, Required: 287744") and "\n" not in line


def test_the_floor_is_taken_at_the_copy_rate_of_the_gpu_that_ran():
    """An H100 run's fraction of the weight-stream floor is against the H100's 3.0 TB/s copy rate, not the
    H200's 4.3 (which made an H100 step look like 38 % of a floor it cannot reach)."""
    from benchmarks.gpu_report import copy_tb_s

    assert copy_tb_s("NVIDIA H100 80GB HBM3") == 3.0 and copy_tb_s("NVIDIA H200") == 4.3
    assert copy_tb_s("NVIDIA A100-SXM4-80GB") == 4.3  # not measured here: the H200's, as before


@pytest.mark.parametrize("text, says", [("nope.json", "No such file"), ('{"a": 1}', "not [N, K, config] rows"),
                                        ("[[1, 2]]", "not [N, K, config] rows"), ("{", "Expecting"),
                                        ("[]", "not [N, K, config] rows"),
                                        ('[[8960, 1536, {"BK": 128}]]', "with BN, BK, SPLIT_K")])
def test_norm_cost_refuses_a_tuned_file_that_is_not_a_sweeps_in_one_line(text, says, tmp_path, capsys):
    """benchmarks/norm_cost.py --tuned: a missing or malformed table is one line before any GPU time."""
    from benchmarks import norm_cost

    path = tmp_path / "tuned.json"
    if text != "nope.json":
        path.write_text(text)
    with pytest.raises(SystemExit) as exited:
        norm_cost.main(["--tuned", str(path if text != "nope.json" else tmp_path / text)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_gpu_rows_takes_several_tuned_tables_each_beside_the_shipped_one(tmp_path):
    """gpu_rows.py --tuned a.json,b.json: each file is a table of its own ("given <stem>"), the shipped rows with the
    file's over them; one file stays "given"; a --sweep from several, or two files of one name, is refused in one
    line before any GPU time."""
    from benchmarks import gpu_rows
    from dfvg.errors import UserError

    down = [[1536, 8960, {"BN": 64, "BK": 64, "SPLIT_K": 7, "num_warps": 4, "num_stages": 6, "SWAP_AB": 1}]]
    head = [[151936, 1536, {"BN": 64, "BK": 128, "SPLIT_K": 1, "num_warps": 8, "num_stages": 4, "SWAP_AB": 1}]]
    (tmp_path / "down7.json").write_text(json.dumps(down))
    (tmp_path / "head.json").write_text(json.dumps(head))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "head.json").write_text(json.dumps(down))
    paths = f"{tmp_path / 'down7.json'},{tmp_path / 'head.json'}"
    assert gpu_rows.given_tables(paths, False) == {"given down7": down, "given head": head}
    assert gpu_rows.given_tables(str(tmp_path / "head.json"), True) == {"given": head}
    shipped = [[1536, 8960, {"BN": 64}], [2048, 1536, {"BN": 32}]]
    assert gpu_rows.rows_over(shipped, down) == [down[0], shipped[1]]
    assert gpu_rows.rows_over(shipped, head) == [*shipped, head[0]]
    with pytest.raises(UserError, match="one --tuned file"):
        gpu_rows.given_tables(paths, True)
    with pytest.raises(UserError, match="two files of one name"):
        gpu_rows.given_tables(f"{tmp_path / 'head.json'},{tmp_path / 'other' / 'head.json'}", False)


@pytest.fixture
def unfactored(monkeypatch):
    """`fused.FACTORED_NORM` and `fused.FACTORED_QKV_NORM` off: gate/up normalizes its own x (or the O launch
    normalizes it over 16 rows) and so does QKV, the paths the PTX and layout tests below read."""
    from dfvg.gpu import fused

    monkeypatch.setattr(fused, "FACTORED_NORM", False)
    monkeypatch.setattr(fused, "FACTORED_QKV_NORM", False)


def test_rms_loads_first_issues_every_x_load_before_the_first_barrier(unfactored):
    """`fused.RMS_LOADS_FIRST`, compiled for sm_90 (the H100/H200 table, gate/up with its own RMSNorm over K = 1536):
    the 1/RMS pass's x loads are all issued before its first cross-warp barrier (three 512-column steps: three times
    the loads the order in turn issues there, one step's); the O launch's normalizing tail reads the rows in two
    rounds of loads issued together, g's three steps with the second (in turn: a round trip per step, twice, and
    one per g step); and it still sums a row's squares as gate/up does
    (`test_the_o_launch_sums_a_rows_squares_as_gate_up_does`)."""
    from dfvg.gpu import block_sizes, fused

    compile_sm90 = compile_tool(needs_triton=True)
    gate_up, o_shape = (8960, 1536), (1536, 1536)

    def compiled(shape: tuple[int, int], over: bool, first: bool):
        shipped, fused.RMS_LOADS_FIRST = fused.RMS_LOADS_FIRST, first
        try:
            return compile_sm90.compiled_launch(16, shape, cfg=block_sizes.HOPPER[shape], over_one_tile=over).asm
        finally:
            fused.RMS_LOADS_FIRST = shipped

    def loads_before_barrier(ptx: str) -> int:
        return ptx[:ptx.index("bar.sync")].count("ld.global")

    def tail_loads(ptx: str) -> list[tuple[int, int]]:
        """The O launch's normalizing tail (after its row counter's atomic add): per stretch between barriers that
        loads, its loads of the rows (past L1) and of g."""
        tail = ptx[ptx.index("atom.global.gpu.acq_rel.add", ptx.index("atom.global.gpu.acq_rel.add") + 1):]
        return [(piece.count("ld.global.cg"), piece.count("ld.global") - piece.count("ld.global.cg"))
                for piece in tail.split("bar.sync") if "ld.global" in piece]

    for shape in ((2048, 1536), gate_up):  # QKV + RoPE and gate/up (last: its layouts below), each with its RMSNorm
        together, one_by_one = compiled(shape, False, True), compiled(shape, False, False)
        assert loads_before_barrier(together["ptx"]) == 3 * loads_before_barrier(one_by_one["ptx"]) > 0, shape
    o_together, o_one_by_one = compiled(o_shape, True, True), compiled(o_shape, True, False)
    in_turn = tail_loads(o_one_by_one["ptx"])
    assert in_turn[0][0] > 0 and tail_loads(o_together["ptx"]) == [(3 * in_turn[0][0], 0), (3 * in_turn[0][0], 3)]
    by_o = row_sum_layouts(o_together["ttgir"])
    assert len(by_o) == 1 and by_o == row_sum_layouts(together["ttgir"]) == row_sum_layouts(one_by_one["ttgir"])
    assert by_o == row_sum_layouts(o_one_by_one["ttgir"]), by_o


def row_sum_layouts(ttgir: str) -> set[tuple[str, ...]]:
    """How each row sum of a compiled launch (`tt.reduce` over axis 1 of a 2-D float32 tile) splits a row: the
    columns' elements per thread, lanes and warps, and the order, from its TTGIR's blocked layouts."""
    import re

    blocked = dict(re.findall(r"^(#blocked\d*) = #ttg\.blocked<\{(.*)\}>$", ttgir, re.M))
    found = set()
    for name in re.findall(r"\}\) : \(tensor<\d+x\d+xf32, (#blocked\d*)>\) -> tensor<\d+xf32, #ttg\.slice<\{dim = 1",
                           ttgir):
        fields = dict(re.findall(r"(\w+) = \[([\d, ]+)\]", blocked[name]))
        found.add(tuple(fields[key].split(", ")[1] for key in ("sizePerThread", "threadsPerWarp", "warpsPerCTA"))
                  + (fields["order"],))
    return found


@pytest.mark.parametrize("table", ["TUNED", "HOPPER"])
@pytest.mark.parametrize("height", [16, 32, 64])
def test_the_o_launch_sums_a_rows_squares_as_gate_up_does(table, height, unfactored):
    """fused.NORM_IN_PRODUCER_ABOVE: a launch over 16 rows takes gate/up's input normalized by the O launch, lossless
    only if both sum a row's squares (1/RMS, tl.sum) in the same order. That order follows the layout Triton picks
    from each launch's warps (O 4, gate/up 8 on Hopper). Compiled for sm_90 with each table, the O launch's
    normalization and gate/up's own norm split a row's columns alike; with 1 warp in the O launch they do not
    (`fused._norms_alike` then keeps gate/up's own norm), so this test can fail."""
    from dfvg.gpu import block_sizes

    compile_sm90 = compile_tool(needs_triton=True)
    rows = getattr(block_sizes, table)
    o_shape, gate_up = (1536, 1536), (8960, 1536)

    def layouts(shape: tuple[int, int], over: bool, cfg: dict) -> set:
        return row_sum_layouts(compile_sm90.compiled_launch(height, shape, cfg=cfg, over_one_tile=over).asm["ttgir"])

    by_o, by_gate_up = layouts(o_shape, True, rows[o_shape]), layouts(gate_up, False, rows[gate_up])
    assert len(by_o) == 1 and by_o == by_gate_up, (by_o, by_gate_up)
    if height == 16:
        one_warp = layouts(o_shape, True, {**rows[o_shape], "num_warps": 1})
        assert len(one_warp) == 1 and one_warp != by_gate_up, one_warp


def test_the_factored_norm_leaves_no_serial_tail_and_no_per_step_scaling():
    """`fused.FACTORED_NORM`, compiled for sm_90 with the H100/H200 table: the O launch takes one atomic (split-K's
    counter), not a row tile's counter as well (the normalizing tail, which waits for the row's other blocks, is
    gone), and gate/up has the barriers of a launch without RMSNorm (no 1/RMS pass, no scaling of x between two
    barriers in every K step); with the switch off, gate/up with its own norm has more, and the O launch over 16
    rows counts its row tile's blocks."""
    from dfvg.gpu import block_sizes, fused

    compile_sm90 = compile_tool(needs_triton=True)
    o_shape, gate_up = (1536, 1536), (8960, 1536)

    def ptx(shape: tuple[int, int], factored: bool, over: bool) -> str:
        shipped, fused.FACTORED_NORM = fused.FACTORED_NORM, factored
        try:
            return compile_sm90.compiled_launch(16, shape, over_one_tile=over, table=block_sizes.HOPPER).asm["ptx"]
        finally:
            fused.FACTORED_NORM = shipped

    def atomics(text: str) -> int:
        return text.count("atom.global.gpu.acq_rel.add")

    plain_gate_up = ptx(gate_up, False, True).count("bar.sync")  # gate/up on the O launch's normalized rows
    assert atomics(ptx(o_shape, True, False)) == 1 < atomics(ptx(o_shape, False, True)) == 2
    assert ptx(gate_up, True, False).count("bar.sync") == plain_gate_up < ptx(gate_up, False, False).count("bar.sync")
