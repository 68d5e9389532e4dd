"""The fleet check: readiness from /health, the served model against the profile, a validated probe answer."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.sglang.fleet import FleetUnavailable, NothingListens
from regen.sglang.parity import PROVEN_SGLANG_VERSION
from regen.sglang.server_check import (
    ServerMismatch,
    WorkerInfo,
    check_fleet,
    fleet_capacity,
    fleet_context_length,
    fleet_version,
    model_matches,
    router_workers,
)
from tests.conftest import Simulator, free_port, start_simulator

SAMPLING = Sampling().as_params()


def test_a_ready_fleet_is_recorded(simulator: Simulator, renderer: ChatRenderer) -> None:
    [info] = check_fleet([simulator.url], renderer, SAMPLING)
    assert info["model_path"] == "kimi-k2.5-mini"
    assert info["version"] == PROVEN_SGLANG_VERSION and info["context_length"] == 16384
    assert info["max_running_requests"] == 256
    assert info["probe_output_tokens"] > 0
    assert info["router"] is False and info["workers"] == []


def test_credentials_in_an_endpoint_url_are_never_shown_or_recorded(
    simulator: Simulator, renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    """A URL may carry a proxy's user and password: it is used as given, and shown (logs, XCom, manifests, the
    page's fleet) as `***@host`."""
    import logging

    from regen.sglang.fleet_status import fleet_status

    url = simulator.url.replace("http://", "http://alice:s3cret@")
    caplog.set_level(logging.INFO)
    [info] = check_fleet([url], renderer, SAMPLING)
    assert info["url"] == simulator.url.replace("http://", "http://***@") and info["model_path"] == "kimi-k2.5-mini"
    [status] = fleet_status([url])
    assert status["url"] == info["url"] and status["health"] == "ok"
    assert "s3cret" not in caplog.text and "alice" not in caplog.text and "127.0.0.1" in caplog.text
    dead = f"http://bob:hunter2@127.0.0.1:{free_port()}"
    with pytest.raises(FleetUnavailable) as failed:
        check_fleet([dead], renderer, SAMPLING, deadline_s=5)
    assert "hunter2" not in str(failed.value) and "hunter2" not in caplog.text


def test_waits_for_warm_up_and_says_so(
    tmp_path: Path, renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    warming = start_simulator(tmp_path, "--warmup-s", "2")
    try:
        with caplog.at_level(logging.INFO, logger="regen.sglang.client"):
            [info] = check_fleet([warming.url], renderer, SAMPLING, deadline_s=30)
    finally:
        warming.stop()
    assert info["model_path"] == "kimi-k2.5-mini"
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    wait = rf"waiting for {re.escape(warming.url)}/health to answer 200: \d+s of 30s so far, last: HTTP 503"
    assert waits and all(re.fullmatch(wait, w) for w in waits), waits


def test_a_server_that_never_gets_ready_fails_at_the_deadline(tmp_path: Path, renderer: ChatRenderer) -> None:
    warming = start_simulator(tmp_path, "--warmup-s", "60")
    try:
        with pytest.raises(FleetUnavailable, match=r"/health not ready after 1s \(last: HTTP 503\)"):
            check_fleet([warming.url], renderer, SAMPLING, deadline_s=1)
    finally:
        warming.stop()


def test_the_wrong_model_fails_with_what_differs(simulator: Simulator, renderer: ChatRenderer) -> None:
    other = ChatRenderer.__new__(ChatRenderer)
    other.__dict__.update(renderer.__dict__)
    other.profile = renderer.profile.replaced(served_model_names=("moonshotai/Kimi-K2.5",))
    expected = r"serves 'kimi-k2.5-mini' \(its --served-model-name\), but profile .* expects one of"
    with pytest.raises(ServerMismatch, match=expected):
        check_fleet([simulator.url], other, SAMPLING)


def test_an_endpoint_where_nothing_listens_fails_in_seconds(renderer: ChatRenderer) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(NothingListens, match=rf"^{re.escape(url)}: nothing listens there \(connection refused: "):
        check_fleet([url], renderer, SAMPLING, deadline_s=600)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "served,ok",
    [
        pytest.param("moonshotai/Kimi-K2.5", True, id="hub-id"),
        pytest.param("/models/moonshotai/Kimi-K2.5/", True, id="local-path"),
        pytest.param("/models/Kimi-K2-Thinking", False, id="other-model"),
        pytest.param("Kimi-K2.5-FP8-extra", False, id="prefix-only"),
    ],
)
def test_model_matching(served: str, ok: bool) -> None:
    assert model_matches(served, ("moonshotai/Kimi-K2.5", "Kimi-K2.5")) is ok


