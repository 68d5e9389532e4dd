"""The numbers behind the "Drafter data" page, read from a storage root as the pipeline leaves it: published
versions, a version generating (its progress file written by a real generate that was killed), and a comparison;
and how much of the root a load reads: one page of versions, one listing per version being made, nothing of an
abandoned one, no file past the cap."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from regen.layout import DatasetLocation, report_writer, version_from_run_id
from regen.storage import LocalStorage, S3Storage
from regen.ui.caches import PublishedSummaries
from regen.ui.catalog import Catalog, Limits, newest_first
from regen.ui.page import page
from tests.conftest import CountingStorage

DATASET = "B1_glaive"
PROFILE = "kimi-k2.5-mini"
DATASETS = [DATASET, "B2_opencodeinstruct"]
DAY = 86400.0


def report_key(root: LocalStorage, version: str, name: str = "report.json") -> str:
    """Where a published version's report file is: in the folder of the publisher its manifest names."""
    manifest = json.loads(root.get_bytes(f"{PROFILE}/{DATASET}/{version}/manifest.json"))
    return DatasetLocation("", PROFILE, DATASET, version).report_file(name, report_writer(manifest))


@pytest.fixture(scope="module")
def root(drafter_root: Path) -> LocalStorage:
    return LocalStorage(drafter_root)


@pytest.fixture
def copy(drafter_root: Path, tmp_path: Path) -> Path:
    """The session's root, copied: a test may age or grow it."""
    shutil.copytree(drafter_root, tmp_path / "root")
    return tmp_path / "root"


def test_the_overview_shows_the_latest_in_full_and_the_others_from_their_manifests(root: LocalStorage) -> None:
    entry, never_generated = Catalog(root, PROFILE).overview(DATASETS).datasets
    assert never_generated["latest"] is None and [v["state"] for v in never_generated["versions"]] == ["unpublished"]
    assert [v["version"] for v in entry["versions"]] == ["night-3", "night-1"]  # the latest is not repeated
    assert (entry["others"], entry["pages"], entry["previous"]) == (2, 1, "night-1")
    latest = entry["latest"]
    manifest = json.loads(root.get_bytes(f"{PROFILE}/{DATASET}/night-2/manifest.json"))
    report = json.loads(root.get_bytes(report_key(root, "night-2")))
    assert latest["version"] == "night-2" and (latest["state"], latest["detail"]) == ("published", "full")
    assert latest["records"] == manifest["records"] > 0
    assert latest["answered"] == 20 == latest["records"] + latest["truncated"] + report["rejected_records"]
    assert latest["tokens"] == report["tokens"] and latest["tool_call_rate"] == report["tool_call_rate"]
    assert latest["template_sha256"] == manifest["profile"]["chat_template_sha256"]
    assert latest["run_id"] == "manual__night-2"
    assert sum(latest["histograms"]["output"]["counts"]) == latest["records"] + latest["truncated"]
    assert latest["manifest"].endswith("night-2/manifest.json") and latest["report"].endswith("report.html")
    older = entry["versions"][1]  # from its manifest alone: its report is read when asked for
    night_1 = json.loads(root.get_bytes(f"{PROFILE}/{DATASET}/night-1/manifest.json"))
    assert (older["detail"], older["records"], older["histograms"], older["answered"]) == (
        "manifest",
        night_1["records"],
        {},
        None,
    )
    assert older["retokenize_drift"] == night_1["retokenize_drift"]


def test_a_versions_report_is_read_when_asked_for(root: LocalStorage) -> None:
    counting = CountingStorage(root)
    night_1 = Catalog(counting, PROFILE).version(DATASET, "night-1")  # type: ignore[arg-type]
    report = json.loads(root.get_bytes(report_key(root, "night-1")))
    assert night_1["detail"] == "full" and night_1["histograms"] == report["histograms"]
    assert night_1["verdicts"] == report["verdicts"] and night_1["answered"] == 12
    assert [k.rsplit("/", 1)[1] for k in counting.asked("read_start")] == ["manifest.json", "report.json"]
    with pytest.raises(LookupError, match="night-9 is not a version"):
        Catalog(root, PROFILE).version(DATASET, "night-9")


