"""benchmarks/gpu_report.py on synthetic phase files: ratios, match rates, acceptance and the goals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_report import report


def run(tok_s: float, tokens: list[list[int]], stats=None) -> dict:
    return {"walls_s": [1.0] * len(tokens), "tokens": tokens, "stats": stats or [None] * len(tokens),
            "new_tokens": sum(map(len, tokens)), "tokens_per_s": tok_s, "median_ms_per_token": 1000 / tok_s}


def stat(drafted: int, accepted: int, steps: int, decode_s: float) -> dict:
    return {"num_draft_tokens": drafted, "num_accepted_tokens": accepted, "num_verify_steps": steps,
            "decode_s": decode_s, "num_new_tokens": 4, "draft_s": 0.0, "modeled_draft_s": None}


def test_report_ratios_and_goals(tmp_path):
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    plain = run(400.0, ref, [stat(0, 0, 4, 0.004), stat(0, 0, 4, 0.004)])
    spec = run(600.0, [[1, 2, 9, 9], [5, 6, 7, 8]], [stat(6, 3, 2, 0.002), stat(6, 3, 2, 0.002)])
    (tmp_path / "dfvg.json").write_text(json.dumps({"dfvg_plain": plain, "dfvg_spec_k3": spec,
                                                    "weight_bytes": {"target": 3_000_000_000, "draft": 1}}))
    (tmp_path / "hf.json").write_text(json.dumps({"hf_eager": run(20.0, ref), "hf_assist_k3": run(30.0, ref)}))
    merged = report(tmp_path)
    rows = {r["variant"]: r for r in merged["rows"]}
    assert rows["dfvg_spec_k3"]["x_dfvg_plain"] == pytest.approx(1.5)
    assert rows["dfvg_spec_k3"]["match_vs_hf"] == pytest.approx((0.5 + 1.0) / 2)
    assert rows["dfvg_spec_k3"]["acceptance_rate"] == pytest.approx(0.5)
    assert rows["dfvg_spec_k3"]["mean_accepted_length"] == pytest.approx((6 + 4) / 4)
    goals = merged["goals"]
    assert goals["plain_decode_ms_per_token"] == pytest.approx(1.0)
    assert goals["fraction_of_floor"] == pytest.approx(3e9 / 4.3e12 * 1e3)
    assert goals["spec_over_hf_assist_best"] == pytest.approx(20.0) and goals["goal_spec_1.5x_hf_assist_met"]
    assert goals["goal_plain_25x_hf_met"] is False  # 400 / 20 = 20x
    assert (tmp_path / "gpu_speed.json").is_file()
    assert goals["copy_rate_TB_s"] == 4.3  # no GPU named: the H200's rate
    # a run on an H100 (gpu_speed.py writes the GPU's name under "env") is held to the H100's copy rate
    (tmp_path / "dfvg.json").write_text(json.dumps({"dfvg_plain": plain, "env": {"gpu": "NVIDIA H100 80GB HBM3"},
                                                    "weight_bytes": {"target": 3_000_000_000, "draft": 1}}))
    on_h100 = report(tmp_path)
    h100 = on_h100["goals"]
    assert h100["copy_rate_TB_s"] == 3.0 and h100["fraction_of_floor"] == pytest.approx(3e9 / 3.0e12 * 1e3)
    # the report's own floor (issue 16's fraction_of_floor field) is the goals' floor: one floor in a report
    assert on_h100["fraction_of_floor"] == h100["fraction_of_floor"] and on_h100["floor"]["copy_rate_TB_s"] == 3.0


def test_a_peer_quoted_on_held_out_prompts_is_compared_on_those_prompts(tmp_path):
    """HF assisted with its k chosen on validation prompts is quoted on the rest (`prompt_indices`): its match
    rate and every ratio against it use those prompts of the other rows, not all of them."""
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    plain = {**run(400.0, ref), "walls_s": [1.0, 1.0, 4.0]}
    assist = {**run(5.0, [[5, 6, 0, 0], [9, 9, 9, 9]]), "walls_s": [1.0, 1.0], "prompt_indices": [1, 2]}
    (tmp_path / "dfvg.json").write_text(json.dumps({"dfvg_plain": plain}))
    (tmp_path / "hf.json").write_text(json.dumps({"hf_eager": run(20.0, ref), "hf_assist_k4": assist,
                                                  "hf_assist_validation": {"prompt_indices": [0], "chosen_k": 4}}))
    rows = {r["variant"]: r for r in report(tmp_path)["rows"]}
    assert set(rows) == {"dfvg_plain", "hf_eager", "hf_assist_k4"}  # the choice is metadata, not a run
    assert rows["hf_assist_k4"]["match_vs_hf"] == pytest.approx((0.5 + 1.0) / 2)
    assert rows["dfvg_plain"]["x_hf_assist_best"] == pytest.approx((8 / 5.0) / 5.0)  # 8 tokens in 5 s


def test_hf_assist_refuses_a_validation_that_leaves_no_held_out_prompt():
    from argparse import Namespace

    from benchmarks.gpu_phases import phase_hf_assist

    args = Namespace(ks=[2, 4], hf_validation=3, max_new_tokens=8, device="cpu")
    with pytest.raises(SystemExit, match="--hf-validation 3 must be >= 1 and leave held-out prompts"):
        phase_hf_assist(args, {"prompts": [{"ids": [1]}] * 3})
    from benchmarks.gpu_speed import main

    with pytest.raises(SystemExit, match=r"--hf-validation 4 must be >= 1 and leave held-out prompts \(4 prompts\)"):
        main(["--tiny", "--device", "cpu", "--phases", "hf_assist", "--prompts", "4", "--ks", "2,3",
              "--hf-validation", "4", "--results", "unused"])  # refused before any model loads


def test_hf_assist_runners_of_several_k_each_draft_their_own_k():
    """hf_assist makes a runner per k before timing any: the assistant's generation config, which they share,
    must hold the k of the runner that is generating, not of the one made last."""
    from types import SimpleNamespace

    import torch

    from benchmarks.gpu_phases import hf_generate

    seen = []

    def generate(x, attention_mask, generation_config, assistant_model):
        seen.append((generation_config.num_assistant_tokens, assistant_model.generation_config.num_assistant_tokens))
        return torch.zeros(1, x.shape[1] + 2, dtype=torch.long)

    model = SimpleNamespace(generation_config=SimpleNamespace(), generate=generate)
    assistant = SimpleNamespace(generation_config=SimpleNamespace())
    runners = {k: hf_generate(model, assistant, k, 2, "cpu") for k in (2, 8)}
    runners[2]([1, 2, 3])
    runners[8]([1, 2, 3])
    runners[2]([1, 2, 3])
    assert seen == [(2, 2), (8, 8), (2, 2)]


def random_feature_head(directory: Path, target_hidden: int, vocab: int) -> Path:
    """A random feature head folder for a target `target_hidden` wide over `vocab` ids."""
    from dfvg.checkpoint import load_model
    from dfvg.feature_head import FeatureHead, save_head_parts
    from tests.conftest import save_checkpoint

    save_checkpoint(directory, "qwen2", seed=4, vocab_size=vocab, hidden_size=64, num_hidden_layers=1,
                    intermediate_size=96)
    save_head_parts(FeatureHead(load_model(directory, feature_head_body=True), target_hidden), directory)
    return directory


def test_tiny_benchmark_applies_the_sweeps_block_sizes_and_runs_every_kernel_choice(tmp_path):
    """gpu_speed.py end to end on the tiny CPU pair: --tuned lands in block_sizes.TUNED and in every phase file;
    the dfvg phase has a row per kernel choice (and with --lookahead plain and each chain again with the device
    step's lookahead flipped, the same tokens) and the FPGA phase its sync and overlap rows."""
    from benchmarks.gpu_speed import main
    from dfvg.gpu import block_sizes, fast

    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps([[123, 456, {"BN": 16, "BK": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}]]))
    before, shipped = dict(block_sizes.TUNED), fast.LOOKAHEAD
    head = random_feature_head(tmp_path / "head", target_hidden=128, vocab=512)
    try:
        main(["--tiny", "--device", "cpu", "--tuned", str(tuned), "--phases", "dfvg,fpga", "--ks", "2",
              "--fpga-ks", "2", "--max-new-tokens", "6", "--prompts", "2", "--results", str(tmp_path / "res"),
              "--work-dir", str(tmp_path / "w"), "--feature-head", str(head), "--lookahead"])
        assert block_sizes.TUNED[(123, 456)]["BN"] == 16 and fast.LOOKAHEAD is shipped
    finally:
        block_sizes.TUNED.clear()
        block_sizes.TUNED.update(before)
    dfvg = json.loads((tmp_path / "res" / "dfvg.json").read_text())
    assert {"dfvg_plain", "dfvg_spec_k2", "dfvg_compiled_plain", "dfvg_eager_plain"} <= set(dfvg)
    assert dfvg["dfvg_feature_k2"]["tokens"] == dfvg["dfvg_plain"]["tokens"]  # the head's row, lossless
    for row in ("dfvg_plain", "dfvg_spec_k2", "dfvg_feature_k2"):
        flipped = f"{row}_{'no_lookahead' if shipped else 'lookahead'}"
        assert dfvg[flipped]["tokens"] == dfvg["dfvg_plain"]["tokens"], flipped
    for tree in ("dfvg_tree_2-2-1-1", "dfvg_tree_4-2-1-1", "dfvg_tree_dynamic16"):  # --trees' default shapes
        assert dfvg[tree]["tokens"] == dfvg["dfvg_plain"]["tokens"]
        assert dfvg[tree.replace("dfvg_tree", "dfvg_feature_tree")]["tokens"] == dfvg["dfvg_plain"]["tokens"]
        assert dfvg[tree]["stats"][0]["num_draft_tokens"] > dfvg["dfvg_spec_k2"]["stats"][0]["num_draft_tokens"]
    assert [123, 456, {"BN": 16, "BK": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}] in dfvg["fused_tuned"]
    fpga = json.loads((tmp_path / "res" / "fpga.json").read_text())
    assert fpga["fpga_sync_k2"]["new_tokens"] == 12 and fpga["fpga_overlap_k2"]["tokens"]
    for mode in ("sync", "overlap"):  # each prompt's schedule replayed with modeled board blocks
        stats = fpga[f"fpga_{mode}_k2"]["stats"]
        assert all(s["mode"] == mode and s["projected_provenance"] == "modeled" for s in stats)
        assert all(0 < s["projected_s"] for s in stats)
    rows = {r["variant"]: r for r in report(tmp_path / "res")["rows"]}
    assert rows["fpga_overlap_k2"]["projected_tok_s"] > 0 and rows["fpga_sync_k2"]["projected_tok_s"] > 0


