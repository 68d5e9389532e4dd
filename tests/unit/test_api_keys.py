"""SGLang servers started with --api-key: the key goes with every request as a bearer token; a missing or wrong one
fails the check or the shard at once with what to set (no retry brings a key), loses no finished answer and never
shows the key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.errors import FinalError
from regen.sglang.auth import ApiKeys, Unauthorized
from regen.sglang.server_check import check_fleet
from regen.stages.generate.generate import GenerateSettings, run_generate
from tests.conftest import prepare_sample
from tools.devstack import Simulator, start_simulator

KEY = "sk-fleet-7f3a9c"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    with start_simulator(tmp_path_factory.mktemp("locked"), "--api-key", KEY) as sim:
        yield sim


def test_the_simulator_checks_keys_as_sglang_does(locked: Simulator) -> None:
    """srt/utils/auth.py: health stays open for probes; everything else needs the bearer, compared exactly."""
    assert requests.get(f"{locked.url}/health", timeout=5).status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        answer = requests.get(f"{locked.url}/model_info", headers=headers, timeout=5)
        assert (answer.status_code, answer.json()) == (401, {"error": "Unauthorized"})
    assert requests.get(f"{locked.url}/model_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=5).ok


@pytest.mark.parametrize("per_endpoint", [False, True], ids=["fleet-key", "endpoint-key-wins"])
def test_the_fleet_check_passes_with_the_key(locked: Simulator, renderer: ChatRenderer, per_endpoint: bool) -> None:
    keys = ApiKeys("other-servers-key", {locked.url: KEY}) if per_endpoint else ApiKeys(KEY)
    [info] = check_fleet([locked.url], renderer, Sampling().as_params(), api_keys=keys)
    assert info["model_path"]


@pytest.mark.parametrize(
    "keys,why",
    [
        pytest.param(ApiKeys(source="connection X"), "wants an API key and none was given", id="none"),
        pytest.param(ApiKeys("wrong-key", source="connection X"), "refused the API key given", id="wrong"),
    ],
)
def test_a_missing_or_wrong_key_fails_the_check_at_once(
    locked: Simulator, renderer: ChatRenderer, keys: ApiKeys, why: str
) -> None:
    started = time.monotonic()
    with pytest.raises(Unauthorized, match=why) as refused:
        check_fleet([locked.url], renderer, Sampling().as_params(), api_keys=keys)
    assert time.monotonic() - started < 10  # not the health wait's deadline, no backoff
    assert isinstance(refused.value, FinalError)  # the task fails now: no retry brings a key
    assert "connection X" in str(refused.value) and "wrong-key" not in str(refused.value)
    assert "wrong-key" not in repr(keys)


def test_a_shard_with_a_refused_key_stops_at_once_and_loses_nothing(
    tmp_path: Path, renderer: ChatRenderer, locked: Simulator
) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 8, limit=8)
    [shard] = prepared.shards
    settings = GenerateSettings([locked.url], Sampling().as_params(), concurrency=4, api_keys=ApiKeys("wrong-key"))
    requests_before = len(locked.records())
    with pytest.raises(Unauthorized):
        run_generate(shard, storage, settings)
    assert len(locked.records()) == requests_before  # refused before the model: nothing was answered
    assert not storage.exists(shard.keys.rejected("generate"))  # no sample rejected for the fleet's key

    done = run_generate(shard, storage, GenerateSettings([locked.url], Sampling().as_params(), api_keys=ApiKeys(KEY)))
    assert done.stats["generate"].kept == 8
    assert len(locked.records()) - requests_before == 8
