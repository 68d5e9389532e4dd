"""Work the harness did again at every crash point with the same result, done once (docs/benchmarks.md, "Crash
points", says what each cost). Neither changes what a task writes or what the checks compare."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def memoised(folder: Path) -> Iterator[None]:
    """Until it exits: moto's list of its own modules read once (its server lists its package folder on every
    request, to match the Host header against it), and each dataset's report plots drawn once for the data they draw
    (a point's run publishes the reference run's data again: it is checked against it). The plots are kept in
    `folder`, so the tasks' forked processes share them."""
    from moto import backends

    from regen.stages.publish import dataset_report

    listed, plots = backends.list_of_moto_modules, dataset_report._plots
    modules = tuple(listed())
    backends.list_of_moto_modules = lambda: iter(modules)
    dataset_report._plots = _drawn_once(plots, folder / "plots")
    try:
        yield
    finally:
        backends.list_of_moto_modules, dataset_report._plots = listed, plots


def _drawn_once(plots: Any, folder: Path) -> Any:
    from regen.stages.publish import dataset_report

    def drawn(verdicts: Any, report: dict[str, Any]) -> dict[str, bytes]:
        # What the plots draw, and only that: a report's timings and costs differ from run to run.
        lengths = dataset_report._lengths(verdicts) if verdicts.num_rows else {}
        drawn_from = [{k: v.tolist() for k, v in lengths.items()}, report["verdicts"], report.get("vocab")]
        key = hashlib.sha256(json.dumps(drawn_from, sort_keys=True, default=str).encode()).hexdigest()
        kept = folder / f"{key}.pickle"
        if kept.exists():
            return pickle.loads(kept.read_bytes())
        pngs = plots(verdicts, report)
        folder.mkdir(exist_ok=True)
        temporary = kept.with_suffix(f".{os.getpid()}.tmp")  # a task killed mid-write leaves no half file to read
        temporary.write_bytes(pickle.dumps(pngs))
        temporary.replace(kept)
        return pngs

    return drawn
