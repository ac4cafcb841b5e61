"""Report schemas: every number carries provenance, the CSV header is exact, sections say what is missing;
the energy meters' arithmetic; collecting runs into summaries."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from dfvg.energy import EnergyMeter, GpuSample, Nvml, integrate_power, rapl_delta_j
from dfvg.errors import UserError
from dfvg.reports.collect import collect
from dfvg.reports.energy import HEADER
from dfvg.stats import PROVENANCES

RECORD_KEYS = {"value", "unit", "provenance", "source"}


@pytest.fixture(scope="module")
def run_dir(tiny_pair, tmp_path_factory) -> Path:
    from dfvg.host.experiments import run_experiments

    tmp = tmp_path_factory.mktemp("reports")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": f"w{3 + i} w5 w7 w9 w11 w13"})
                                 for i in range(2)) + "\n")
    target, draft = tiny_pair
    raw = {"name": "schema", "target_model": str(target), "draft_model": str(draft), "dataset": str(prompts),
           "num_prompts": 2, "max_new_tokens": 8, "draft_length": 2, "draft_length_sweep": [1, 3],
           "variants": ["baseline", "speculative", "fpga", "overlap", "sweep"], "output_dir": str(tmp / "results")}
    (tmp / "schema.yaml").write_text(yaml.safe_dump(raw))
    return run_experiments(tmp / "schema.yaml")


def bare_numbers(node, path: str = "") -> list[str]:
    """Paths of numbers not inside a {value, unit, provenance, source} record with a known provenance."""
    if isinstance(node, dict):
        if RECORD_KEYS <= set(node):
            return [] if node["provenance"] in PROVENANCES else [f"{path}: provenance {node['provenance']!r}"]
        return [p for k, v in node.items() for p in bare_numbers(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in bare_numbers(v, f"{path}[{i}]")]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return [path]
    return []


@pytest.mark.parametrize("name", ["performance_summary.json", "ablation_results.json"])
def test_every_number_has_provenance(run_dir, name):
    assert bare_numbers(json.loads((run_dir / name).read_text())) == []


def test_bare_number_check_can_fail():
    assert bare_numbers({"a": {"b": 1.0}}) == [".a.b"]
    assert bare_numbers({"value": 1, "unit": "s", "provenance": "guessed", "source": ""})


def test_performance_summary_fields(run_dir):
    summary = json.loads((run_dir / "performance_summary.json").read_text())
    spec = summary["variants"]["speculative"]
    for key in ("tokens_per_second", "ms_per_token", "speedup"):
        assert spec["measured"][key]["provenance"] == "measured"
    acceptance = spec["acceptance"]
    assert acceptance["mean_accepted_length_counts_bonus"] is True
    assert "bonus" in summary["definitions"]["mean_accepted_length"].lower()
    assert len(acceptance["per_position_acceptance"]["value"]) == 2
    histogram = acceptance["accepted_length_histogram"]["value"]
    assert len(histogram) == 3 and sum(histogram) > 0
    assert summary["variants"]["baseline"]["measured"]["speedup"]["value"] == 1.0


def test_energy_csv_header_and_rows(run_dir):
    with open(run_dir / "energy_analysis.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == HEADER == ("component", "variant", "quantity", "value", "unit", "provenance", "source")
    body = [dict(zip(HEADER, r, strict=True)) for r in rows[1:]]
    assert body
    for row in body:
        if row["value"] == "":
            assert row["provenance"] == "unavailable" and row["source"]
        else:
            float(row["value"])
            assert row["provenance"] in PROVENANCES and row["source"]
    cpu = [r for r in body if r["component"] == "cpu" and r["quantity"] == "energy_per_token"]
    assert {r["variant"] for r in cpu} >= {"baseline", "speculative"}
    fpga = [r for r in body if r["component"] == "fpga"]
    if fpga:
        assert {r["provenance"] for r in fpga} == {"modeled"}
    if not Nvml.open().handles:
        gpu = [r for r in body if r["component"] == "gpu"]
        assert gpu and all("no NVIDIA GPU" in r["source"] for r in gpu)


def test_resource_log_sections(run_dir):
    text = (run_dir / "resource_utilization.log").read_text()
    assert "[fpga]" in text and "[gpu]" in text and "[host]" in text
    if not Nvml.open().handles:
        assert "no NVIDIA GPU on this machine" in text


def test_metadata_and_plots(run_dir):
    meta = json.loads((run_dir / "run_metadata.json").read_text())
    assert {"git", "packages", "hardware", "config"} <= set(meta)
    assert meta["packages"]["torch"] and meta["hardware"]["cpu_count"] >= 1
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["name"] == "schema"
    for png in (run_dir / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((run_dir / "plots").glob("*.png"))) == 3


def test_ablation_stages_in_order(run_dir):
    ablation = json.loads((run_dir / "ablation_results.json").read_text())
    stages = [s["stage"] for s in ablation["stages"]]
    order = ["baseline", "speculative", "fpga", "overlap", "adaptive"]
    assert stages == [s for s in order if s in stages] and stages[0] == "baseline"
    assert "adaptive" in ablation["not_run"]
    assert [e["draft_length"]["value"] for e in ablation["draft_length_sweep"]] == [1.0, 2.0, 3.0]


def test_collect_results(run_dir):
    doc = collect(run_dir.parent)
    assert doc["runs"] == [run_dir.name]
    assert (run_dir.parent / "summary.md").read_text().startswith("# DFVG results")
    header = (run_dir.parent / "summary.csv").read_text().splitlines()[0]
    assert header.startswith("run_id,experiment,variant,tokens_per_second")
    assert "schema" in doc["aggregate"]


def test_collect_refuses_empty_directory(tmp_path):
    (tmp_path / ".half-written.tmp-1").mkdir()  # a run in progress is not a run
    with pytest.raises(UserError, match="no run directories"):
        collect(tmp_path)


def test_rapl_wraparound(tmp_path):
    domain = tmp_path / "intel-rapl:0"
    domain.mkdir()
    (domain / "max_energy_range_uj").write_text("1000000\n")
    assert rapl_delta_j(domain, 100, 600) == pytest.approx(0.0005)
    assert rapl_delta_j(domain, 999_000, 1_000) == pytest.approx(0.002)


def test_meter_reads_rapl_when_readable(tmp_path):
    domain = tmp_path / "intel-rapl:0"
    domain.mkdir()
    (domain / "energy_uj").write_text("1000000\n")
    (domain / "max_energy_range_uj").write_text("262143328850\n")
    with EnergyMeter(Nvml(reason="no NVIDIA GPU on this machine (test)"), rapl_root=tmp_path) as meter:
        (domain / "energy_uj").write_text("3500000\n")
    gpu, cpu = meter.measurements()
    assert cpu.provenance == "measured" and cpu.energy_j == pytest.approx(2.5)
    assert gpu.energy_j is None and "no NVIDIA GPU" in gpu.source


def test_meter_assumes_cpu_power_without_rapl(tmp_path):
    with EnergyMeter(Nvml(reason="none"), cpu_watts_per_core=10.0, rapl_root=tmp_path / "absent") as meter:
        sum(i * i for i in range(200_000))
    cpu = meter.measurements()[-1]
    assert cpu.provenance == "assumed" and "10.0 W per busy core" in cpu.source and cpu.energy_j > 0


def test_integrate_power_trapezoid():
    samples = [GpuSample(t, 0, 0, 0, 0, 0, p) for t, p in ((0.0, 100.0), (1.0, 200.0), (3.0, 200.0))]
    assert integrate_power(samples) == pytest.approx(150.0 + 400.0)
    assert integrate_power(samples[:1]) is None


@pytest.mark.gpu
def test_nvml_energy_counter_and_samples_on_a_real_gpu():
    """On the GPU machine: the board's energy counter moves under load and the sampler sees the GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("pynvml")
    from dfvg.energy import EnergyMeter

    a = torch.randn(4096, 4096, device="cuda")
    with EnergyMeter(sample_interval_s=0.05) as meter:
        for _ in range(400):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()
    gpu = [m for m in meter.measurements() if m.component.startswith("gpu")]
    assert gpu and gpu[0].provenance == "measured" and gpu[0].energy_j and gpu[0].energy_j > 0
    assert meter.gpu_samples and max(s.power_w for s in meter.gpu_samples) > 0