def test_projection_without_a_timeline_is_sync_only(tmp_path):
    """Old phase files (no per-prompt projected_s): sync swaps measured draft time for modeled time;
    overlap cannot be projected that way (drafts made ahead and discarded are not in the stats)."""
    st = {**stat(4, 2, 2, 0.5), "draft_s": 0.4, "modeled_draft_s": 0.01}
    sync_run = {**run(4.0, [[1, 2, 3, 4]], [st]), "name": "fpga-emulated sync k=4"}
    overlap_run = {**run(4.0, [[1, 2, 3, 4]], [st]), "name": "fpga-emulated overlap k=4"}
    (tmp_path / "fpga.json").write_text(json.dumps({"fpga_sync_k4": sync_run, "fpga_overlap_k4": overlap_run}))
    rows = {r["variant"]: r for r in report(tmp_path)["rows"]}
    assert rows["fpga_sync_k4"]["projected_tok_s"] == pytest.approx(4 / (1.0 - 0.4 + 0.01))
    assert rows["fpga_overlap_k4"]["projected_tok_s"] is None


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_fpga_runner_projects_the_engines_schedule(tiny_pair, mode):
    """benchmarks' FPGA runner (the one projection: the engine's run replayed with modeled blocks) on CPU:
    lossless, and the replayed time is the measured one with the emulated draft time swapped for the model's,
    so below the wall time of a run whose emulated blocks take milliseconds against the model's ~50 us."""
    import time

    from benchmarks.gpu_phases import fpga_runner
    from dfvg.checkpoint import load_model
    from dfvg.fpga.datapath.drafter import FpgaDrafter
    from dfvg.generate import generate
    from dfvg.verifier import TorchVerifier

    verifier = TorchVerifier(load_model(tiny_pair[0]))
    drafter = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8)
    ids = [5, 9, 14, 3, 22, 41, 7]
    start = time.perf_counter()
    tokens, stats = fpga_runner(verifier, drafter, 4, 24, mode)(ids)
    wall = time.perf_counter() - start
    assert tokens == generate(verifier, ids, 24).tokens
    assert stats["mode"] == mode and stats["projected_provenance"] == "modeled"
    assert 0 < stats["projected_s"] < wall


