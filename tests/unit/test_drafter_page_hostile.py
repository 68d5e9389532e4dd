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

from regen.storage import LocalStorage
from regen.ui.catalog import Catalog
from regen.ui.page import page

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
            document = json.loads(path.read_text())
            rewritten = hostile(document, numbers)
            if path.name == "manifest.json":  # its report's folder: a name keys are made of, checked like a version's
                rewritten["report"]["writer"] = document["report"]["writer"]
            path.write_text(json.dumps(rewritten))
            count += 1
    return count


@pytest.mark.parametrize("numbers", [False, True], ids=["strings", "strings-and-numbers"])
def test_no_value_from_storage_reaches_the_page_unescaped(drafter_root: Path, tmp_path: Path, numbers: bool) -> None:
    root = tmp_path / "root"
    shutil.copytree(drafter_root, root)
    assert rewrite(root, numbers) >= 6  # manifests, reports, prepare records and a progress file
    catalog = Catalog(LocalStorage(root), PROFILE)
    overview = catalog.overview([DATASET, "B2_opencodeinstruct"])
    html = page(catalog.storage.root_uri, PROFILE, overview)
    assert "<img" not in html and "onerror=alert(1)>" not in html  # the marker only ever appears escaped
    versions = [v for row in overview.datasets for v in [row["latest"], *row["versions"]] if v is not None]
    assert len(versions) == 4  # every version is a row, readable or not: B1_glaive 3, B2_opencodeinstruct 1
    # each version asked for on its own (its report, or its shards), and two compared
    for v in versions:
        detail = catalog.version(v["dataset"], v["version"])
        shown = page(catalog.storage.root_uri, PROFILE, overview, version=detail)
        assert "<img" not in shown and "onerror=alert(1)>" not in shown
    if numbers:  # counts that are not numbers: each version is shown as unreadable, with why
        assert all(v["state"] == "unreadable" for v in versions) and html.count("cannot be read") == 4
        with pytest.raises(LookupError):
            catalog.compare(DATASET, "night-1", "night-2")
    else:  # the marker did reach the page, in the published and the generating versions alike
        assert html.count("&lt;img src=x onerror=alert(1)&gt;") >= 5  # dates, profiles, reasons, verdicts, causes
        assert {v["state"] for v in versions} == {"published", "generating", "unpublished"}
        comparison = catalog.compare(DATASET, "night-1", "night-2")
        compared = page(catalog.storage.root_uri, PROFILE, overview, comparison=comparison)
        escaped = "&lt;img src=x onerror=alert(1)&gt;"
        assert "<img" not in compared and compared.count(escaped) > html.count(escaped)  # lengths, verdicts


def test_a_folder_that_is_no_version_is_skipped_and_the_rest_shown(drafter_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(drafter_root, root)
    (root / PROFILE / DATASET / "bad name").mkdir()
    (root / PROFILE / DATASET / "night-9").mkdir()
    (root / PROFILE / DATASET / "night-9" / "manifest.json").write_text("{not json")
    catalog = Catalog(LocalStorage(root), PROFILE)
    assert catalog.versions(DATASET) == ["night-9", "night-3", "night-2", "night-1"]
    overview = catalog.overview([DATASET])
    versions = {v["version"]: v for v in overview.datasets[0]["versions"]}
    assert versions["night-9"]["state"] == "unreadable" and {"night-1", "night-3"} <= versions.keys()
    html = page(catalog.storage.root_uri, PROFILE, overview)
    assert "night-9" in html and "cannot be read" in html


@pytest.mark.parametrize(
    "latest",
    [
        pytest.param({"version": MARKER}, id="a-name-no-version-has"),
        pytest.param({"version": "../../elsewhere"}, id="a-path-out-of-the-dataset"),
        pytest.param({"version": "night-3"}, id="an-unpublished-version"),
        pytest.param([MARKER], id="not-an-object"),
    ],
)
def test_a_latest_json_that_names_no_published_version_is_ignored(
    drafter_root: Path, tmp_path: Path, latest: Any
) -> None:
    root = tmp_path / "root"
    shutil.copytree(drafter_root, root)
    (root / PROFILE / DATASET / "latest.json").write_text(json.dumps(latest))
    catalog = Catalog(LocalStorage(root), PROFILE)
    [entry] = catalog.overview([DATASET]).datasets
    assert entry["latest"] is None and entry["previous"] is None
    assert [v["version"] for v in entry["versions"]] == ["night-3", "night-2", "night-1"]
    html = page(catalog.storage.root_uri, PROFILE, catalog.overview([DATASET]))
    assert "no published version" in html and "<img" not in html


def test_numbers_of_another_type_are_escaped_not_formatted(drafter_root: Path) -> None:
    """The reported vector: `retokenize_drift` counts (and every other number the page shows) as strings in a
    version's report, reaching the page through a catalog row, and a generating version's numbers likewise."""
    catalog = Catalog(LocalStorage(drafter_root), PROFILE)
    overview = catalog.overview([DATASET])
    latest = dict(overview.datasets[0]["latest"])  # a copy: the catalog's rows are not the test's to change
    overview.datasets[0]["latest"] = latest
    numbers = ("records", "rejected", "truncation_rate", "tool_call_rate", "answered", "truncated")
    latest.update({name: MARKER for name in numbers})
    latest["retokenize_drift"] = {"sampled": MARKER, "drifted": MARKER}
    latest["cost"] = {"cached_share": MARKER, "gpu_hours": MARKER, "cost_per_million_train_tokens": MARKER}
    latest["tokens"] = {"prompt": MARKER, "output": MARKER}
    latest["histograms"] = {"output": {"counts": [MARKER], "edges": [0, MARKER]}}
    latest["verdicts"] = {MARKER: MARKER}
    latest["template_sha256"] = 12345678901234567890  # a number where a string belongs
    for run in overview.runs:
        run.update({name: MARKER for name in ("done", "prompts", "requests_per_s", "eta_s", "utilization")})
        for shard in run["shards"]:
            shard.update({name: MARKER for name in ("done", "total", "requests_per_s", "eta_s", "in_flight")})
    html = page(catalog.storage.root_uri, PROFILE, overview, version=latest)
    assert "<img" not in html and html.count("&lt;img src=x onerror=alert(1)&gt;") >= 15
    assert "123456789012" in html
