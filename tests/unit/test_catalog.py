"""The numbers behind the "Drafter data" page, read from a storage root as the pipeline leaves it: published
versions, a version generating (its progress file written by a real generate that was killed), and a comparison."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from regen import catalog
from regen.drafter_page import page
from regen.storage import LocalStorage

DATASET = "B1_glaive"
PROFILE = "kimi-k2.5-mini"


@pytest.fixture(scope="module")
def root(drafter_root: Path) -> LocalStorage:
    return LocalStorage(drafter_root)


def test_the_overview_lists_every_version_newest_first_with_its_numbers(root: LocalStorage) -> None:
    entry, never_generated = catalog.overview(root, PROFILE, [DATASET, "B2_opencodeinstruct"])
    assert never_generated["latest"] is None and [v["state"] for v in never_generated["versions"]] == ["unpublished"]
    assert [v["version"] for v in entry["versions"]] == ["night-3", "night-2", "night-1"]
    latest = entry["latest"]
    manifest = json.loads(root.get_bytes(f"{PROFILE}/{DATASET}/night-2/manifest.json"))
    report = json.loads(root.get_bytes(f"{PROFILE}/{DATASET}/night-2/report.json"))
    assert latest["version"] == "night-2" and latest["state"] == "published"
    assert latest["records"] == manifest["records"] > 0
    assert latest["answered"] == 20 == latest["records"] + latest["truncated"] + report["rejected_records"]
    assert latest["tokens"] == report["tokens"] and latest["tool_call_rate"] == report["tool_call_rate"]
    assert latest["template_sha256"] == manifest["profile"]["chat_template_sha256"]
    assert latest["run_id"] == "manual__night-2"
    assert sum(latest["histograms"]["output"]["counts"]) == latest["records"] + latest["truncated"]
    assert latest["manifest"].endswith("night-2/manifest.json") and latest["report"].endswith("report.html")


def test_a_version_being_generated_shows_its_shards_from_the_progress_files(root: LocalStorage) -> None:
    running, waiting = catalog.in_progress(root, PROFILE, [DATASET, "B2_opencodeinstruct"])
    assert waiting["shards"] == [{"shard": "shard-00000", "state": "waiting", "done": 0, "total": 10}]
    first, second = running["shards"]
    assert running["version"] == "night-3" and running["state"] == "generating"
    assert first == {"shard": "shard-00000", "state": "finished", "done": 10, "total": 10}
    assert second["state"] == "generating" and second["total"] == 10
    progress = json.loads(root.get_bytes(f"{PROFILE}/{DATASET}/night-3/raw/shard-00001/progress.json"))
    assert second["done"] == progress["done"] and 0 < progress["done"] < 10
    assert second["requests_per_s"] > 0 and second["eta_s"] is not None
    assert second["concurrency"] == 4 and running["prompts"] == 20
    assert running["done"] == 10 + second["done"]


def test_two_versions_side_by_side(root: LocalStorage) -> None:
    compared = catalog.compare(root, PROFILE, DATASET, "night-1", "night-2")
    assert compared["before"]["answered"] == 12 and compared["after"]["answered"] == 20
    assert compared["changes"]["records"] == compared["after"]["records"] - compared["before"]["records"]
    assert sum(v["before"] for v in compared["verdicts"]) == 12 and sum(v["after"] for v in compared["verdicts"]) == 20
    with pytest.raises(LookupError, match="night-3 is not a published version"):
        catalog.compare(root, PROFILE, DATASET, "night-1", "night-3")


def test_the_page_shows_the_numbers_plots_and_buttons(root: LocalStorage) -> None:
    rows = catalog.overview(root, PROFILE, [DATASET])
    compared = catalog.compare(root, PROFILE, DATASET, "night-1", "night-2")
    html = page(root.root_uri, PROFILE, rows, catalog.in_progress(root, PROFILE, [DATASET]), compared)
    latest = rows[0]["latest"]
    assert f'<td class="n records">{latest["records"]}</td>' in html
    assert html.count("<svg") >= 5  # two histograms and the verdicts per dataset, two histograms and verdicts compared
    confs = [json.loads(unescape(conf)) for conf in re.findall(r"data-conf='([^']*)'", html)]
    assert {"datasets": ["B1_glaive"]} in confs  # Regenerate
    assert {"datasets": ["B1_glaive"], "version": "night-3"} in confs  # Resume the unpublished version
    assert "compare=B1_glaive&amp;before=night-1&amp;after=night-2" in html
    assert 'href="../dags/eagle3_regen/runs/manual__night-2"' in html  # relative: found under a base_url prefix too
    assert "('/dags" not in html and "('/api" not in html and 'href="/dags' not in html