def test_reprojection_of_the_recorded_h200_report_is_bounded_by_its_measured_parts():
    """benchmarks/fpga_reproject.py on the committed report: the projection lies between a free board (only the
    measured target time left) and a 10x slower one; the overlap bound never beats the free board."""
    from pathlib import Path

    from benchmarks.fpga_reproject import SHIPPED, project, recorded
    from dfvg.checkpoint import load_config
    from dfvg.fpga.board.boards import get_board
    from dfvg.fpga.board.latency import DesignParams
    from dfvg.fpga.board.workload import draft_workload

    summary = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/h200_2026-12-03_engine"
                          / "performance_summary.json").read_text())
    rec = recorded(summary)
    assert rec["blocks"] == 965 and rec["new_tokens"] == 2353 and rec["k"] == 4
    lengths, workload, u280 = [100] * 20, draft_workload(load_config(SHIPPED), 8), get_board("u280")
    free_board = rec["new_tokens"] / (rec["host_s"] + rec["verify_s"]) / rec["baseline_tok_s"]
    default = project(rec, lengths, workload, u280, DesignParams())
    slow = project(rec, lengths, workload, u280, DesignParams(clock_mhz=25.0))
    assert slow["speedup_vs_baseline_sync"] < default["speedup_vs_baseline_sync"] < free_board
    assert default["speedup_vs_baseline_sync"] <= default["speedup_vs_baseline_overlap_at_most"] < free_board
    assert default["provenance"] == "modeled"