@pytest.mark.parametrize(
    "run_ids,undated",
    [
        pytest.param(
            [
                "scheduled__2026-12-02T00:00:00+00:00",
                "asset_triggered__2026-12-01T10:00:00+00:00",  # its prefix sorts first; its time does not
                "manual__2026-12-01T02:08:36.123456+00:00",
                "manual__2026-12-01T02:08:36.000007+00:00",
                "backfill__2026-11-30T00:00:00+00:00",
            ],
            ["v2", "night-10", "night-9"],  # given by hand: after the dated ones, in natural order
            id="airflow-run-ids",
        )
    ],
)
def test_versions_are_ordered_newest_first_by_the_time_in_their_names(run_ids: list[str], undated: list[str]) -> None:
    newest = [version_from_run_id(run_id) for run_id in run_ids] + undated
    assert newest[2] == "manual__2026-12-01T02-08-36.123456-00-00"  # the storage-safe form the order reads
    assert newest_first(reversed(newest)) == newest
    assert newest_first(sorted(newest)) == newest


def _grow(root: Path, count: int) -> list[str]:
    """`count` published versions named after daily scheduled runs (night-1's manifest and report in each), the
    newest the dataset's latest; their names newest first."""
    source = root / PROFILE / DATASET / "night-1"
    report = report_key(LocalStorage(root), "night-1").split("/night-1/", 1)[1]  # report/{writer}/report.json
    names = [
        version_from_run_id(f"scheduled__2026-{1 + d // 28:02d}-{1 + d % 28:02d}T00:00:00+00:00") for d in range(count)
    ]
    for name in names:
        (root / PROFILE / DATASET / name / report).parent.mkdir(parents=True)
        for file in ("manifest.json", report):
            shutil.copy(source / file, root / PROFILE / DATASET / name / file)
    latest = json.loads((root / PROFILE / DATASET / "latest.json").read_text()) | {"version": names[-1]}
    (root / PROFILE / DATASET / "latest.json").write_text(json.dumps(latest))
    return names[::-1]


def test_one_page_of_versions_is_read_and_no_more(copy: Path) -> None:
    newest = _grow(copy, 45)  # and night-1..3, undated: last
    counting = CountingStorage(LocalStorage(copy))
    catalog = Catalog(counting, PROFILE, published=PublishedSummaries())  # type: ignore[arg-type]
    [entry] = catalog.overview([DATASET], page=0).datasets
    others = [*newest[1:], "night-3", "night-2", "night-1"]
    assert entry["latest"]["version"] == newest[0] and entry["previous"] == newest[1]
    assert [v["version"] for v in entry["versions"]] == others[:20]
    assert (entry["others"], entry["pages"]) == (47, 3)
    read = counting.asked("read_start")
    expected = [f"{PROFILE}/{DATASET}/latest.json", *(f"{PROFILE}/{DATASET}/{v}/manifest.json" for v in newest[:21])]
    assert sorted(read) == sorted([*expected, report_key(LocalStorage(copy), newest[0])])  # each once
    assert counting.asked("folders") == [f"{PROFILE}/{DATASET}/"] and not counting.asked("list_objects")

    [last] = catalog.overview([DATASET], page=2).datasets
    assert [v["version"] for v in last["versions"]] == others[40:]
    assert [v["state"] for v in last["versions"]] == ["published"] * 4 + ["generating", "published", "published"]
    [beyond] = catalog.overview([DATASET], page=9).datasets
    assert beyond["versions"] == [] and beyond["latest"]["version"] == newest[0]


def test_a_version_being_generated_is_read_from_one_listing(root: LocalStorage) -> None:
    counting = CountingStorage(root)
    overview = Catalog(counting, PROFILE).overview(DATASETS)  # type: ignore[arg-type]
    running, waiting = overview.runs
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
    files = Path(root.uri(f"{PROFILE}/{DATASET}/night-3")).rglob("*")
    assert running["last_activity"] == max(p.stat().st_mtime for p in files if p.is_file())
    # one listing per unpublished version, and of its shards' files only the generating shard's progress is read
    assert sorted(counting.asked("list_objects")) == [
        f"{PROFILE}/{DATASET}/night-3/",
        f"{PROFILE}/B2_opencodeinstruct/night-3/",
    ]
    assert [k for k in counting.asked("read_start") if "/raw/" in k or "/reports/" in k] == [
        f"{PROFILE}/{DATASET}/night-3/raw/shard-00001/progress.json"
    ]
    assert not counting.asked("exists") and not counting.asked("get_bytes")
    assert "shards" not in overview.datasets[0]["versions"][0]  # the datasets' rows keep the totals only


