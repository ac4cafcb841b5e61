"""`energy_analysis.csv`: energy per component x variant, each row with its provenance and source.

Header (exact): component,variant,quantity,value,unit,provenance,source.
Quantities per component: `energy` (J over all repetitions), `energy_per_token` (J/token), `average_power`
(W over the metered wall time). Components: `gpu:N` (NVML, measured), `cpu` (RAPL measured, or assumed
power x measured CPU-seconds), `fpga` (modeled by the board model), and `total` (their sum, labelled with
the weakest provenance among them). A component that cannot be known here (no GPU) gets one row with an
empty value, provenance `unavailable`, and the reason as its source.
"""

from __future__ import annotations

import csv
import io

from dfvg.host.records import RunResults, VariantResult, energy_totals

HEADER = ("component", "variant", "quantity", "value", "unit", "provenance", "source")
UNAVAILABLE = "unavailable"
_WEAKNESS = ("measured", "modeled", "estimated", "assumed")  # later = weaker


def component_rows(v: VariantResult, component: str, joules: float | None, provenance: str,
                   source: str) -> list[tuple]:
    if joules is None:
        return [(component, v.name, "energy_per_token", "", "J/token", UNAVAILABLE, source)]
    tokens = max(1, v.num_tokens())
    metered_s = sum(m.seconds for _, m in v.energy if m.component == "cpu")
    seconds = sum(s.modeled_draft_s or 0.0 for s in v.steps()) if component == "fpga" else metered_s
    if component == "cpu" and v.drafter == "fpga":
        source += "; includes the CPU emulation of the FPGA datapath, which a board takes off the host"
    rows = [(component, v.name, "energy", f"{joules:.6g}", "J", provenance, source),
            (component, v.name, "energy_per_token", f"{joules / tokens:.6g}", "J/token", provenance,
             f"energy / {tokens} generated tokens")]
    if seconds > 0:
        rows.append((component, v.name, "average_power", f"{joules / seconds:.6g}", "W", provenance,
                     f"energy / {seconds:.3f} s"))
    return rows


def total_rows(v: VariantResult, totals: dict) -> list[tuple]:
    known = {c: t for c, t in totals.items() if t[0] is not None}
    if not known:
        return []
    joules = sum(t[0] for t in known.values())
    provenance = max((t[1] for t in known.values()), key=_WEAKNESS.index)
    missing = [c for c in totals if c not in known]
    source = f"sum of {', '.join(known)}" + (f" (without {', '.join(missing)}: unavailable)" if missing else "")
    tokens = max(1, v.num_tokens())
    return [("total", v.name, "energy", f"{joules:.6g}", "J", provenance, source),
            ("total", v.name, "energy_per_token", f"{joules / tokens:.6g}", "J/token", provenance, source)]


def energy_rows(results: RunResults) -> list[tuple]:
    rows = []
    for v in results.ran():
        totals = energy_totals(v)
        for component, (joules, provenance, source) in totals.items():
            rows += component_rows(v, component, joules, provenance, source)
        rows += total_rows(v, totals)
    return rows


def energy_csv(results: RunResults) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(HEADER)
    writer.writerows(energy_rows(results))
    return buffer.getvalue()