def test_reprojection_refuses_a_report_without_an_fpga_projection(tmp_path):
    from benchmarks.fpga_reproject import read_summary
    from dfvg.errors import UserError

    path = tmp_path / "performance_summary.json"
    path.write_text(json.dumps({"variants": {"baseline": {}, "speculative": {}}}))
    with pytest.raises(UserError, match="lacks a fpga variant"):
        read_summary(str(path))


def test_benchmark_prompts_put_the_drafts_held_out_prompts_first():
    """`--prompts 20` must time prompts the distilled draft never trained on (HumanEval/0-19 held 18 it did)."""
    from benchmarks.gpu_speed import HELD_OUT, held_out_first

    tasks = [{"id": f"HumanEval/{i}"} for i in range(164)]
    held_out = [json.loads(line)["id"] for line in HELD_OUT.read_text().splitlines() if line.strip()]
    ordered = held_out_first(tasks, held_out)
    assert [t["id"] for t in ordered[:20]] == held_out[:20]
    assert sorted(t["id"] for t in ordered) == sorted(t["id"] for t in tasks)  # nothing lost or doubled
    rest = [t["id"] for t in ordered[len(held_out):]]
    assert rest == [t["id"] for t in tasks if t["id"] not in held_out]


def shipped_switches() -> dict:
    """The launch mode of the switches as shipped, written out here (gpu_modes.current_mode must agree)."""
    from dfvg.gpu import decode_attention, fused

    return {"pdl": True, "table": "shipped", "share_kv": decode_attention.SHARE_KV,
            "split_programs": decode_attention.SPLIT_PROGRAMS_PER_SM, "tile_rows": fused.TILE_ROWS,
            "prefetch": fused.PREFETCH_COLUMNS, "trigger": decode_attention.EARLY_TRIGGER,
            "stack": fused.STACKED_PAIR, "early": fused.EPILOGUE_FIRST,
            "norm_in_producer": fused.NORM_IN_PRODUCER_ABOVE, "tall_above": fused.TALL_TILES_ABOVE,
            "items": decode_attention.ITEMS_PER_SM, "merge": (decode_attention.COMBINE_SHORT,
                                                              decode_attention.COMBINE_SPLITS,
                                                              decode_attention.COMBINE_COLUMNS),
            "slots": decode_attention.ATTENTION_SPLIT, "loads_first": fused.RMS_LOADS_FIRST,
            "factored": fused.FACTORED_NORM, "factored_qkv": fused.FACTORED_QKV_NORM, "tma": fused.TMA_WEIGHTS,
            "ahead": fused.WEIGHTS_AHEAD, "trigger_rows": decode_attention.EARLY_TRIGGER_ROWS,
            "split_trigger": decode_attention.SPLIT_TRIGGER_SPLITS,
            "gemv_trigger_rows": decode_attention.GEMV_TRIGGER_ROWS,
            "merge_at_once": decode_attention.MERGE_HEAD_AT_ONCE}


