"""The experiment config loader (one-line refusals) and an end-to-end tiny run writing every report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from dfvg.errors import UserError
from dfvg.host.experiment_config import build_config, load_experiment_config
from dfvg.reports import REPORT_FILES

REPO = Path(__file__).resolve().parents[1]


def write_prompts(path: Path, n: int = 3) -> Path:
    lines = [json.dumps({"id": f"p{i}", "prompt": " ".join(f"w{j}" for j in range(2 + i, 14 + i))}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_config(tiny_pair, tmp_path: Path, **overrides) -> dict:
    target, draft = tiny_pair
    raw = {"name": "tiny", "target_model": str(target), "draft_model": str(draft),
           "dataset": str(write_prompts(tmp_path / "prompts.jsonl")), "num_prompts": 2, "max_new_tokens": 10,
           "draft_length": 3, "num_runs": 2, "variants": ["baseline", "speculative"],
           "output_dir": str(tmp_path / "results"), "warmup": False}
    raw.update(overrides)
    return raw


def write_yaml(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def refusal(raw: dict, tmp_path: Path) -> str:
    with pytest.raises(UserError) as err:
        load_experiment_config(write_yaml(tmp_path / "exp.yaml", raw))
    message = str(err.value)
    assert "\n" not in message
    return message


def test_tiny_config_loads_with_seed_aliases(tiny_pair, tmp_path):
    raw = tiny_config(tiny_pair, tmp_path)
    raw["TARGET_MODEL"], raw["DRAFT_MODEL"] = raw.pop("target_model"), raw.pop("draft_model")
    raw["BATCH_SIZE"] = 1
    cfg = load_experiment_config(write_yaml(tmp_path / "exp.yaml", raw))
    assert cfg.target_model == tiny_pair[0].resolve() and cfg.batch_size == 1
    assert cfg.variants == ("baseline", "speculative") and cfg.devices.verify == "cpu"


def test_unknown_key_is_named(tiny_pair, tmp_path):
    message = refusal(tiny_config(tiny_pair, tmp_path, max_tokens=5), tmp_path)
    assert "unknown key 'max_tokens'" in message and "max_new_tokens" in message


@pytest.mark.parametrize("key, value, allowed", [
    ("max_new_tokens", 0, "integer >= 1"), ("draft_length", "four", "integer >= 1"),
    ("variants", ["baseline", "warp"], "baseline, speculative"), ("temperature", -1, "number in"),
    ("top_p", 0, "(0.0, 1.0]"), ("dtype", "fp8", "float32"), ("num_runs", True, "integer"),
    ("draft_length_sweep", [0, 2], "list of integers"), ("devices", 3, "mapping"),
])
def test_bad_values_name_key_and_allowed(tiny_pair, tmp_path, key, value, allowed):
    message = refusal(tiny_config(tiny_pair, tmp_path, **{key: value}), tmp_path)
    assert key in message and allowed in message


def test_both_alias_and_key_refused(tiny_pair, tmp_path):
    raw = tiny_config(tiny_pair, tmp_path, BATCH_SIZE=2, batch_size=1)
    assert "keep one" in refusal(raw, tmp_path)


def test_missing_model_path_says_download_or_edit(tiny_pair, tmp_path):
    message = refusal(tiny_config(tiny_pair, tmp_path, target_model=str(tmp_path / "nowhere")), tmp_path)
    assert "target_model" in message and "download" in message and "edit the path" in message


def test_bad_inline_device_names_devices(tiny_pair, tmp_path):
    message = refusal(tiny_config(tiny_pair, tmp_path, devices={"draft": "tpu"}), tmp_path)
    assert "devices" in message and "tpu" in message


def test_sweep_needs_lengths(tiny_pair, tmp_path):
    assert "draft_length_sweep" in refusal(tiny_config(tiny_pair, tmp_path, variants=["sweep"]), tmp_path)


def test_draft_params_file_fills_unset_keys(tiny_pair, tmp_path):
    params = write_yaml(tmp_path / "draft_params.yaml", {"draft_length": 6, "draft_length_sweep": [1, 2]})
    raw = tiny_config(tiny_pair, tmp_path, draft_params=str(params))
    raw.pop("draft_length")
    cfg = build_config(raw)
    assert cfg.draft_length == 6 and cfg.draft_length_sweep == (1, 2)
    raw["draft_length"] = 2  # the config's own value wins
    assert build_config(raw).draft_length == 2
    write_yaml(params, {"k": 3})
    with pytest.raises(UserError, match="unknown key 'k'"):
        build_config(raw)


def test_shipped_configs_parse_or_refuse_in_one_line():
    llama = REPO / "configs" / "llama7b.yaml"
    if not (REPO / "models" / "llama-2-7b-hf" / "config.json").is_file():
        with pytest.raises(UserError, match="CUDA is not available" if not torch.cuda.is_available()
                           else "download the model") as err:  # a GPU config refuses a CPU machine first
            load_experiment_config(llama)
        assert "\n" not in str(err.value)
    pair = [REPO / "models" / name / "config.json" for name in ("qwen2.5-coder-1.5b-instruct",
                                                                 "qwen2.5-coder-0.5b-instruct")]
    if all(path.is_file() for path in pair):  # after download_models.py (--only target installs one of them)
        cfg = load_experiment_config(REPO / "configs" / "default.yaml")
        assert {"baseline", "speculative", "overlap", "fpga"} <= set(cfg.variants)
        assert cfg.num_prompts * cfg.max_new_tokens <= 64  # sized for a 2-core CPU


@pytest.fixture(scope="module")
def tiny_run(tiny_pair, tmp_path_factory) -> Path:
    """One end-to-end run of every variant on the tiny pair."""
    from dfvg.host.experiments import run_experiments

    tmp = tmp_path_factory.mktemp("run")
    raw = tiny_config(tiny_pair, tmp, variants=["baseline", "speculative", "fpga", "overlap", "adaptive", "sweep"],
                      draft_length_sweep=[1, 2], warmup=True)
    return run_experiments(write_yaml(tmp / "tiny.yaml", raw))


def test_end_to_end_writes_every_report(tiny_run):
    for name in REPORT_FILES:
        assert (tiny_run / name).is_file() and (tiny_run / name).stat().st_size > 0, name
    summary = json.loads((tiny_run / "performance_summary.json").read_text())
    assert {"baseline", "speculative", "sweep:k=1", "sweep:k=2"} <= set(summary["variants"])
    for name, entry in summary["variants"].items():
        if "acceptance" in entry:  # greedy fp32: speculative output equals plain decoding
            assert entry["acceptance"]["output_match_rate"]["value"] == 1.0, name
    assert len(summary["variants"]["baseline"]["measured"]["tokens_per_second_by_run"]["value"]) == 2


def test_end_to_end_fpga_variant_is_projected(tiny_run):
    summary = json.loads((tiny_run / "performance_summary.json").read_text())
    if "fpga" in summary["skipped"]:
        pytest.skip(summary["skipped"]["fpga"])
    fpga = summary["variants"]["fpga"]
    assert fpga["projected"]["tokens_per_second"]["provenance"] == "modeled"
    assert fpga["draft_device"] == "fpga"


def test_generations_and_timeline_line_up(tiny_run):
    generations = [json.loads(line) for line in (tiny_run / "generations.jsonl").read_text().splitlines()]
    timeline = json.loads((tiny_run / "timeline.json").read_text())["generations"]
    assert len(generations) == len(timeline)
    for g in timeline:
        assert all(e["end"] >= e["start"] >= 0 for e in g["events"])
    spec = [g for g in timeline if g["variant"] == "speculative"][0]
    assert {"draft", "verify"} <= {e["stage"] for e in spec["events"]}


def test_failed_report_leaves_no_directory(tiny_pair, tmp_path, monkeypatch):
    from dfvg import reports
    from dfvg.host.experiments import run_experiments

    def broken(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(reports, "write_plots", broken)
    raw = tiny_config(tiny_pair, tmp_path, num_runs=1, num_prompts=1, max_new_tokens=3)
    with pytest.raises(RuntimeError, match="disk full"):
        run_experiments(raw)
    assert list((tmp_path / "results").iterdir()) == []


def test_fpga_draft_device_overlap_is_projected(tiny_pair, tmp_path):
    from dfvg.host.experiments import run_experiments

    raw = tiny_config(tiny_pair, tmp_path, num_runs=1, variants=["overlap"],
                      devices={"draft": "fpga", "verify": "cpu", "fpga": {"board": "u280"}})
    summary = json.loads((run_experiments(raw) / "performance_summary.json").read_text())
    if "overlap" in summary["skipped"]:
        pytest.skip(summary["skipped"]["overlap"])
    overlap = summary["variants"]["overlap"]
    assert overlap["draft_device"] == "fpga" and overlap["mode"] == "overlap"
    assert overlap["projected"]["end_to_end_s"]["provenance"] in ("modeled", "estimated")
    assert overlap["acceptance"]["output_match_rate"]["value"] == 1.0


def test_tree_runs_on_the_speculative_and_fpga_variants(tiny_pair, tmp_path, monkeypatch):
    from dfvg.engine import Engine
    from dfvg.host.experiments import run_experiments

    warmed_trees, warm_up = [], Engine.warm_up

    def recorded(engine, *args, **kwargs):  # the run's warm-up knows the tree (it captures a short prompt's lead)
        warmed_trees.append(kwargs.get("tree"))
        return warm_up(engine, *args, **kwargs)

    monkeypatch.setattr(Engine, "warm_up", recorded)
    raw = tiny_config(tiny_pair, tmp_path, num_runs=1, tree="2,2,1", variants=["baseline", "speculative", "fpga"],
                      warmup=True)
    summary = json.loads((run_experiments(raw) / "performance_summary.json").read_text())
    assert [spec.label() for spec in warmed_trees] == ["2,2,1"]
    for name in ("speculative", "fpga"):
        entry = summary["variants"][name]
        assert entry["acceptance"]["output_match_rate"]["value"] == 1.0, name
    generations = [json.loads(line) for line in (Path(raw["output_dir"]).glob("*/generations.jsonl").__next__())
                   .read_text().splitlines()]
    fpga = [g for g in generations if g["variant"] == "fpga"]
    assert fpga and all(g["stats"]["num_draft_tokens"] > 3 * g["stats"]["num_verify_steps"] for g in fpga)  # trees,
    # not the k = 3 chain


def test_fpga_variant_refuses_trees_it_cannot_grow(tiny_pair, tmp_path):
    raw = tiny_config(tiny_pair, tmp_path, variants=["baseline", "fpga"], tree="2,2", temperature=0.8)
    assert "with temperature 0.8" in refusal(raw, tmp_path)
    load_experiment_config(write_yaml(tmp_path / "dynamic.yaml", tiny_config(
        tiny_pair, tmp_path, variants=["baseline", "fpga"], tree="dynamic:8")))  # greedy dynamic trees grow there


def test_batched_speculative_matches_baseline(tiny_pair, tmp_path):
    from dfvg.host.experiments import run_experiments

    raw = tiny_config(tiny_pair, tmp_path, num_runs=1, batch_size=2, variants=["baseline", "speculative", "overlap"])
    run_dir = run_experiments(raw)
    summary = json.loads((run_dir / "performance_summary.json").read_text())
    assert summary["variants"]["speculative"]["acceptance"]["output_match_rate"]["value"] == 1.0
    assert "sync only" in summary["skipped"]["overlap"]


def test_batch_variant_runs_plain_and_speculative_at_each_batch_size(tiny_pair, tmp_path):
    """`batch` with batch_sizes [1, 2]: four variants, each over every prompt, every output equal to the
    baseline's; a batch of 2 on 3 prompts decodes groups of 2 and 1 (no prompt twice, none left out)."""
    from dfvg.host.experiments import run_experiments

    raw = tiny_config(tiny_pair, tmp_path, num_runs=1, num_prompts=3, variants=["baseline", "batch"],
                      batch_sizes=[1, 2])
    run_dir = run_experiments(raw)
    rows = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    by_variant: dict[str, dict[str, list[int]]] = {}
    for row in rows:
        assert row["prompt_id"] not in by_variant.setdefault(row["variant"], {})
        by_variant[row["variant"]][row["prompt_id"]] = row["tokens"]
    names = {"batch:B=1:plain", "batch:B=1:spec", "batch:B=2:plain", "batch:B=2:spec"}
    assert set(by_variant) == names | {"baseline"} and len(by_variant["baseline"]) == 3
    for name in names:
        assert by_variant[name] == by_variant["baseline"], name
    summary = json.loads((run_dir / "performance_summary.json").read_text())
    assert summary["variants"]["batch:B=2:spec"]["acceptance"]["output_match_rate"]["value"] == 1.0