def _age(folder: Path, seconds: float, only: str | None = None) -> None:
    """Every file under `folder` (or only those named `only`) last written `seconds` ago."""
    then = time.time() - seconds
    for path in folder.rglob(only or "*"):
        if path.is_file():
            os.utime(path, (then, then))


def test_an_idle_version_is_abandoned_and_its_shards_not_read(copy: Path) -> None:
    _age(copy / PROFILE / DATASET / "night-3", 2 * DAY)
    counting = CountingStorage(LocalStorage(copy))
    overview = Catalog(counting, PROFILE).overview(DATASETS)  # type: ignore[arg-type]
    night_3 = overview.datasets[0]["versions"][0]
    assert (night_3["version"], night_3["state"], night_3["done"]) == ("night-3", "abandoned", 10)
    assert night_3["idle_s"] == pytest.approx(2 * DAY, abs=60)
    assert [(r["dataset"], r["version"]) for r in overview.runs] == [("B2_opencodeinstruct", "night-3")]
    assert not [k for k in counting.asked("read_start") if "/night-3/raw/" in k]  # no progress file read
    # a day is the default; a deployment may wait longer before giving a version up
    patient = Catalog(LocalStorage(copy), PROFILE, Limits(abandoned_after_s=3 * DAY)).overview([DATASET])
    assert [r["state"] for r in patient.runs] == ["generating"]
    assert patient.runs[0]["shards"][1]["done"] > 0  # its progress file is read again


def test_a_shard_whose_progress_stopped_long_ago_is_stalled_not_read(copy: Path) -> None:
    _age(copy / PROFILE / DATASET / "night-3", 2 * DAY, only="progress.json")  # the rest written lately
    counting = CountingStorage(LocalStorage(copy))
    [run] = Catalog(counting, PROFILE).overview([DATASET]).runs  # type: ignore[arg-type]
    assert run["state"] == "unpublished" and run["shards"][1]["state"] == "stalled"
    assert run["shards"][1]["done"] is None and run["done"] == 10
    assert not [k for k in counting.asked("read_start") if k.endswith("progress.json")]


def test_a_file_past_the_cap_is_not_read_whole_and_its_version_says_why(copy: Path) -> None:
    counting = CountingStorage(LocalStorage(copy))
    tight = Catalog(counting, PROFILE, Limits(index_file_bytes=1000))  # type: ignore[arg-type]
    [entry] = tight.overview([DATASET]).datasets
    assert (
        entry["latest"]["state"] == "unreadable"
        and "manifest.json is larger than 1,000 bytes" in entry["latest"]["error"]
    )
    assert {size for _, size in counting.arguments("read_start")} <= {1001, Limits().small_file_bytes + 1}
    (copy / report_key(LocalStorage(copy), "night-1")).write_bytes(b" " * (4 * 2**20 + 1))
    night_1 = Catalog(LocalStorage(copy), PROFILE).version(DATASET, "night-1")
    assert night_1["state"] == "unreadable" and "report.json is larger than 4,194,304 bytes" in night_1["error"]


def test_published_summaries_are_kept_between_loads_and_read_once(root: LocalStorage) -> None:
    kept = PublishedSummaries()
    counting = CountingStorage(root)
    Catalog(counting, PROFILE, published=kept).overview([DATASET])  # type: ignore[arg-type]
    first = len(counting.asked("read_start"))
    counting.calls.clear()
    Catalog(counting, PROFILE, published=kept).overview([DATASET])  # type: ignore[arg-type]
    again = [k.rsplit("/", 2)[-2:] for k in counting.asked("read_start")]
    # latest.json moves and unpublished versions change: read again; the published versions' files are not
    assert sorted(again) == [
        ["B1_glaive", "latest.json"],
        ["night-3", "manifest.json"],
        ["prompts", "prepare.json"],
        ["shard-00001", "progress.json"],
    ]
    assert first > len(again)


