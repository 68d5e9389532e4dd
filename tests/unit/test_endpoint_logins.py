"""An endpoint URL may carry a proxy's login (`http://user:pass@host`): every request to that server carries it as
basic auth, and it reaches nothing the pipeline writes or shows: published files (raw answers, rejection details),
logs, the run spec in XCom, the run report, error messages (and so alert mail), the trigger form and the fleet
view. Tested through a loopback proxy that checks the Authorization header before it passes a request to the
simulator."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
import zstandard

from regen import pipeline
from regen.chat import ChatRenderer
from regen.config import ConfigError, Sampling, load_config
from regen.endpoints import Endpoint, run_logins
from regen.run_params import RunSpec, form
from regen.run_report import IncompleteRun
from regen.sglang.auth import ApiKeys, MissingLogin, Unauthorized
from regen.sglang.fleet import FleetUnavailable
from regen.sglang.fleet_status import fleet_status
from regen.sglang.server_check import check_fleet
from regen.stages.generate.generate import GenerateSettings, run_generate
from tests.conftest import Simulator, free_port, prepare_sample, project_config_in
from tests.login_proxy import SECRET, USER, LoginProxy

SAMPLING = Sampling(max_new_tokens=64).as_params()


@pytest.fixture
def proxy(simulator: Simulator) -> Iterator[LoginProxy]:
    with LoginProxy(simulator.url) as running:
        yield running


def assert_nowhere(root: Path, *texts: str) -> None:
    """No file under root holds the secret, zstd-compressed ones read decompressed."""
    for path in (p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".zst":
            data = zstandard.ZstdDecompressor().stream_reader(data).read()
        for text in (SECRET, *texts):
            assert text.encode() not in data, f"{text!r} in {path}"


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(f"http://{USER}:{SECRET}@gpu-1:99999", id="bad-port"),
        pytest.param(f"http://{USER}:{SECRET}@gpu 1:30000", id="whitespace"),
        pytest.param(f"http://{USER}:pa {SECRET}@gpu-1:30000", id="whitespace-in-password"),
        pytest.param(f"http://{USER}:{SECRET}@gpu-1/x?y", id="query"),
        pytest.param(f"http://{USER}:p/{SECRET}@gpu-1:30000", id="slash-in-password"),
    ],
)
def test_a_refused_url_is_shown_without_its_login(url: str, tmp_roots_allowed: Path) -> None:
    with pytest.raises(ValueError) as refused:
        Endpoint.parse(url)
    assert SECRET not in str(refused.value) and "***@" in str(refused.value)
    with pytest.raises(ConfigError) as at_plan:  # a run's endpoints: plan's error (the task log, the alert mail)
        RunSpec.from_params({"endpoints": [url]}, "manual__1")
    assert SECRET not in str(at_plan.value) and SECRET not in repr(at_plan.value.__cause__)


def test_the_endpoint_keeps_its_login_apart() -> None:
    endpoint = Endpoint.parse("http://us%40er:p%3Ass@GPU-1:30000/")
    assert (endpoint.base, endpoint.address) == ("http://GPU-1:30000", "gpu-1:30000")
    assert endpoint.basic_auth() == ("us@er", "p:ss")
    assert str(endpoint) == "http://***@GPU-1:30000" and "p%3Ass" not in repr(endpoint)
    back = Endpoint.parse(str(endpoint))  # the redacted form read back: needs a login, carries none
    assert back.needs_login and back.login is None and back.basic_auth() is None


def test_the_login_goes_to_the_server_and_is_recorded_nowhere(
    proxy: LoginProxy, renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    [info] = check_fleet([proxy.with_login()], renderer, SAMPLING)
    [status] = fleet_status([proxy.with_login()])  # what the Drafter data page shows
    assert info["model_path"] == "kimi-k2.5-mini" and status["health"] == "ok"
    assert proxy.seen and all(ok for _, ok in proxy.seen)  # every request, /health included, carried the login
    assert info["url"] == status["url"] == proxy.url.replace("http://", "http://***@")
    assert SECRET not in json.dumps([info, status]) and SECRET not in caplog.text
    with pytest.raises(Unauthorized) as refused:
        check_fleet([proxy.with_login("wrong-pw")], renderer, SAMPLING, deadline_s=5)
    assert "user and password" in str(refused.value) and "wrong-pw" not in str(refused.value)


def test_generate_sends_the_login_and_publishes_it_nowhere(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    """Raw answers name their endpoint, and a refused request's rejection detail quotes its URL: neither the
    login."""
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 12, limit=12)
    [shard] = prepared.shards
    caplog.set_level(logging.INFO)
    with LoginProxy(simulator.url, refuse_every=4) as proxy:
        # A quarter refused: past the backstop's default share, which this test is not about.
        settings = GenerateSettings([proxy.with_login()], SAMPLING, concurrency=4, max_server_rejected_share=0.5)
        done = run_generate(shard, storage, settings)
    stats = done.stats["generate"]
    assert stats.kept > 0 and stats.dropped > 0 and stats.kept + stats.dropped == stats.total  # both sinks written
    assert all(ok for _, ok in proxy.seen)
    [line, *_] = storage.get_bytes(shard.keys.rejected("generate")).decode().splitlines()
    assert f"{proxy.url}: a refused prompt" in line  # requests go to the base URL, which holds no login
    assert_nowhere(tmp_path, USER)
    assert SECRET not in caplog.text


def test_an_unreachable_fleet_is_named_without_its_login(tmp_path: Path, renderer: ChatRenderer) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 4, limit=4)
    dead = f"http://{USER}:{SECRET}@127.0.0.1:{free_port()}"
    settings = GenerateSettings([dead], SAMPLING, max_attempts=2, fleet_wait_s=1, backoff_max_s=0.1)
    with pytest.raises(FleetUnavailable) as failed:
        run_generate(prepared.shards[0], storage, settings)
    assert SECRET not in str(failed.value) and "***@127.0.0.1" in str(failed.value)


@pytest.fixture
def deployment(tmp_path: Path, proxy: LoginProxy, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project's config with the proxy, login in its URL, as the default endpoint."""
    folder = tmp_path / "deployment"
    folder.mkdir()
    path = project_config_in(folder, allowed_storage_roots=[str(tmp_path)], allowed_endpoints=["127.0.0.1"])
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["endpoints"] = [proxy.with_login()]
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("REGEN_CONFIG", str(path))
    return tmp_path