def test_extra_drafts_run_as_their_own_speculative_variants(tiny_pair, tmp_path):
    """extra_drafts: {self: <the target>}: `speculative:self` drafts with the target itself, so every draft is
    accepted, next to `speculative` with draft_model; both lossless."""
    from dfvg.host.experiments import run_experiments

    raw = tiny_config(tiny_pair, tmp_path, num_runs=1, variants=["baseline", "speculative"],
                      extra_drafts={"self": str(tiny_pair[0])})
    summary = json.loads((run_experiments(raw) / "performance_summary.json").read_text())
    own, plain_draft = summary["variants"]["speculative:self"], summary["variants"]["speculative"]
    assert own["acceptance"]["acceptance_rate"]["value"] == 1.0
    assert plain_draft["acceptance"]["acceptance_rate"]["value"] < 1.0
    assert own["acceptance"]["output_match_rate"]["value"] == plain_draft["acceptance"]["output_match_rate"][
        "value"] == 1.0
    missing = tiny_config(tiny_pair, tmp_path, extra_drafts={"gone": str(tmp_path / "nowhere")})
    assert "extra_drafts.gone" in refusal(missing, tmp_path)


def test_batch_variant_needs_sizes_and_enough_prompts(tiny_pair, tmp_path):
    assert "batch_sizes" in refusal(tiny_config(tiny_pair, tmp_path, variants=["batch"]), tmp_path)
    raw = tiny_config(tiny_pair, tmp_path, variants=["batch"], batch_sizes=[8], num_prompts=2)
    assert "num_prompts >= 8" in refusal(raw, tmp_path)


def test_gpu_config_refuses_in_one_line_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UserError, match="CUDA is not available") as err:
        load_experiment_config(REPO / "configs" / "gpu.yaml")
    assert "\n" not in str(err.value)