def test_two_versions_side_by_side(root: LocalStorage) -> None:
    compared = Catalog(root, PROFILE).compare(DATASET, "night-1", "night-2")
    assert compared["before"]["answered"] == 12 and compared["after"]["answered"] == 20
    assert compared["changes"]["records"] == compared["after"]["records"] - compared["before"]["records"]
    assert sum(v["before"] for v in compared["verdicts"]) == 12 and sum(v["after"] for v in compared["verdicts"]) == 20
    with pytest.raises(LookupError, match="night-3 is not a published version"):
        Catalog(root, PROFILE).compare(DATASET, "night-1", "night-3")


def test_the_catalog_reads_s3_as_it_reads_a_directory(root: LocalStorage, drafter_root: Path, s3_client: Any) -> None:
    s3_client.create_bucket(Bucket="drafter")
    bucket = S3Storage("drafter", "some/prefix", s3_client)
    for path in drafter_root.rglob("*"):
        if path.is_file():
            bucket.put_bytes(path.relative_to(drafter_root).as_posix(), path.read_bytes())

    def shown(storage: Any) -> Any:
        overview = Catalog(storage, PROFILE).overview(DATASETS)
        rows = [
            {k: v for k, v in row.items() if k not in ("manifest", "report", "last_activity", "idle_s")}
            for d in overview.datasets
            for row in [d["latest"] or {}, *d["versions"]]
        ]
        runs = [(r["version"], r["state"], r["done"], [s["state"] for s in r["shards"]]) for r in overview.runs]
        return rows, runs

    assert shown(bucket) == shown(root)
    assert Catalog(bucket, PROFILE).version(DATASET, "night-2")["manifest"] == (
        "s3://drafter/some/prefix/kimi-k2.5-mini/B1_glaive/night-2/manifest.json"
    )


def test_the_page_shows_the_numbers_plots_and_buttons(root: LocalStorage) -> None:
    catalog = Catalog(root, PROFILE)
    overview = catalog.overview([DATASET])
    compared = catalog.compare(DATASET, "night-1", "night-2")
    html = page(root.root_uri, PROFILE, overview, comparison=compared, version=catalog.version(DATASET, "night-1"))
    latest = overview.datasets[0]["latest"]
    assert f'<td class="n records">{latest["records"]}</td>' in html
    assert html.count("<svg") >= 8  # per dataset, the version asked for, and compared: two histograms and verdicts
    vocab = json.loads(root.get_bytes(f"{PROFILE}/{DATASET}/{latest['version']}/manifest.json"))["vocab"]
    assert latest["vocab"] == vocab  # the draft vocabulary's coverage, plotted over draft sizes
    assert f"draft vocabulary: 32000 ids cover {100 * vocab['coverage']:.1f}% of answer tokens" in html
    assert html.count(" ids: ") >= len(vocab["coverage_curve"])  # a bar per size, its figure in its title
    confs = [json.loads(unescape(conf)) for conf in re.findall(r"data-conf='([^']*)'", html)]
    assert {"datasets": ["B1_glaive"]} in confs  # Regenerate
    assert {"datasets": ["B1_glaive"], "version": "night-3"} in confs  # Resume the unpublished version
    assert "compare=B1_glaive&amp;before=night-1&amp;after=night-2#compare" in html
    assert "dataset=B1_glaive&amp;version=night-1#version" in html  # the report of an older version, on demand
    assert 'href="../dags/eagle3_regen/runs/manual__night-2"' in html  # relative: found under a base_url prefix too
    assert 'href="files/kimi-k2.5-mini/B1_glaive/night-2/manifest.json"' in html  # through the plugin, not a path
    assert 'href="files/kimi-k2.5-mini/B1_glaive/night-2/report.html"' in html
    assert root.root_uri + "/" not in html.split("</p>", 1)[1]  # no bare storage path as a link
    assert "('/dags" not in html and "('/api" not in html and 'href="/' not in html
