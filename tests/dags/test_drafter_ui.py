"""The "Drafter data" plugin's endpoints, inside Airflow's own API server app (its auth, its plugin loading), over a
storage root with published, generating and never-generated versions: the right numbers, and no answer without a
signed-in user."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.layout import DatasetLocation, report_writer
from tests.conftest import Simulator
from tests.dags.conftest import USERS

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ["B1_glaive", "B2_opencodeinstruct"]
ENDPOINTS = [
    "/drafter/",
    "/drafter/api/datasets",
    "/drafter/api/runs",
    "/drafter/api/fleet",
    "/drafter/api/version?dataset=B1_glaive&version=night-2",
    "/drafter/api/compare?dataset=B1_glaive&before=night-1&after=night-2",
    "/drafter/files/kimi-k2.5-mini/B1_glaive/night-2/manifest.json",
    "/drafter/files/kimi-k2.5-mini/B1_glaive/night-2/report.html",
]


@pytest.fixture(scope="module")
def client(drafter_root: Path, simulator: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from airflow.api_fastapi.app import create_app
    from airflow.utils import db
    from fastapi.testclient import TestClient

    from regen.config import load_config

    shipped = load_config()
    config = {
        "defaults": {"storage_root": str(drafter_root), "endpoints": [simulator.url, "http://127.0.0.1:9"]},
        "datasets": {
            name: {
                **shipped.datasets[name].model_dump(mode="json", exclude_none=True),
                "paths": [shipped.resolve(p) for p in shipped.datasets[name].paths or []],
            }
            for name in DATASETS
        },
    }
    path = tmp_path_factory.mktemp("deployment") / "regen.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REGEN_CONFIG", str(path))
        db.initdb()  # the API server's metadata DB (SQLite in this test's Airflow home)
        with TestClient(create_app()) as client:
            yield client


@pytest.fixture(scope="module")
def token(client: Any) -> dict[str, str]:
    answer = client.post("/auth/token", json={"username": "reader", "password": USERS["reader"]})
    assert answer.status_code == 201
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_an_anonymous_request_is_refused(client: Any, endpoint: str) -> None:
    assert client.get(endpoint).status_code == 401
    assert client.get(endpoint, headers={"Authorization": "Bearer not-a-token"}).status_code == 403


@pytest.mark.parametrize(
    "route", ["/drafter/docs", "/drafter/redoc", "/drafter/openapi.json", "/drafter/docs/oauth2-redirect"]
)
def test_fastapis_docs_and_schema_are_not_served(client: Any, token: dict[str, str], route: str) -> None:
    """FastAPI adds these outside the app's dependencies, so served at all they would answer anyone."""
    assert client.get(route).status_code == 404
    assert client.get(route, headers=token).status_code == 404


def test_the_datasets_with_their_published_versions(client: Any, token: dict[str, str], drafter_root: Path) -> None:
    answer = client.get("/drafter/api/datasets", headers=token)
    assert answer.status_code == 200
    glaive, code = answer.json()
    manifest = json.loads((drafter_root / "kimi-k2.5-mini/B1_glaive/night-2/manifest.json").read_text())
    assert glaive["dataset"] == "B1_glaive" and glaive["latest"]["version"] == "night-2"
    assert glaive["latest"]["records"] == manifest["records"]
    assert [v["version"] for v in glaive["versions"]] == ["night-3", "night-1"]  # the other versions, newest first
    assert code["latest"] is None and code["versions"][0]["state"] == "unpublished"
    assert client.get("/drafter/api/datasets", params={"page": 1}, headers=token).json()[0]["versions"] == []
    assert client.get("/drafter/api/datasets", params={"page": -1}, headers=token).status_code == 422
    assert "aws" not in answer.text.lower() and "secret" not in answer.text.lower()


def test_the_page_and_its_json_share_one_scan(client: Any, token: dict[str, str]) -> None:
    """/api/datasets, /api/runs and the page, asked together: the bucket is scanned once."""
    from concurrent.futures import ThreadPoolExecutor

    from regen.ui.catalog import Catalog

    scans: list[int] = []
    scan = Catalog.overview

    def counted(self: Catalog, datasets: list[str], page: int = 0) -> Any:
        scans.append(page)
        return scan(self, datasets, page)

    paths = ["/drafter/api/datasets", "/drafter/api/runs", "/drafter/", "/drafter/api/datasets"]
    with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(4) as pool:
        patch.setattr(Catalog, "overview", counted)
        answers = list(pool.map(lambda path: client.get(path, params={"page": 7}, headers=token), paths))
    assert [a.status_code for a in answers] == [200] * 4 and scans == [7]


def test_the_runs_in_progress_shard_by_shard(client: Any, token: dict[str, str]) -> None:
    running, waiting = client.get("/drafter/api/runs", headers=token).json()
    assert (running["dataset"], running["state"]) == ("B1_glaive", "generating")
    assert [s["state"] for s in running["shards"]] == ["finished", "generating"]
    assert 10 < running["done"] < 20 and waiting["done"] == 0


def test_two_versions_compared_and_a_wrong_one_named(client: Any, token: dict[str, str]) -> None:
    query = {"dataset": "B1_glaive", "before": "night-1", "after": "night-2"}
    compared = client.get("/drafter/api/compare", params=query, headers=token).json()
    assert (compared["before"]["answered"], compared["after"]["answered"]) == (12, 20)
    wrong = client.get("/drafter/api/compare", params={**query, "after": "night-9"}, headers=token)
    assert wrong.status_code == 404 and "night-9 is not a published version" in wrong.json()["detail"]