def test_gpu_rows_compares_the_code_before_with_the_shipped_switches():
    """gpu_rows.py's first mode (gpu_modes.py) is the code before the attention change (ratios are against it),
    one mode is exactly the shipped switches, and a mode's switches are set and then restored around the
    captures."""
    from benchmarks import gpu_modes
    from dfvg.gpu import block_sizes, decode_attention, fused

    tables = {"shipped": block_sizes.tuned_rows(), "swept": [[1536, 1536, {"BN": 64, "BK": 64, "SPLIT_K": 1,
                                                                        "num_warps": 4, "num_stages": 2,
                                                                        "SWAP_AB": 1}]]}
    modes = gpu_modes.modes_of(tables)
    before = next(iter(modes.values()))
    assert before["share_kv"] is False and before["split_programs"] is None
    shipped = shipped_switches()
    assert sum(mode == shipped for mode in modes.values()) == 1
    later = ("ahead", "trigger_rows", "split_trigger")
    ahead = [(mode["prefetch"], mode["trigger"]) for name, mode in modes.items() if ("prefetch" in name or
             "trigger" in name) and all(mode[key] == shipped[key] for key in later)]  # streaming ahead: each, both
    assert sorted(ahead + [(shipped["prefetch"], shipped["trigger"])]) == [
        (0, False), (0, True), (512, False), (512, True), (8960, False), (8960, True)]
    loaded = [(mode["ahead"], mode["trigger"], mode["trigger_rows"], mode["split_trigger"]) for mode in modes.values()
              if any(mode[key] != shipped[key] for key in later)]  # bounded triggers, QKV and O weights ahead
    assert loaded == [(0, True, None, 2 ** 20), (0, True, 16, 0), (3, False, None, 0), (3, True, None, 0),
                      (3, True, None, 2 ** 20), (3, True, 16, 128)]
    assert all(mode == {**shipped, **{key: mode[key] for key in ("trigger", *later)},
                        "gemv_trigger_rows": mode["trigger_rows"]} for mode in modes.values()
               if any(mode[key] != shipped[key] for key in later))  # (the GEMVs' bound set as the attention's)
    gemvs = [mode for mode in modes.values() if mode["gemv_trigger_rows"] != shipped["gemv_trigger_rows"]
             and all(mode[key] == shipped[key] for key in later)]
    assert gemvs == [{**shipped, "gemv_trigger_rows": 16 if shipped["gemv_trigger_rows"] is None else None}]
    at_once = [mode for mode in modes.values() if mode["merge_at_once"] != shipped["merge_at_once"]]
    assert at_once == [{**shipped, "merge_at_once": not shipped["merge_at_once"]}]
    assert modes["shipped with the swept block sizes"]["table"] == "swept"
    assert [modes[f"shipped with {rows}-row tiles"] for rows in (32, 64)] == [
        {**shipped, "tile_rows": 32}, {**shipped, "tile_rows": 64}]
    assert modes["swept block sizes with 32-row tiles"] == {**shipped, "table": "swept", "tile_rows": 32}
    flipped = "unstacked" if shipped["stack"] else "stacked"  # only where a table has SWAP_AB launches
    assert modes[f"swept block sizes, swapped pairs {flipped}"] == {**shipped, "table": "swept",
                                                                     "stack": not shipped["stack"]}
    assert f"shipped block sizes, swapped pairs {flipped}" not in modes  # TUNED (no GPU here): nothing to stack
    early = [mode for name, mode in modes.items() if "epilogue inputs" in name]
    assert early == [{**shipped, "early": not shipped["early"]}]
    norm = [mode for name, mode in modes.items() if "gate/up's RMSNorm" in name]
    others = [above for above in (None, 0, 16) if above != fused.NORM_IN_PRODUCER_ABOVE]
    assert norm == [{**shipped, "norm_in_producer": above, "factored": False} for above in others] and len(norm) == 2
    try:
        gpu_modes._set_mode(before, tables)
        assert decode_attention.SPLIT_PROGRAMS_PER_SM is None and not decode_attention.SHARE_KV
        gpu_modes._set_mode(modes["shipped with the swept block sizes"], tables)
        assert block_sizes.linear_config(1536, 1536)["BN"] == 64
        gpu_modes._set_mode(modes["shipped with 64-row tiles"], tables)
        assert fused.TILE_ROWS == 64
        gpu_modes._set_mode(modes[f"swept block sizes, swapped pairs {flipped}"], tables)
        assert fused.STACKED_PAIR != shipped["stack"] and block_sizes.linear_config(1536, 1536)["BN"] == 64
        gpu_modes._set_mode(early[0], tables)
        assert fused.EPILOGUE_FIRST != shipped["early"]
        gpu_modes._set_mode(norm[0], tables)
        assert fused.NORM_IN_PRODUCER_ABOVE == norm[0]["norm_in_producer"] != shipped["norm_in_producer"]
        gpu_modes._set_mode(modes["shipped, 512-column prefetch and early trigger"], tables)
        assert fused.PREFETCH_COLUMNS == 512 and decode_attention.EARLY_TRIGGER
        gpu_modes._set_mode(modes["shipped, QKV and O weights before the wait, early trigger up to 16 rows, the "
                                  "split's up to 128 splits"], tables)
        assert fused.WEIGHTS_AHEAD == 3 and decode_attention.EARLY_TRIGGER
        assert (decode_attention.EARLY_TRIGGER_ROWS, decode_attention.SPLIT_TRIGGER_SPLITS) == (16, 128)
    finally:
        gpu_modes._set_mode(shipped, tables)
    assert decode_attention.SHARE_KV and block_sizes.tuned_rows() == tables["shipped"] and fused.TILE_ROWS == 16
    assert fused.STACKED_PAIR == shipped["stack"] and fused.EPILOGUE_FIRST == shipped["early"]
    assert fused.NORM_IN_PRODUCER_ABOVE == shipped["norm_in_producer"] and gpu_modes.current_mode() == shipped
    assert (fused.PREFETCH_COLUMNS, decode_attention.EARLY_TRIGGER) == (shipped["prefetch"], shipped["trigger"])
    assert (fused.WEIGHTS_AHEAD, decode_attention.EARLY_TRIGGER_ROWS, decode_attention.SPLIT_TRIGGER_SPLITS) == (
        shipped["ahead"], shipped["trigger_rows"], shipped["split_trigger"])
    # the fastest table is chosen among the modes with the shipped switches only (a table is tuned for one tile
    # height; a faster switch, e.g. the weight prefetch, must not make the shipped table win)
    rows = [{"mode": "a", "block_sizes": "shipped", "switches_as_shipped": True, "T": 1, "ms": 1.7},
            {"mode": "b", "block_sizes": "swept", "switches_as_shipped": True, "T": 1, "ms": 1.6},
            {"mode": "c", "block_sizes": "shipped", "switches_as_shipped": False, "T": 1, "ms": 1.0}]
    assert gpu_modes.fastest_table(rows) == "swept"
    assert gpu_modes.fastest_table(rows[2:]) == "shipped"  # nothing timed with the shipped switches


