"""This release on what an older one left (tests/data/releases/<commit>, made by make_release.py with that release's
library): its published version verifies and reads, its stopped version's Resume (the page's: datasets and version)
ends green with the version's own settings and the data an uninterrupted run of this release publishes, and the
nightly after it publishes a version of its own."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from regen.verify import verify_version
from tests.conftest import Simulator
from tests.contract.runs import run_dag
from tests.data.releases.make_release import BUCKET, config
from tools.devstack import moto_client

RELEASES = sorted(path for path in (Path(__file__).parents[1] / "data" / "releases").iterdir() if path.is_dir())
PROFILE = "kimi-k2.5-mini"


@pytest.fixture(params=RELEASES, ids=lambda path: path.name)
def deployment(
    request: pytest.FixtureRequest,
    s3_endpoint: str,
    simulator: Simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The older release's bucket, object for object, and this release's config of the same deployment."""
    client = moto_client(s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    files = request.param / "bucket"
    for path in sorted(p for p in files.rglob("*") if p.is_file()):
        client.put_object(Bucket=BUCKET, Key=str(path.relative_to(files)), Body=path.read_bytes())
    for name, value in {
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config(simulator.url)))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    yield client, json.loads((request.param / "release.json").read_text())
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for entry in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=entry["Key"])
    client.delete_bucket(Bucket=BUCKET)


def read(client: Any, uri: str) -> bytes:
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def manifest_of(client: Any, dataset: str, version: str) -> dict[str, Any]:
    return json.loads(read(client, f"s3://{BUCKET}/storage/{PROFILE}/{dataset}/{version}/manifest.json"))


def records(client: Any, manifest: dict[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """split -> sample id -> the record's token ids, of every published split."""
    out: dict[str, dict[str, list[Any]]] = {}
    for key in sorted(manifest["files"]):
        split = key.split("/")[-2]
        if split in ("train", "validation", "truncated") and key.endswith(".parquet"):
            table = pq.read_table(io.BytesIO(read(client, f"{manifest['root']}/{key}")))
            out.setdefault(split, {}).update({row["id"]: row["input_ids"] for row in table.to_pylist()})
    return out


def test_a_version_an_older_release_published_verifies_and_reads(deployment: tuple[Any, dict[str, Any]]) -> None:
    client, made = deployment
    for dataset in ("single", "chats"):
        manifest = manifest_of(client, dataset, made["published"])
        uri = f"s3://{BUCKET}/storage/{PROFILE}/{dataset}/{made['published']}/manifest.json"
        assert verify_version(uri).problems == [], made["release"]
        held = records(client, manifest)
        assert sum(len(split) for split in held.values()) == sum(manifest["splits"].values()) > 0
        latest = json.loads(read(client, f"s3://{BUCKET}/storage/{PROFILE}/{dataset}/latest.json"))
        assert latest["version"] == made["published"]


def test_a_version_an_older_release_stopped_is_resumed_green_with_its_own_settings_and_whole(
    deployment: tuple[Any, dict[str, Any]],
) -> None:
    """The page's Resume sends datasets and version only: the version keeps the share and temperature it was
    started with, and publishes what an uninterrupted run of this release at those settings publishes."""
    client, made = deployment
    stopped = made["stopped"]
    resumed = run_dag({"datasets": ["chats", "single"], "version": stopped["version"]}, "resume", now())
    assert resumed.green, resumed.errors
    fresh = run_dag({**stopped, "version": "fresh"}, "fresh", now())
    assert fresh.green, fresh.errors
    for dataset in ("single", "chats"):
        manifest = manifest_of(client, dataset, stopped["version"])
        assert manifest["validation_share"] == stopped["validation_share"]
        assert manifest["sampling_params"]["temperature"] == stopped["temperature"]
        uri = f"s3://{BUCKET}/storage/{PROFILE}/{dataset}/{stopped['version']}/manifest.json"
        assert verify_version(uri).problems == []
        assert records(client, manifest) == records(client, manifest_of(client, dataset, "fresh"))

    nightly = run_dag({}, "nightly", now())
    assert nightly.green, nightly.errors
    for dataset in ("single", "chats"):
        latest = json.loads(read(client, f"s3://{BUCKET}/storage/{PROFILE}/{dataset}/latest.json"))
        assert latest["version"] == nightly.version
        assert verify_version(latest["manifest"]).problems == []


def now() -> datetime:
    return datetime.now(UTC)
