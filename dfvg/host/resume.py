"""Resuming an interrupted experiment: completed repetitions are kept and a rerun of the same command reuses them.

Owns: the progress area `<results root>/.<name>.progress/<key>/`, where `key` hashes everything that
decides what is measured (the experiment config, less the name of the file it came from). After each
completed repetition the measurements of all repetitions so far (every variant's generations, energy
and GPU samples) are pickled to a temp file and renamed over `completed.pkl`, so a Ctrl-C or a kill leaves
either the previous state or the new one, never half of one. A rerun with the same arguments restores
them and starts at the next repetition; once the reports are written the area is removed. A state that
cannot be read back (written by another DFVG version) is ignored and its repetitions run again.

Killed with `kill -9` at any moment, a run leaves at most this progress area and hidden temporaries
(`dfvg.outputs`): the reports appear in one rename. Just before that rename `finishing` records the
report folder's name; a kill between the rename and `clear` thus leaves a finished report, and the rerun
returns it instead of measuring the last repetition again.

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
import pickle
import shutil
import sys
from pathlib import Path

from dfvg.host.experiment_config import ExperimentConfig
from dfvg.host.records import VariantResult
from dfvg.outputs import atomic_write

FORMAT = 1  # bump when the pickled state changes shape
STATE = "completed.pkl"
FINISHED = "finished.json"  # the report folder's name, written just before the folder appears
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
        atomic_write(self.directory / STATE, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))

    def finishing(self, run_dir: Path) -> None:
        """Record the report folder about to appear (the whole run is measured; only the rename is left)."""
        atomic_write(self.directory / FINISHED, json.dumps({"run_dir": run_dir.name}))

    def finished(self, root: Path) -> Path | None:
        """The report folder of an earlier run of this command that was killed after writing it, or None."""
        try:
            run_dir = Path(root) / json.loads((self.directory / FINISHED).read_text())["run_dir"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if run_dir.is_dir():
            return run_dir
        (self.directory / FINISHED).unlink(missing_ok=True)  # killed before the rename: resume instead
        return None

    def clear(self) -> None:
        """Remove this config's progress, and the experiment's progress folder when nothing else is in it.
        The saved repetitions go first, the finished mark last: a kill in between still finds the report."""
        (self.directory / STATE).unlink(missing_ok=True)
        shutil.rmtree(self.directory, ignore_errors=True)
        try:
            self.directory.parent.rmdir()
        except OSError:
            pass  # another config of the same name keeps its progress