def test_gpu_rows_times_the_verify_switches_each_flipped():
    """Tall tiles, attention items per SM, the merge's widths, the split's slots, the factored norm and TMA weight
    tiles: each other value one mode beside the shipped ones, set for the captures and restored after."""
    from benchmarks import gpu_modes
    from dfvg.gpu import block_sizes, decode_attention, fused

    tables = {"shipped": block_sizes.tuned_rows()}
    modes, shipped = gpu_modes.modes_of(tables), shipped_switches()
    tall = [mode for name, mode in modes.items() if "unnormalized swapped launches" in name]
    assert tall == [{**shipped, "tall_above": above} for above in (None, 16, 32, 48)
                    if above != shipped["tall_above"]]
    items = [mode for name, mode in modes.items() if "work items per SM" in name]
    assert items == [{**shipped, "items": n} for n in gpu_modes.ITEMS if n != shipped["items"]] and items
    merges = [mode for name, mode in modes.items() if "attention merging" in name]
    assert merges == [{**shipped, "merge": pair} for pair in gpu_modes.MERGES if pair != shipped["merge"]] and merges
    slots = [mode for name, mode in modes.items() if "attention splits of" in name]
    assert slots == [{**shipped, "slots": n} for n in gpu_modes.SPLIT_SLOTS if n != shipped["slots"]] and slots
    programs = [mode for name, mode in modes.items()
                if name.startswith("shipped, ") and "split programs per SM" in name]
    assert programs == [{**shipped, "split_programs": n} for n in gpu_modes.SPLIT_PROGRAMS
                        if n != shipped["split_programs"]] and programs
    loads = [mode for name, mode in modes.items() if "row loads issued" in name]
    assert loads == [{**shipped, "loads_first": not shipped["loads_first"]}]
    factored = [mode for name, mode in modes.items() if "ffn norm" in name]
    assert factored == [{**shipped, "factored": not shipped["factored"]}]
    qkv = [mode for name, mode in modes.items() if "qkv norm" in name]
    assert qkv == [{**shipped, "factored_qkv": not shipped["factored_qkv"]}]
    tma = [mode for name, mode in modes.items() if "weights through" in name]
    assert tma == [{**shipped, "tma": not shipped["tma"]}]
    try:
        gpu_modes._set_mode(tma[0], tables)
        assert fused.TMA_WEIGHTS != shipped["tma"]
        gpu_modes._set_mode(qkv[0], tables)
        assert fused.FACTORED_QKV_NORM != shipped["factored_qkv"]
        gpu_modes._set_mode(factored[0], tables)
        assert fused.FACTORED_NORM != shipped["factored"]
        gpu_modes._set_mode(loads[0], tables)
        assert fused.RMS_LOADS_FIRST != shipped["loads_first"]
        gpu_modes._set_mode(merges[-1], tables)
        assert (decode_attention.COMBINE_SHORT, decode_attention.COMBINE_SPLITS,
                decode_attention.COMBINE_COLUMNS) == merges[-1]["merge"]
        gpu_modes._set_mode(items[-1], tables)
        assert decode_attention.ITEMS_PER_SM == items[-1]["items"] != shipped["items"]
        gpu_modes._set_mode(slots[0], tables)
        assert decode_attention.ATTENTION_SPLIT == slots[0]["slots"] != shipped["slots"]
        gpu_modes._set_mode(programs[0], tables)
        assert decode_attention.SPLIT_PROGRAMS_PER_SM == programs[0]["split_programs"] != shipped["split_programs"]
        gpu_modes._set_mode(tall[0], tables)
        assert fused.TALL_TILES_ABOVE == tall[0]["tall_above"] != shipped["tall_above"]
    finally:
        gpu_modes._set_mode(shipped, tables)
    assert gpu_modes.current_mode() == shipped


