"""The "Drafter data" page against files someone else wrote into the bucket: writing to storage is not the same right
as using Airflow, so nothing read from a version's files may run on Airflow's origin, and one bad file may not take
the page down. The files are a real published version and a real version being generated (the session's drafter
root), with every value replaced by a marker, then with every value a marker of another type."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from regen import catalog
from regen.drafter_page import page
from regen.storage import LocalStorage

PROFILE, DATASET = "kimi-k2.5-mini", "B1_glaive"
MARKER = "<img src=x onerror=alert(1)>\"'&"
FILES = ("manifest.json", "report.json", "progress.json", "prepare.json")


def hostile(value: Any, numbers: bool) -> Any:
    """Every string the marker, and the marker a key of every object (a reason, a verdict, a retry cause); with
    `numbers`, every number the marker too (a field of the wrong type)."""
    if isinstance(value, dict):
        return {**{key: hostile(v, numbers) for key, v in value.items()}, MARKER: 1}
    if isinstance(value, list):
        return [hostile(v, numbers) for v in value]
    if isinstance(value, str) or (numbers and isinstance(value, (int, float)) and not isinstance(value, bool)):
        return MARKER
    return value


def rewrite(root: Path, numbers: bool) -> int:
    """Every pipeline JSON file the page reads under the root, and the run reports, rewritten; how many."""
    count = 0
    for path in [*root.rglob("*.json")]:
        if path.name in FILES or path.parent.name == "runs":
            path.write_text(json.dumps(hostile(json.loads(path.read_text()), numbers)))
            count += 1
    return count


@pytest.mark.parametrize("numbers", [False, True], ids=["strings", "strings-and-numbers"])
def test_no_value_from_storage_reaches_the_page_unescaped(drafter_root: Path, tmp_path: Path, numbers: bool) -> None:
    root = tmp_path / "root"
    shutil.copytree(drafter_root, root)
    assert rewrite(root, numbers) >= 6  # manifests, reports, prepare records and a progress file
    storage = LocalStorage(root)
    rows = catalog.overview(storage, PROFILE, [DATASET, "B2_opencodeinstruct"])
    html = page(storage.root_uri, PROFILE, rows, catalog.in_progress(storage, PROFILE, [DATASET]), None)
    assert "<img" not in html and "onerror=alert(1)>" not in html  # the marker only ever appears escaped
    versions = [v for row in rows for v in row["versions"]]
    assert len(versions) == 4  # every version is a row, readable or not: B1_glaive 3, B2_opencodeinstruct 1
    if numbers:  # counts that are not numbers: each version is shown as unreadable, with why
        assert all(v["state"] == "unreadable" for v in versions) and html.count("cannot be read") == 4
    else:  # the marker did reach the page, in the published and the generating versions alike
        assert html.count("&lt;img src=x onerror=alert(1)&gt;") >= 5  # dates, profiles, reasons, verdicts, causes
        assert {v["state"] for v in versions} == {"published", "generating", "unpublished"}


def test_a_folder_that_is_no_version_is_skipped_and_the_rest_shown(drafter_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(drafter_root, root)
    (root / PROFILE / DATASET / "bad name").mkdir()
    (root / PROFILE / DATASET / "night-9").mkdir()
    (root / PROFILE / DATASET / "night-9" / "manifest.json").write_text("{not json")
    storage = LocalStorage(root)
    versions = {v["version"]: v for v in catalog.dataset_versions(storage, PROFILE, DATASET)}
    assert "bad name" not in versions and versions["night-9"]["state"] == "unreadable"
    assert {"night-1", "night-2", "night-3"} <= versions.keys()
    html = page(storage.root_uri, PROFILE, catalog.overview(storage, PROFILE, [DATASET]), [], None)
    assert "night-9" in html and "cannot be read" in html


def test_numbers_of_another_type_are_escaped_not_formatted(drafter_root: Path) -> None:
    """The reported vector: `retokenize_drift` counts (and every other number the page shows) as strings in a
    version's report, reaching the page through a catalog row, and a generating version's numbers likewise."""
    storage = LocalStorage(drafter_root)
    rows = catalog.overview(storage, PROFILE, [DATASET])
    runs = catalog.in_progress(storage, PROFILE, [DATASET])
    latest = rows[0]["latest"]
    numbers = ("records", "rejected", "truncation_rate", "tool_call_rate", "answered", "truncated")
    latest.update({name: MARKER for name in numbers})
    latest["retokenize_drift"] = {"sampled": MARKER, "drifted": MARKER}
    latest["cost"] = {"cached_share": MARKER, "gpu_hours": MARKER, "cost_per_million_train_tokens": MARKER}
    latest["tokens"] = {"prompt": MARKER, "output": MARKER}
    latest["histograms"] = {"output": {"counts": [MARKER], "edges": [0, MARKER]}}
    latest["verdicts"] = {MARKER: MARKER}
    for run in runs:
        run.update({name: MARKER for name in ("done", "prompts", "requests_per_s", "eta_s", "utilisation")})
        for shard in run["shards"]:
            shard.update({name: MARKER for name in ("done", "total", "requests_per_s", "eta_s", "in_flight")})
    html = page(storage.root_uri, PROFILE, rows, runs, None)
    assert "<img" not in html and html.count("&lt;img src=x onerror=alert(1)&gt;") >= 15
