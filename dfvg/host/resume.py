"""Resuming an interrupted experiment: completed repetitions are kept and a rerun of the same command reuses them.

Owns: the progress area `<results root>/.<name>.progress/<key>/`, where `key` hashes everything that
decides what is measured (the experiment config, less the name of the file it came from). After each
completed repetition the measurements of all repetitions so far (every variant's generations, energy
and GPU samples) are pickled to a temp file and renamed over `completed.pkl`, so a Ctrl-C or a kill leaves
either the previous state or the new one, never half of one. A rerun with the same arguments restores
them and starts at the next repetition; once the reports are written the area is removed. A state that
cannot be read back (written by another DFVG version) is ignored and its repetitions run again.

The pickle is a private cache of this machine's own run, read only from the results root the run writes to.

Does not own: the order of work (`dfvg.host.experiments`), writing the reports (`dfvg.reports`).

Example: `run_all.py ... --num-runs 5 --tag t` stopped during repetition 3 leaves `results/.t.progress/<key>/
completed.pkl` holding repetitions 1-2 and no `results/t-*/`; the same command again prints
"resuming: 2 of 5 repetitions restored ..." on stderr, runs repetitions 3-5 and writes `results/t-<time>/`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

from dfvg.host.experiment_config import ExperimentConfig
from dfvg.host.records import VariantResult

FORMAT = 1  # bump when the pickled state changes shape
STATE = "completed.pkl"
KEPT = ("generations", "energy", "gpu_samples")  # the measured parts of a VariantResult


def config_key(cfg: ExperimentConfig) -> str:
    """A short hash of everything that decides what a run measures (not the file name it came from)."""
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "source"}
    text = json.dumps({"format": FORMAT, **fields}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Progress:
    """The progress area of one experiment config under one results root."""

    directory: Path
    num_runs: int

    @classmethod
    def of(cls, cfg: ExperimentConfig, root: Path) -> Progress:
        return cls(Path(root) / f".{cfg.name}.progress" / config_key(cfg), cfg.num_runs)

    def restore(self, variants: dict[str, VariantResult]) -> int:
        """Fill `variants` with the saved repetitions; returns how many repetitions they hold (0: none)."""
        try:
            state = pickle.loads((self.directory / STATE).read_bytes())
            done, saved = state["runs_done"], state["variants"]
            if set(saved) != set(variants) or not 0 < done < self.num_runs:
                return 0
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, KeyError, TypeError):
            return 0  # nothing saved, or saved by another version: run everything again
        for name, parts in saved.items():
            for part in KEPT:
                setattr(variants[name], part, parts[part])
        print(f"resuming: {done} of {self.num_runs} repetitions restored from {self.directory}", file=sys.stderr)
        return done

    def save(self, runs_done: int, variants: dict[str, VariantResult]) -> None:
        """Persist the first `runs_done` repetitions atomically (temp file + rename); the last is not needed."""
        if runs_done >= self.num_runs:
            return  # the reports are about to be written; nothing left to resume
        state = {"runs_done": runs_done,
                 "variants": {name: {part: getattr(v, part) for part in KEPT} for name, v in variants.items()}}
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{STATE}.tmp-{os.getpid()}"
        try:
            tmp.write_bytes(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(tmp, self.directory / STATE)
        finally:
            tmp.unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove this config's progress, and the experiment's progress folder when nothing else is in it."""
        shutil.rmtree(self.directory, ignore_errors=True)
        try:
            self.directory.parent.rmdir()
        except OSError:
            pass  # another config of the same name keeps its progress