def report_path(root: Path, version: str, name: str) -> Path:
    """A published version's viewable file; the report's in the folder of the publisher its manifest names."""
    manifest = json.loads((root / "kimi-k2.5-mini/B1_glaive" / version / "manifest.json").read_text())
    location = DatasetLocation("", "kimi-k2.5-mini", "B1_glaive", version)
    return root / location.viewable_file(name, report_writer(manifest))


def test_a_versions_report_is_read_on_demand(client: Any, token: dict[str, str], drafter_root: Path) -> None:
    night_1 = client.get("/drafter/api/version", params={"dataset": "B1_glaive", "version": "night-1"}, headers=token)
    report = json.loads(report_path(drafter_root, "night-1", "report.json").read_text())
    assert night_1.status_code == 200 and night_1.json()["histograms"] == report["histograms"]
    running = client.get("/drafter/api/version", params={"dataset": "B1_glaive", "version": "night-3"}, headers=token)
    assert [s["state"] for s in running.json()["shards"]] == ["finished", "generating"]
    for dataset, version in [("B1_glaive", "night-9"), ("B1_glaive", "../night-1"), ("B9_unknown", "night-1")]:
        query = {"dataset": dataset, "version": version}
        assert client.get("/drafter/api/version", params=query, headers=token).status_code == 404
    page = client.get("/drafter/", params={"dataset": "B1_glaive", "version": "night-1"}, headers=token)
    assert '<section id="version">' in page.text and page.text.count("<svg") >= 6


@pytest.mark.parametrize(
    "name,content_type",
    [
        ("manifest.json", "application/json"),
        ("report.json", "application/json"),
        ("report.html", "text/html; charset=utf-8"),
        ("lengths.png", "image/png"),
        ("verdicts.png", "image/png"),
    ],
)
def test_a_versions_files_are_served_to_a_signed_in_user(
    client: Any, token: dict[str, str], drafter_root: Path, name: str, content_type: str
) -> None:
    answer = client.get(f"/drafter/files/kimi-k2.5-mini/B1_glaive/night-2/{name}", headers=token)
    assert answer.status_code == 200 and answer.headers["content-type"] == content_type
    assert answer.content == report_path(drafter_root, "night-2", name).read_bytes()
    # written by whoever may write to the bucket: shown sandboxed (no script runs on Airflow's origin), never sniffed
    assert answer.headers["content-security-policy"] == "sandbox"
    assert answer.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "path",
    [
        "kimi-k2.5-mini/B1_glaive/night-2/prompts%2Fprepare.json",  # a file of the version that is not for viewing
        "kimi-k2.5-mini/B1_glaive/night-2/..%2F..%2Flatest.json",
        "kimi-k2.5-mini/B1_glaive/..%2Fnight-2/manifest.json",
        "kimi-k2.5-mini/B1_glaive/night-2/%2Fetc%2Fpasswd",
        "kimi-k2.5-mini/B1_glaive/%2Fetc/manifest.json",
        "kimi-k2.5-mini/B1_glaive/night-2/train/shard-00000.parquet",
        "kimi-k2.5-mini/B1_glaive/night-2/raw.jsonl",
        "kimi-k2.5-mini/B1_glaive/night-3/manifest.json",  # not published: no manifest
        "kimi-k2.5-mini/B1_glaive/night-2/..",
        "kimi-k2.5-mini/..%2F..%2F..%2Fetc/night-2/manifest.json",
        "kimi-k2.5/B1_glaive/night-2/manifest.json",  # another profile's folder: nothing there
        "not-a-profile/B1_glaive/night-2/manifest.json",
        "kimi-k2.5-mini/not_configured/night-2/manifest.json",
    ],
)
def test_nothing_but_a_versions_viewable_files_is_served(client: Any, token: dict[str, str], path: str) -> None:
    answer = client.get(f"/drafter/files/{path}", headers=token)
    assert answer.status_code == 404, answer.text[:200]
    assert b"root:" not in answer.content


def test_the_fleet_is_asked_now_and_a_dead_endpoint_says_so(
    client: Any, token: dict[str, str], simulator: Simulator
) -> None:
    alive, dead = client.get("/drafter/api/fleet", headers=token).json()
    assert alive["url"] == simulator.url and alive["health"] == "ok" and alive["error"] is None
    assert alive["model"] == "kimi-k2.5-mini" and alive["max_running_requests"] > 0
    assert alive["running_requests"] == 0 and alive["context_length"] > 0
    assert dead["url"] == "http://127.0.0.1:9" and "ClientConnectorError" in dead["error"]


def test_the_page_renders_for_a_signed_in_user(client: Any, token: dict[str, str]) -> None:
    page = client.get("/drafter/", headers=token)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "Drafter data" in page.text and page.text.count("<svg") >= 3
    assert 'href="files/kimi-k2.5-mini/B1_glaive/night-2/report.html"' in page.text  # served by this app


def test_the_plugin_adds_the_page_to_the_navigation(client: Any, token: dict[str, str]) -> None:
    plugins = client.get("/api/v2/plugins", headers=token).json()["plugins"]
    [ours] = [p for p in plugins if p["name"] == "eagle3_regen"]
    assert [(v["name"], v["href"], v["destination"]) for v in ours["external_views"]] == [
        ("Drafter data", "/drafter/", "nav")
    ]
    assert [app["url_prefix"] for app in ours["fastapi_apps"]] == ["/drafter"]
