"""A server that answers with a malformed header or a 502, on any route the fleet check and the client use: the
login of its URL and the fleet's API key, which every request carried, appear in no log record, no exception message
and no alert (log line or mail). aiohttp's `ClientResponseError` repr carries the request's headers, so a message
that formats one (`{e!r}`, `%r`) would show `Authorization: Basic ...` or `Bearer ...`."""

from __future__ import annotations

import base64
import logging
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.config import AlertsConfig, Sampling
from regen.sglang.auth import ApiKeys
from regen.sglang.server_check import check_fleet
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen_airflow.alerts import failure_message, failure_notifiers
from tests.conftest import Simulator, prepare_sample
from tests.faulty_server import FaultyServer

SAMPLING = Sampling(max_new_tokens=64).as_params()
USER, PASSWORD, KEY = "alice", "fault-pw-4a91", "sk-fault-key-77c2"
SECRETS = {
    "login": (PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()),
    "api-key": (KEY,),
}
# Every route the fleet check asks (a router's among them), as (route, the server says it is a router).
CHECK_ROUTES = [
    pytest.param("/health", False, id="health"),
    pytest.param("/get_server_info", False, id="get_server_info"),
    pytest.param("/server_info", False, id="server_info"),
    pytest.param("/get_model_info", False, id="get_model_info"),
    pytest.param("/model_info", False, id="model_info"),
    pytest.param("/health_generate", True, id="router-health_generate"),
    pytest.param("/worker/get_server_info", True, id="router-worker-server_info"),
    pytest.param("/generate", False, id="generate-probe"),
]
FAULTS = ["malformed", "502"]
CREDENTIALS = list(SECRETS)


def where_and_keys(server: FaultyServer, credential: str) -> tuple[str, ApiKeys]:
    if credential == "login":
        return f"http://{USER}:{PASSWORD}@127.0.0.1:{server.port}", ApiKeys()
    return server.url, ApiKeys(KEY)


def texts_shown(error: BaseException | None, caplog: pytest.LogCaptureFixture) -> list[str]:
    """What leaves the process: every log record (its message and traceback), every message in the exception's
    chain and its traceback, and the alert's log line and mail."""
    shown = [caplog.text, *(record.getMessage() for record in caplog.records)]
    if error is not None:
        shown += traceback.format_exception(error)
        chained: BaseException | None = error
        while chained is not None:
            shown.append(str(chained))
            chained = chained.__cause__ or chained.__context__
        ti = SimpleNamespace(task_id="check_server", rendered_map_index=None, run_id="manual__1", try_number=1)
        context: dict[str, Any] = {"ti": ti, "run_id": ti.run_id, "exception": error, "dag": None}
        [_, mail] = failure_notifiers(AlertsConfig(email_to=["oncall@example.org"]))
        mail.render_template_fields(context)
        shown += [failure_message(context), mail.subject, mail.html_content]
    return shown


def assert_no_secret(credential: str, server: FaultyServer, route: str, shown: list[str]) -> None:
    assert any(path == route for path, _ in server.authorizations), f"{route} was never asked"
    assert all(auth for _, auth in server.authorizations)  # every request carried the secret
    for secret in SECRETS[credential]:
        for text in shown:
            assert secret not in text, f"{secret!r} shown: {text[:2000]}"


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("route,router", CHECK_ROUTES)
def test_a_faulty_answer_to_the_fleet_check_shows_no_secret(
    simulator: Simulator,
    renderer: ChatRenderer,
    caplog: pytest.LogCaptureFixture,
    route: str,
    router: bool,
    fault: str,
    credential: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    error: BaseException | None = None
    with FaultyServer(simulator.url, route, fault, router) as server:
        url, keys = where_and_keys(server, credential)
        try:
            check_fleet([url], renderer, SAMPLING, deadline_s=1, api_keys=keys)
        except Exception as e:
            error = e
    if route != "/worker/get_server_info":  # a worker this process cannot ask is a warning, not a failure
        assert error is not None
    assert_no_secret(credential, server, route, texts_shown(error, caplog))


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_answer_to_generate_shows_no_secret(
    tmp_path: Path,
    simulator: Simulator,
    renderer: ChatRenderer,
    caplog: pytest.LogCaptureFixture,
    fault: str,
    credential: str,
) -> None:
    """A shard's requests: whether the shard fails or rejects its samples, nothing it logs, raises or writes shows
    the secret."""
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 4, limit=4)
    caplog.set_level(logging.DEBUG)
    error: BaseException | None = None
    with FaultyServer(simulator.url, "/generate", fault) as server:
        url, keys = where_and_keys(server, credential)
        settings = GenerateSettings([url], SAMPLING, max_attempts=2, fleet_wait_s=1, backoff_max_s=0.1, api_keys=keys)
        try:
            run_generate(prepared.shards[0], storage, settings)
        except Exception as e:
            error = e
    written = [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert_no_secret(credential, server, "/generate", [*texts_shown(error, caplog), *written])
