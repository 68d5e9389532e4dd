"""A dataset becomes visible only when every shard finished, and manifest.json is the last thing written."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import msgspec
import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.layout import report_writer
from regen.manifest import PublishedManifest
from regen.stages.export import run_export
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.stages.publish.publish import IncompleteDataset, run_publish
from regen.stages.validate import run_validate
from regen.ui.documents import ManifestView
from tests.conftest import Simulator, prepare_sample


def test_publish_waits_for_every_shard_then_writes_the_manifest_last(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 20)
    location = prepared.location
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=8)

    finish = [
        run_export(run_validate(run_generate(s, storage, settings), storage, renderer), storage)
        for s in prepared.shards[:1]
    ]
    with pytest.raises(IncompleteDataset, match="shard-00001 did not finish"):
        run_publish(prepared, storage, fleet=[])
    assert not storage.exists(location.manifest)

    finish.append(
        run_export(run_validate(run_generate(prepared.shards[1], storage, settings), storage, renderer), storage)
    )
    summary = run_publish(prepared, storage, fleet=[{"url": simulator.url}], sampling_params=Sampling().as_params())
    manifest_path = Path(storage.uri(location.manifest))
    manifest = json.loads(manifest_path.read_text())
    assert summary["records"] == manifest["records"] == 36
    assert manifest["stages"]["generate"] == {"total": 36, "kept": 36, "dropped": 0, "dropped_by_reason": {}}
    assert manifest["token_roles"]["eos_ids"] == [163585, 163586]
    assert manifest["sampling_params"]["skip_special_tokens"] is False and manifest["sampling_params"]["no_stop_trim"]
    newest = max(Path(storage.uri(k)).stat().st_mtime_ns for k in storage.list_keys(location.prefix))
    assert manifest_path.stat().st_mtime_ns == newest
    for key, digest in manifest["files"].items():
        assert hashlib.sha256(storage.get_bytes(key)).hexdigest() == digest


def test_the_dataset_report_counts_every_stages_rejections_and_rounds_for_people(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """report.html's rejections are the manifest's, every stage's (prepare's too), and its figures are rounded;
    report.json keeps them exact."""
    import re

    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 40)
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=8)
    for shard in prepared.shards:
        run_export(run_validate(run_generate(shard, storage, settings), storage, renderer), storage)
    run_publish(prepared, storage, fleet=[])
    location = prepared.location
    manifest = json.loads(storage.get_bytes(location.manifest))
    writer = report_writer(manifest)
    report = json.loads(storage.get_bytes(location.report_file("report.json", writer)))
    page = storage.get_bytes(location.report_file("report.html", writer)).decode()
    by_stage = {
        "prepare": manifest["prepare"]["dropped"],
        **{s: manifest["stages"][s]["dropped"] for s in manifest["stages"]},
    }
    assert report["rejected_by_stage"] == by_stage and by_stage["prepare"] == 4
    assert f"{sum(by_stage.values())} rejected (prepare 4" in page
    cells = re.findall(r"<td>([0-9.,]+)</td>", page.split("Token lengths")[1].split("</table>")[0])
    assert cells and all(re.fullmatch(r"[0-9,]+\.[0-9]", c) for c in cells), cells  # one decimal, for people


def test_the_written_manifest_reads_back_typed_and_the_page_view_names_only_its_fields(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 6)
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=8)
    for shard in prepared.shards:
        run_export(run_validate(run_generate(shard, storage, settings), storage, renderer), storage)
    summary = run_publish(prepared, storage, fleet=[])
    body = storage.get_bytes(prepared.location.manifest)
    manifest = PublishedManifest.from_json(body)
    assert manifest.to_json() == body  # every field the publisher wrote is one the type knows
    assert (manifest.records, manifest.splits, manifest.stages) == (
        summary["records"],
        summary["splits"],
        summary["stages"],
    )
    assert manifest.report["html"] == summary["report"] and manifest.writer == report_writer(json.loads(body))
    page = msgspec.json.decode(body, type=ManifestView)
    assert set(ManifestView.__struct_fields__) <= {f.name for f in dataclasses.fields(PublishedManifest)}
    assert (page.records, page.run_id, page.report) == (manifest.records, manifest.run_id, manifest.report)


def test_a_manifest_from_an_earlier_version_reads_with_defaults() -> None:
    earlier = {
        "dataset": "d",
        "profile": {"name": "p"},
        "token_roles": {},
        "version": "v1",
        "root": "/r",
        "published_at": "2026-01-01T00:00:00+00:00",
        "run_id": None,
        "prepare": {},
        "stages": {},
        "records": 3,
        "splits": {"train": 3},
        "files": {"p/datasets/d/v1/shard-00000/train.jsonl": "ab"},
        "a_field_of_a_later_version": 1,
    }
    manifest = PublishedManifest.from_json(json.dumps(earlier))
    assert (manifest.writer, manifest.sizes, manifest.seeds_honoured) == (None, {}, None)
    assert manifest.data_files() == earlier["files"]


def test_a_manifest_with_a_field_of_the_wrong_type_is_refused_naming_it() -> None:
    written = json.loads(PublishedManifest("d", {}, {}, "v1", "/r", "2026-01-01", {}, {}, 3).to_json())
    with pytest.raises(ValueError, match=r"Expected `int`, got `str` - at `\$\.records`"):
        PublishedManifest.from_json(json.dumps({**written, "records": "3"}))
    with pytest.raises(ValueError, match=r"missing required field `version`"):
        PublishedManifest.from_json(json.dumps({k: v for k, v in written.items() if k != "version"}))
