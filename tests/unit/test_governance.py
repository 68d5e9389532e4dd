"""Who may trigger may publish: a run's endpoints and storage root must be within the deployment's allowlists, checked
at plan before anything is sent or written; a router cannot send the page's fleet view anywhere."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from regen import pipeline
from regen.config import ConfigError, load_config
from regen.governance import NotAllowed, endpoint_address, endpoint_allowed, storage_root_within
from regen.sglang.fleet_status import NOT_ASKED, ask_fleet
from regen.storage import StorageRoot, open_storage
from tests.conftest import ROOT
from tools.devstack import Simulator


@pytest.mark.parametrize(
    "url,address",
    [
        ("http://127.0.0.1:30000", "127.0.0.1:30000"),
        ("https://SGLang.Internal", "sglang.internal:443"),
        ("http://gpu-1", "gpu-1:80"),
        ("http://user:secret@gpu-1:30000", "gpu-1:30000"),
        ("http://[::1]:30000", "[::1]:30000"),
        ("http://gw.internal/sglang", "gw.internal:80"),  # a base path behind a gateway is a base URL too
    ],
)
def test_an_endpoint_is_its_host_and_port(url: str, address: str) -> None:
    assert endpoint_address(url) == address


@pytest.mark.parametrize(
    "url,why",
    [
        ("http://evil.example/x?", "without '\\?' or '#'"),  # /generate appended would become the query
        ("http://evil.example/#", "without '\\?' or '#'"),
        ("ftp://gpu-1", "http:// or https://"),
        ("localhost:30000", "http:// or https://"),
        ("http://gpu-1:99999", "port"),
        ("http:///generate", "names no host"),
        ("http://gpu 1:30000", "whitespace"),
    ],
)
def test_what_is_not_a_base_url_is_refused_with_why(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        endpoint_address(url)


def test_patterns_match_host_and_port_shell_style() -> None:
    patterns = ["sglang-*.internal:30000", "10.0.0.*", "[::1]:30000"]
    assert endpoint_allowed("http://sglang-7.internal:30000", patterns)
    assert not endpoint_allowed("http://sglang-7.internal:30001", patterns)  # the port is part of the rule
    assert endpoint_allowed("http://10.0.0.9:8080", patterns)  # no port in the pattern: any port
    assert not endpoint_allowed("http://10.0.1.9:8080", patterns)
    assert endpoint_allowed("http://[::1]:30000", patterns)
    assert not endpoint_allowed("http://sglang-7.internal.evil.example:30000", patterns)


def test_a_storage_root_is_within_folder_by_folder(tmp_path: Path) -> None:
    def within(root: str, allowed: str) -> bool:
        return storage_root_within(StorageRoot.parse(root), StorageRoot.parse(allowed))

    assert within("s3://data/eagle3/nightly", "s3://data/eagle3")
    assert within("s3://data/eagle3", "s3://data/eagle3")
    assert not within("s3://data/eagle30", "s3://data/eagle3")
    assert not within("s3://other/eagle3", "s3://data/eagle3")
    assert not within(str(tmp_path), "s3://data")
    assert within(str(tmp_path / "a" / "b"), str(tmp_path / "a"))
    assert not within(str(tmp_path / "a" / ".." / "b"), str(tmp_path / "a"))  # `..` is followed
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert not within(str(tmp_path / "a" / "link"), str(tmp_path / "a"))  # and so are links


def deployment(folder: Path, **governance: list[str]) -> Path:
    config = {
        "defaults": {"endpoints": ["http://sglang-1.internal:30000"], "storage_root": "store"},
        "datasets": {"B1_glaive": {"paths": [str(ROOT / "data" / "samples" / "B1_glaive.jsonl")]}},
        **({"governance": governance} if governance else {}),
    }
    path = folder / "regen.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "params,rule",
    [
        pytest.param({"endpoints": ["http://exfiltrate.example:30000"]}, "allowed_endpoints", id="elsewhere"),
        pytest.param({"endpoints": ["http://sglang-1.internal:22"]}, "allowed_endpoints", id="another-port"),
        pytest.param({"endpoints": ["http://sglang-1.internal:30000/admin?"]}, "without '\\?'", id="query"),
        pytest.param({"storage_root": "/"}, "allowed_storage_roots", id="root"),
        pytest.param({"storage_root": "s3://someone-elses-bucket"}, "allowed_storage_roots", id="bucket"),
        pytest.param({"storage_root": "store/../../escape"}, "allowed_storage_roots", id="dot-dot"),
    ],
)
def test_by_default_a_run_may_use_only_the_configs_own_fleet_and_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, params: dict[str, Any], rule: str
) -> None:
    """Nothing is written: the plan fails before its write probe, in seconds, as a user error (never retried)."""
    monkeypatch.setenv("REGEN_CONFIG", str(deployment(tmp_path)))
    before = sorted(tmp_path.rglob("*"))
    started = time.monotonic()
    with pytest.raises((ConfigError, NotAllowed), match=rule):
        pipeline.plan(params, "manual__1")
    assert time.monotonic() - started < 30
    assert sorted(tmp_path.rglob("*")) == before


def test_the_allowlists_widen_what_a_run_may_choose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "REGEN_CONFIG",
        str(
            deployment(tmp_path, allowed_endpoints=["sglang-*.internal:30000"], allowed_storage_roots=["runs", "store"])
        ),
    )
    run = pipeline.RunSpec.from_params(
        {"endpoints": ["http://sglang-2.internal:30000"], "storage_root": "runs/nightly"}, "manual__1"
    )
    assert str(run.storage_root) == str(tmp_path / "runs" / "nightly")
    with pytest.raises(NotAllowed, match="allowed_storage_roots"):  # a list replaces the default
        pipeline.RunSpec.from_params({"storage_root": "elsewhere"}, "manual__1")


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("s3://data/eagle3/", "s3://data/eagle3"),
        ("S3://data/eagle3", "s3://data/eagle3"),  # URI schemes are case-insensitive: this is S3, checked as S3
        ("s3://data", "s3://data"),
        ("file:///srv/regen", "/srv/regen"),
        ("FILE://localhost/srv/regen", "/srv/regen"),
        ("file:/srv/regen", "/srv/regen"),
        ("/srv/regen/./a/../b", "/srv/regen/b"),
    ],
)
def test_a_storage_root_is_parsed_once_into_what_storage_opens(text: str, canonical: str) -> None:
    root = StorageRoot.parse(text)
    assert str(root) == canonical and StorageRoot.parse(str(root)) == root
    assert open_storage(root, s3_client=object()).root_uri == canonical


@pytest.mark.parametrize(
    "text,why",
    [
        ("s3:/data/eagle3", "write s3://bucket/prefix"),
        ("s3:data", "write s3://bucket/prefix"),
        ("s3:///eagle3", "not an S3 bucket"),
        ("s3://Data/eagle3", "not an S3 bucket"),
        ("s3://data/a/../b", "not folders on S3"),
        ("s3://data/a//b", "not folders on S3"),
        ("file:relative/dir", "absolute path"),
        ("file://elsewhere.example/srv", "this machine"),
        ("gs://data/eagle3", "only s3://"),
        ("store:2024", "write it as ./name"),
    ],
)
def test_what_is_not_plainly_a_storage_root_is_refused_with_what_to_write(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        StorageRoot.parse(text)
    with pytest.raises(ValueError, match=why):
        open_storage(text)


OUTSIDE = "outside"


@pytest.mark.parametrize(
    "root",
    [
        pytest.param("file://{outside}", id="file-uri"),
        pytest.param("FILE://{outside}", id="file-uri-upper-case"),
        pytest.param("file:{outside}", id="file-colon"),
        pytest.param("S3://other-bucket/p", id="s3-upper-case"),
        pytest.param("s3:/other-bucket/p", id="s3-one-slash"),
        pytest.param("file:outside", id="file-relative"),
        pytest.param("../outside", id="dot-dot"),
        pytest.param("{allowed}/link", id="symlink"),
    ],
)
def test_a_planted_root_writes_no_byte_outside_the_allowlist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_client: Any, s3_endpoint: str, root: str
) -> None:
    """The worker's working directory lies in the allowed root, where a spelling read as a relative local path
    would pass: every planted root is refused at plan, in seconds, and nothing appears outside the allowed root,
    on disk or in another bucket."""
    monkeypatch.setenv("REGEN_CONFIG", str(deployment(tmp_path)))
    allowed, outside = tmp_path / "store", tmp_path / OUTSIDE
    allowed.mkdir()
    (allowed / "link").symlink_to(outside, target_is_directory=True)
    monkeypatch.chdir(allowed)
    s3_client.create_bucket(Bucket="other-bucket")
    # boto3's own default client reaches the same S3 (as a worker's environment credentials would)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    started = time.monotonic()
    with pytest.raises((ConfigError, NotAllowed)):
        pipeline.plan({"storage_root": root.format(outside=outside, allowed=allowed)}, "manual__1", lambda: s3_client)
    assert time.monotonic() - started < 30
    assert not outside.exists()
    assert s3_client.list_objects_v2(Bucket="other-bucket").get("KeyCount") == 0
    assert sorted(p.name for p in allowed.iterdir()) == ["link"]


def test_a_link_made_after_plan_checked_the_root_is_refused_when_a_task_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan checked store/nightly; then store/nightly became a link to a folder outside: the task that opens the
    root refuses it rather than write where the allowlist never allowed."""
    monkeypatch.setenv("REGEN_CONFIG", str(deployment(tmp_path)))
    run = pipeline.RunSpec(**pipeline.plan({"storage_root": "store/nightly"}, "manual__1"))
    outside = tmp_path / OUTSIDE
    outside.mkdir()
    (tmp_path / "store" / "nightly").rmdir()
    (tmp_path / "store" / "nightly").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="a link made since it was checked"):
        pipeline.prepare_dataset(run, "B1_glaive")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    "edit,message",
    [
        pytest.param(("sglang-1.internal:30000", "sglang-1.internal:30000/?"), "defaults.endpoints", id="not-a-base"),
        pytest.param(("allowed_endpoints: []", "allowed_endpoints: [gpu-*]"), "allow them too", id="fleet-outside"),
        pytest.param(
            ("allowed_storage_roots: []", "allowed_storage_roots: [s3://bucket-b]"), "allow it too", id="root"
        ),
    ],
)
def test_a_config_at_odds_with_itself_fails_to_load(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = deployment(tmp_path, allowed_endpoints=[], allowed_storage_roots=[])
    path.write_text(path.read_text().replace(*edit))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_router_cannot_send_the_fleet_view_anywhere(simulator: Simulator) -> None:
    """The page asks the fleet from Airflow's API server: a router's /workers names a worker the allowlist does not
    hold (an internal service), and that worker is listed, never asked."""

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        hits = 0

        async def internal(request: web.Request) -> web.Response:
            nonlocal hits
            hits += 1
            return web.json_response({})

        inside = web.Application()
        inside.router.add_route("GET", "/{tail:.*}", internal)
        async with TestServer(inside, host="127.0.0.1") as hidden:
            hidden_url = str(hidden.make_url("")).rstrip("/")

            async def workers(request: web.Request) -> web.Response:
                listed = [{"url": url, "is_healthy": True, "metadata": {}} for url in (simulator.url, hidden_url)]
                return web.json_response({"workers": listed})

            async def server_info(request: web.Request) -> web.Response:
                return web.json_response({"router_manager": True})

            async def healthy(request: web.Request) -> web.Response:
                return web.Response(status=200)

            router = web.Application()
            router.router.add_get("/get_server_info", server_info)
            router.router.add_get("/health_generate", healthy)
            router.router.add_get("/workers", workers)
            async with TestServer(router, host="127.0.0.1") as front:
                router_url = str(front.make_url("")).rstrip("/")
                allowed = [endpoint_address(router_url), endpoint_address(simulator.url)]
                found = await ask_fleet([router_url], may_ask=lambda url: endpoint_allowed(url, allowed))
        return found, hits

    [status], hits = asyncio.run(scenario())
    assert hits == 0
    assert status["error"] is None and status["running_requests"] is None  # one worker's load is unknown
    assert [w.get("asked") for w in status["workers"]] == [None, NOT_ASKED]