BAD_SERVERS = [
    pytest.param(["--text-tokenizer-mismatch"], r"tokenizer mismatch: .*first difference at char \d+", id="tokenizer"),
    pytest.param(
        ["--defect-prompt-tokens-mismatch-rate", "1"],
        r"unusable \(prompt_tokens_mismatch: sent \d+ prompt ids",
        id="miscounts-the-prompt",
    ),
    pytest.param(  # short answers, so that the probe's token budget does not cut the runaway off
        ["--defect-runaway-turn-rate", "1", "--min-tokens", "4", "--max-tokens", "8"],
        r"every probe answer failed validation: \['role_token_in_output",
        id="model-always-runs-on",
    ),
    pytest.param(  # the fleet reads calls with another detector than the one validation follows
        ["--tool-call-parser", "deepseekv31"],
        r"started with tool_call_parser 'deepseekv31' \(the profile names 'kimi_k2'\).*--tool-call-parser kimi_k2",
        id="other-tool-call-parser",
    ),
    pytest.param(
        ["--reasoning-parser", "deepseek-r1"],
        r"reasoning_parser 'deepseek-r1' \(the profile names 'kimi_k2'\)",
        id="other-reasoning-parser",
    ),
    pytest.param(["--tool-call-parser", ""], r"tool_call_parser None \(the profile names 'kimi_k2'\)", id="no-parser"),
]


@pytest.mark.parametrize("args,message", BAD_SERVERS)
def test_a_bad_server_fails_the_check_with_what_is_wrong(
    tmp_path: Path, renderer: ChatRenderer, args: list[str], message: str
) -> None:
    bad = start_simulator(tmp_path, *args)
    try:
        with pytest.raises(ServerMismatch, match=message):
            check_fleet([bad.url], renderer, SAMPLING)
    finally:
        bad.stop()


# /workers as sglang-router 0.3.2 answers it in front of two simulators (trimmed to the fields read).
WORKERS = {
    "workers": [
        {
            "url": "http://127.0.0.1:31001",
            "model_id": "kimi-k2.5-mini",
            "is_healthy": True,
            "load": 0,
            "metadata": {"served_model_name": "kimi-k2.5-mini", "model_path": "kimi-k2.5-mini", "tp_size": "8"},
        },
        {"url": "http://127.0.0.1:31002/", "model_id": "unknown", "is_healthy": False, "load": 0, "metadata": {}},
    ],
    "total": 2,
}


def test_the_workers_behind_a_router() -> None:
    assert router_workers(WORKERS) == [
        WorkerInfo("http://127.0.0.1:31001", "kimi-k2.5-mini", True),
        WorkerInfo("http://127.0.0.1:31002", "", False),  # no metadata: judged by the probe alone
    ]


@pytest.mark.parametrize(
    "slots,capacity",
    [
        pytest.param([(True, 256), (True, 128)], 384, id="all-known"),
        pytest.param([(True, 256), (False, None)], 256, id="an-unhealthy-worker-adds-nothing"),
        pytest.param([(True, 256), (True, None)], None, id="one-unknown"),
        pytest.param([(False, 256)], None, id="none-healthy"),
    ],
)
def test_fleet_capacity(slots: list[tuple[bool, int | None]], capacity: int | None) -> None:
    workers = [WorkerInfo(f"http://w{i}", "m", healthy, slots) for i, (healthy, slots) in enumerate(slots)]
    assert fleet_capacity(workers) == capacity


def test_a_fleet_reports_its_smallest_context_and_each_version_once() -> None:
    workers = [
        WorkerInfo("http://a", "m", True, 8, "0.5.9", 262144),
        WorkerInfo("http://b", "m", True, 8, "0.5.9", 131072),
        WorkerInfo("http://c", "m", True, 8, "0.5.10", None),
    ]
    assert fleet_context_length(workers) == 131072
    assert fleet_version(workers) == "0.5.10, 0.5.9"