def test_draft_block_compares_the_shipped_table_with_split_k_on_the_drafts_shapes_only(capsys):
    """benchmarks/draft_block.py's two tables differ exactly in the distilled draft's five GEMV shapes (the
    shipped one without split-K), and the target's entries stay in both; an unknown shape is one line."""
    from benchmarks import draft_block
    from dfvg.gpu import block_sizes
    from dfvg.model import Transformer

    tables = draft_block.tables_for(Transformer(draft_block.DISTILLED))
    removed = set(tables["shipped"]) - set(tables["split_k"])
    assert removed == {(768, 512), (512, 512), (1536, 512), (512, 1536), (32768, 512)}
    assert all(tables["shipped"][shape]["SPLIT_K"] == 1 for shape in removed)
    shipped = dict(block_sizes.TUNED)
    try:  # without the entries, linear_config splits K for the small ones (what the benchmark compares with)
        block_sizes.TUNED.clear()
        assert all(block_sizes.linear_config(*shape)["SPLIT_K"] > 1 for shape in removed - {(32768, 512)})
    finally:
        block_sizes.TUNED.update(shipped)
    assert (8960, 1536) in tables["split_k"]
    for bad, says in ((["--drafts", "distilled-4x512,nope"], "unknown draft shape 'nope'"),
                      (["--rounds", "0"], "--rounds 0: give at least 1")):
        with pytest.raises(SystemExit) as exited:
            draft_block.main(["--out", "unused", *bad])
        assert exited.value.code == 2 and says in capsys.readouterr().err


def test_the_heads_fpga_projection_keeps_every_measured_cost(tmp_path):
    """feature_head_projection.py: the projected time is the sum of its parts, the measured ones taken as
    recorded; a slower measured verify gives a slower projection; a missing file is one line, exit 2."""
    from benchmarks import feature_head_projection as projection

    head = random_feature_head(tmp_path / "head", target_hidden=128, vocab=512)
    stats = {"num_verify_steps": 40, "num_accepted_tokens": 88, "num_new_tokens": 128, "prefill_s": 0.09,
             "decode_s": 0.15, "draft_s": 0.04, "verify_s": 0.08}
    plain = {"stats": [dict(stats, prefill_s=0.008)] * 2, "tokens_per_s": 550.0}
    speed = {"dfvg_plain": plain, "dfvg_feature_k4": {"stats": [stats] * 2, "tokens_per_s": 590.0}}
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    (tmp_path / "prompts.json").write_text(json.dumps([{"ids": list(range(150))}] * 3))
    args = ["--speed", str(tmp_path / "speed.json"), "--head", str(head), "--prompts-file",
            str(tmp_path / "prompts.json"), "--output", str(tmp_path / "out.json")]
    assert projection.main(args) == 0
    int8 = json.loads((tmp_path / "out.json").read_text())["projection"]["int8"]
    parts = int8["parts_s"]
    assert parts["verify_s"] == 2 * 0.08 and parts["target_prefill_s"] == 2 * 0.008
    assert abs(parts["host_s"] - 2 * (0.15 - 0.04 - 0.08)) < 1e-12
    assert abs(int8["projected_tokens_per_s"] - 256 / sum(parts.values())) < 1e-9
    assert 0 < parts["head_blocks_s"] and 0 < parts["head_prompt_pass_s"] and "modeled" in int8["provenance"]
    speed["dfvg_feature_k4"]["stats"] = [dict(stats, verify_s=0.12, decode_s=0.19)] * 2
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    assert projection.main(args) == 0
    slower = json.loads((tmp_path / "out.json").read_text())["projection"]["int8"]
    assert slower["projected_tokens_per_s"] < int8["projected_tokens_per_s"]
    assert projection.main(["--speed", str(tmp_path / "none.json"), "--head", str(head)]) == 2


