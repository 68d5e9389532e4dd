"""A real SGLang server killed (SIGKILL) mid-run behind the real sglang-router: generation completes, every sample
exactly once, and every answer is bit-exact to what one server's own request log says it sent: the survivor's, or the
dead one's up to its death."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.stages.generate.generate import GenerateSettings, run_generate
from tests.conftest import prepare_sample, raw_answers, shard_prompt_ids
from tools.real_sglang import RealServer, model_dir, start_real_servers
from tools.router import start_router

pytestmark = pytest.mark.e2e
KILL_AFTER = 6  # answers the doomed server finishes first


@pytest.fixture
def doomed_pair(tmp_path: Path) -> Iterator[list[RealServer]]:
    servers = start_real_servers([tmp_path / "server0.log", tmp_path / "server1.log"])
    yield servers
    for server in servers:
        server.stop()


def kill_when_answered(server: RealServer, count: int, killed: list[float]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(server.finished()) < count:
        time.sleep(0.1)
    server.kill()
    killed.append(time.monotonic())


def test_a_server_killed_mid_run_loses_nothing_and_duplicates_nothing(
    doomed_pair: list[RealServer], renderer: ChatRenderer, tmp_path: Path
) -> None:
    survivor, doomed = doomed_pair
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 100)
    shard = prepared.shards[0]
    sampling = Sampling(temperature=0.0, max_new_tokens=64).as_params()
    killed: list[float] = []
    urls, log = [s.url for s in doomed_pair], tmp_path / "router.log"
    with start_router(urls, log, policy="round_robin", tokenizer_path=model_dir()) as router:
        settings = GenerateSettings([router.url], sampling, concurrency=4, max_attempts=10, backoff_max_s=2.0)
        killer = threading.Thread(target=kill_when_answered, args=(doomed, KILL_AFTER, killed), daemon=True)
        killer.start()
        done = run_generate(shard, storage, settings)
        killer.join(10)
    assert killed and not doomed.alive()  # it died mid-run, not after

    answers = raw_answers(storage, done.raw_key)
    prompts = shard_prompt_ids(storage, shard)
    assert sorted(a["id"] for a in answers) == sorted(prompts) and done.stats["generate"].kept == len(prompts) == 48
    dead_log = {r["rid"]: r for r in doomed.finished()}  # everything it finished before SIGKILL
    live_log = {r["rid"]: r for r in survivor.finished()}
    assert len(dead_log) >= KILL_AFTER and not dead_log.keys() & live_log.keys()
    by_dead = 0
    for answer in answers:
        [server] = [log[answer["rid"]] for log in (dead_log, live_log) if answer["rid"] in log]  # exactly one
        by_dead += server is dead_log.get(answer["rid"])
        assert server["input_ids"] == prompts[answer["id"]]
        assert server["output_ids"] == answer["output_ids"]
        assert server["meta_info"]["finish_reason"] == answer["meta_info"]["finish_reason"]
    assert 0 < by_dead < len(answers)  # both servers' answers were published, the dead one's up to its death