def test_the_served_model_is_known_by_its_served_name_not_its_folder(
    tmp_path: Path, renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    """As production launches SGLang: `--model-path /models/<a folder> --served-model-name <the profile's name>`.
    Judged by model_path, this fleet failed ("serves '/models/...', but profile ... expects ...")."""
    folder = tmp_path / "models" / "snapshot-3367c8d"
    sim = start_simulator(tmp_path, "--model-path", str(folder), "--served-model-name", "kimi-k2.5-mini")
    try:
        [info] = check_fleet([sim.url], renderer, SAMPLING)
        assert info["model_path"] == str(folder) and info["served_model_name"] == "kimi-k2.5-mini"
        assert info["seeds_honoured"] is True
        wrong = start_simulator(tmp_path, "--model-path", "kimi-k2.5-mini", "--served-model-name", "other-model")
        try:
            with pytest.raises(ServerMismatch, match=r"serves 'other-model' \(its --served-model-name\)"):
                check_fleet([wrong.url], renderer, SAMPLING)
        finally:
            wrong.stop()
    finally:
        sim.stop()


def test_a_model_smaller_than_the_tokenizer_fails_before_any_prompt_is_sent(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    """SGLang 0.5.23 dies on an input id past its vocabulary; its API does not report the vocabulary, so it is read
    from the served folder's config.json (here 151,936 ids, Qwen's, under a 163,840-id Kimi tokenizer)."""
    import json

    folder = tmp_path / "qwen-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 151_936}))
    sim = start_simulator(tmp_path, "--model-path", str(folder), "--served-model-name", "kimi-k2.5-mini")
    try:
        with pytest.raises(ServerMismatch, match=r"vocabulary of 151936 ids, but profile 'kimi-k2.5-mini'.* 163840"):
            check_fleet([sim.url], renderer, SAMPLING)
        assert sim.records() == []  # no probe was sent
        (folder / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 163_840}}))  # Kimi's layout
        [info] = check_fleet([sim.url], renderer, SAMPLING)
        assert info["vocab_size"] == 163_840 and info["probe_output_tokens"] > 0
    finally:
        sim.stop()


def test_seeds_are_recorded_as_ignored_without_deterministic_inference(
    tmp_path: Path, renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    from regen.sglang.served_model import fleet_seeds_honoured

    sim = start_simulator(tmp_path, "--seeds-ignored")
    try:
        fleet = check_fleet([sim.url], renderer, SAMPLING)
    finally:
        sim.stop()
    assert fleet[0]["seeds_honoured"] is False and fleet_seeds_honoured(fleet) is False
    assert "does not run --enable-deterministic-inference" in caplog.text
    assert fleet_seeds_honoured([{"seeds_honoured": True}, {"workers": [{"seeds_honoured": True}]}]) is True
    assert fleet_seeds_honoured([{"seeds_honoured": True}, {"workers": [{"seeds_honoured": None}]}]) is None


def test_how_each_server_admits_its_waiting_queue_is_recorded_and_chain_priority_uses_only_one_shared_order(
    simulator: Simulator, tmp_path: Path, renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    from regen.pipeline.shards import priority_order_for
    from regen.run_params import RunSpec
    from regen.sglang.served_model import fleet_priority_order

    with start_simulator(tmp_path, "--enable-priority-scheduling", "--schedule-low-priority-values-first") as sim:
        fleet = check_fleet([sim.url, simulator.url], renderer, SAMPLING)
    assert [e["priority_order"] for e in fleet] == ["smaller", "arrival"]
    assert fleet_priority_order(fleet) is None  # one server admits by arrival
    assert fleet_priority_order(fleet[:1]) == "smaller"
    assert fleet_priority_order([{"workers": [{"priority_order": "larger"}, {"priority_order": "larger"}]}]) == "larger"
    assert fleet_priority_order([{"workers": [{"priority_order": "larger"}, {"priority_order": None}]}]) is None
    assert fleet_priority_order([{"priority_order": "larger"}, {"priority_order": "smaller"}]) is None

    run = RunSpec.model_construct(chain_priority=True)
    caplog.clear()
    assert priority_order_for(run, fleet[:1]) == "smaller" and not caplog.records
    assert priority_order_for(run, fleet) is None
    assert "chain_priority is on, but not every server" in caplog.text
    assert priority_order_for(RunSpec.model_construct(chain_priority=False), fleet[:1]) is None