def test_a_gguf_loaded_target_is_saved_plain_for_the_fpga_heads_calibration(tmp_path):
    """transformers marks a GGUF-loaded model as quantized and refuses save_pretrained; the FPGA head phase
    calibrates on the saved target, so the benchmark drops the mark and saves the bf16 tensors it runs."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from benchmarks.gpu_speed import save_dequantized
    from dfvg.checkpoint import load_model

    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    model.config.quantization_config = {"quant_method": "gguf"}
    model.hf_quantizer = object()  # what save_pretrained refuses
    save_dequantized(model, tmp_path / "target")
    assert "quantization_config" not in json.loads((tmp_path / "target/config.json").read_text())
    reloaded = load_model(tmp_path / "target")
    assert torch.equal(reloaded.tok_embeddings.weight, model.model.embed_tokens.weight)


def test_a_target_that_kept_packed_gguf_modules_is_not_saved(tmp_path):
    """Dropping the quantized mark is safe only for plain tensors: packed GGUF modules are refused, nothing saved."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from benchmarks.gpu_speed import save_dequantized

    class GgufLinear(torch.nn.Linear):  # what transformers keeps where a dequantizing kernel is installed
        pass

    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64)
    model = AutoModelForCausalLM.from_config(config)
    model.model.layers[0].mlp.down_proj = GgufLinear(64, 32, bias=False)
    with pytest.raises(ValueError, match="packed GGUF modules \\(GgufLinear\\)"):
        save_dequantized(model, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_tree_step_counts_the_trees_extra_launches_on_a_cpu(tmp_path, capsys):
    """benchmarks/tree_step.py's CPU smoke run: every step replays, the chain comes first, a tree dispatches
    more ops than the chain (its bookkeeping) but not the 4 per layer that compaction took before kv_store,
    and no more than the lean bookkeeping's (+54 and +37 here; +98 and +94 before its index ranges became
    constants and slots one add)."""
    from benchmarks.tree_step import main

    main(["--device", "cpu", "--tiny", "--trees", "dynamic:3 2,1", "--k", "2", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "tree_step.json").read_text())["rows"]
    assert [r["step"] for r in rows] == ["chain k=2", "tree dynamic:3 depth 2", "tree 2,1 depth 2"]
    ops = [{k["kernel"]: k["per_step"] for k in row["kernels"]} for row in rows]
    for tree, per_step, lean in zip(rows[1:], ops[1:], (54, 37), strict=True):
        assert 0 < tree["extra_launches_over_chain"] <= lean + 10  # slack for another torch's op split
        for op in ("index_copy_", "index_select"):  # compaction: 2 x 28 of each before kv_store, 1 now
            assert per_step[op] - ops[0].get(op, 0) <= 2
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--trees", "3,x", "--out", str(tmp_path)])
    assert "--tree must be" in capsys.readouterr().err


def test_the_lease_scripts_parse_and_name_known_modes():
    """Every lease script under benchmarks/ parses (`bash -n`), and each launch mode a script asks gpu_rows.py for is
    one gpu_modes.py defines: a misspelt mode stops the run only on the device, after its lease has started. (The
    "given" table's modes exist where the command passes --tuned, the "swept" one's with --sweep; step_timeline.py's
    --mode takes modes of the shipped table.)"""
    import re
    import subprocess

    from benchmarks import gpu_modes
    from dfvg.gpu import block_sizes

    root = Path(__file__).resolve().parents[1]
    rows = block_sizes.tuned_rows()
    known = gpu_modes.modes_of({"shipped": rows, "given": rows, "swept": rows})
    scripts = sorted((root / "benchmarks").glob("*.sh"))
    assert any(script.name == "h200_kernels.sh" for script in scripts)
    for script in scripts:
        parsed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert parsed.returncode == 0, (script.name, parsed.stderr)
        text = script.read_text()
        for command, asked in re.findall(r'(gpu_rows\.py[^\n]*(?:\\\n[^\n]*)*?)--modes "([^"$]+)"', text):
            files = (re.findall(r"--tuned (\S+)", command) or [""])[0].split(",")
            given = {f"given {Path(path).stem}": rows for path in files} if len(files) > 1 else {}
            named = known | gpu_modes.modes_of({"shipped": rows, **given})
            unknown = [name for name in asked.split(";") if name.strip() and name.strip() not in named]
            assert not unknown, (script.name, unknown)
            assert "given" not in asked or "--tuned" in command, (script.name, "a given table's mode without --tuned")
            assert "swept" not in asked or "--sweep" in command, (script.name, "a swept table's mode without --sweep")
        timeline_modes = re.findall(r'step_timeline\.py[^\n]*(?:\\\n[^\n]*)*?--mode "([^"$]+)"', text)
        assert all(known.get(name, {}).get("table") == "shipped" for name in timeline_modes), (script.name,
                                                                                                timeline_modes)
        assert timeline_modes or script.name != "h200_kernels.sh"  # (the step_timeline check ran on its --mode)
