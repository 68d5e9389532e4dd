"""The fleet check: readiness from /health, the served model against the profile, a validated probe answer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.sglang.fleet import FleetUnavailable
from regen.sglang.server_check import ServerMismatch, check_fleet, model_matches
from tests.conftest import Simulator, free_port, start_simulator

SAMPLING = Sampling().as_params()


def test_a_ready_fleet_is_recorded(simulator: Simulator, renderer: ChatRenderer) -> None:
    [info] = check_fleet([simulator.url], renderer, SAMPLING)
    assert info["model_path"] == "kimi-k2.5-mini"
    assert info["version"] == "0.5.9-simulator" and info["context_length"] == 16384
    assert info["max_running_requests"] == 256
    assert info["probe_output_tokens"] > 0


def test_waits_for_warm_up(tmp_path: Path, renderer: ChatRenderer) -> None:
    warming = start_simulator(tmp_path, "--warmup-s", "2")
    try:
        [info] = check_fleet([warming.url], renderer, SAMPLING, deadline_s=30)
    finally:
        warming.stop()
    assert info["model_path"] == "kimi-k2.5-mini"


def test_the_wrong_model_fails_with_what_differs(simulator: Simulator, renderer: ChatRenderer) -> None:
    other = ChatRenderer.__new__(ChatRenderer)
    other.__dict__.update(renderer.__dict__)
    other.profile = dataclasses.replace(renderer.profile, served_model_names=("moonshotai/Kimi-K2.5",))
    with pytest.raises(ServerMismatch, match=r"serves 'kimi-k2.5-mini', but profile .* expects one of"):
        check_fleet([simulator.url], other, SAMPLING)


def test_an_endpoint_that_never_gets_ready_fails_at_the_deadline(renderer: ChatRenderer) -> None:
    with pytest.raises(FleetUnavailable, match=r"/health not ready after 1s"):
        check_fleet([f"http://127.0.0.1:{free_port()}"], renderer, SAMPLING, deadline_s=1)


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