@pytest.mark.parametrize("typed", [False, True], ids=["from-the-config", "typed-in-the-run"])
def test_a_run_plans_checks_and_reports_without_the_login(
    deployment: Path, proxy: LoginProxy, caplog: pytest.LogCaptureFixture, typed: bool
) -> None:
    """The run spec a task gets by XCom holds `***`; the task gets the login from the config or the run's params
    (regen_airflow.tasks.sglang_api_keys), and the fleet check and the run report written after it hold none."""
    config = load_config()
    defaults = form(config)
    assert defaults["endpoints"]["default"] == [proxy.url.replace("http://", "http://***@")]  # the trigger form
    params: dict[str, Any] = {"datasets": ["B1_glaive"], "storage_root": str(deployment / "store"), "limit": 4}
    params["endpoints"] = [proxy.with_login()] if typed else defaults["endpoints"]["default"]
    if typed:  # a login typed into the run, on a config whose own endpoint has none
        raw = yaml.safe_load(Path(str(config.base_dir / "regen.yaml")).read_text())
        raw["defaults"]["endpoints"] = [proxy.url]
        (config.base_dir / "regen.yaml").write_text(yaml.safe_dump(raw))
    caplog.set_level(logging.INFO)
    xcom = json.loads(json.dumps(pipeline.plan(params, "manual__1")))
    assert SECRET not in json.dumps(xcom) and xcom["endpoints"] == [proxy.url.replace("http://", "http://***@")]
    spec = RunSpec.model_validate(xcom)
    with pytest.raises(MissingLogin):  # a task given no login for it fails at once, saying where to give it
        pipeline.check_server(spec)
    keys = ApiKeys(logins=run_logins(load_config().defaults.endpoints, params["endpoints"]))
    fleet = pipeline.check_server(spec, keys)
    assert all(ok for _, ok in proxy.seen) and fleet[0]["model_path"] == "kimi-k2.5-mini"
    with pytest.raises(IncompleteRun) as incomplete:  # nothing published: the report is written, the run red
        pipeline.report(spec, [], fleet)
    assert SECRET not in str(incomplete.value)
    report = json.loads(next((deployment / "store").rglob("runs/*.json")).read_text())
    assert report["run"]["endpoints"] == xcom["endpoints"]
    assert_nowhere(deployment / "store")
    assert SECRET not in caplog.text


def test_a_stand_in_with_no_login_behind_it_is_refused_at_plan(tmp_roots_allowed: Path) -> None:
    with pytest.raises(ConfigError, match=r"'\*\*\*' stands for the login"):
        RunSpec.from_params({"endpoints": ["http://***@127.0.0.1:30000"]}, "manual__1")
