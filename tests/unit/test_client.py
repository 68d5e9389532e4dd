from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import aiohttp
import pytest

from regen.chat import ChatRenderer
from regen.sglang.client import (
    Generation,
    PermanentError,
    SGLangClient,
    TransientError,
    check_response,
    error_message,
)
from regen.sglang.fleet import EndpointPool
from tests.conftest import Simulator, free_port

STOP = {"type": "stop", "matched": 1}
SAMPLING = {"max_new_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": -1}


async def _generate(endpoints: list[str], prompt: list[int], sampling: dict[str, Any], **kw: Any) -> tuple:
    async with aiohttp.ClientSession() as session:
        pool = EndpointPool(endpoints, session, fleet_wait_s=1)
        client = SGLangClient(pool, session, backoff_max_s=0.05, **kw)
        try:
            result = await client.generate(prompt, sampling, "sample-1")
        finally:
            await pool.close()
        return result, client.stats


def test_generation_keeps_raw_ids_and_meta(simulator: Simulator, renderer: ChatRenderer) -> None:
    prompt = renderer.render_ids([{"role": "user", "content": "hello"}], None)
    result, stats = asyncio.run(_generate([simulator.url], prompt, SAMPLING))
    assert isinstance(result, Generation)
    recorded = next(r for r in simulator.records() if r["rid"] == result.rid)
    assert result.output_ids == recorded["output_ids"]
    assert result.finish_reason == {"type": "stop", "matched": 163586}
    assert result.attempts == 1 and stats.requests == 1 and result.rid.startswith("sample-1-")


def test_a_rid_never_repeats_for_one_sample_asked_again(simulator: Simulator, renderer: ChatRenderer) -> None:
    """The same sample asked twice by one client, and by a second client (a retried task), gets three rids."""
    prompt = renderer.render_ids([{"role": "user", "content": "hello"}], None)

    async def ask() -> list[str]:
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool([simulator.url], session, fleet_wait_s=1)
            first, second = SGLangClient(pool, session), SGLangClient(pool, session)
            try:
                answers = [await client.generate(prompt, SAMPLING, "sample-9") for client in (first, first, second)]
            finally:
                await pool.close()
            return [answer.rid for answer in answers]

    rids = asyncio.run(ask())
    assert len(set(rids)) == 3 and all(rid.startswith("sample-9-") and rid.endswith("-1") for rid in rids)
    assert {r["rid"] for r in simulator.records()} >= set(rids)


def test_400_is_permanent_with_the_servers_message(simulator: Simulator) -> None:
    with pytest.raises(PermanentError, match=r"top_p must be in \(0, 1\]"):
        asyncio.run(_generate([simulator.url], [1, 2, 3], {**SAMPLING, "top_p": 0.0}))


def test_a_dead_endpoint_is_retried_on_the_live_one(simulator: Simulator, renderer: ChatRenderer) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    prompt = renderer.render_ids([{"role": "user", "content": "hello again"}], None)
    result, stats = asyncio.run(_generate([dead, simulator.url], prompt, SAMPLING))
    assert result.endpoint == simulator.url
    assert stats.retries_by_cause["connection"] >= 1 and result.attempts == stats.retries_by_cause.total() + 1


def test_a_dead_fleet_raises_transient_after_the_attempts() -> None:
    with pytest.raises(TransientError, match="connection"):
        asyncio.run(_generate([f"http://127.0.0.1:{free_port()}"], [1], SAMPLING, max_attempts=3))


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
def test_a_sample_makes_exactly_its_attempts_and_counts_each_retry(max_attempts: int) -> None:
    """The first try goes out outside tenacity's loop, the rest through it: together, max_attempts tries."""

    async def fail() -> Any:
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool([f"http://127.0.0.1:{free_port()}"], session, fleet_wait_s=1)
            client = SGLangClient(pool, session, backoff_max_s=0.01, max_attempts=max_attempts)
            try:
                with pytest.raises(TransientError, match="connection"):
                    await client.generate([1], SAMPLING, "sample-1")
            finally:
                await pool.close()
            return client.stats

    stats = asyncio.run(fail())
    assert stats.requests == max_attempts and +stats.retries_by_cause == Counter(connection=max_attempts - 1)


def test_error_message_reads_every_sglang_shape() -> None:
    assert error_message('{"error": {"message": "input too long"}}') == "input too long"
    # An unknown sampling field: SGLang 0.5.23's request parser answers with the error as a string.
    assert (
        error_message('{"error": "unknown field `bogus`, expected one of `n`"}')
        == "unknown field `bogus`, expected one of `n`"
    )
    assert error_message('{"object": "error", "message": "queue full", "code": 503}') == "queue full"
    assert error_message("<html>bad gateway</html>") == "<html>bad gateway</html>"


@pytest.mark.parametrize(
    "body,cause",
    [
        pytest.param(
            {"output_ids": [1], "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "stop"}}},
            "count_mismatch",
            id="length-mismatch",
        ),
        pytest.param(
            {"output_ids": [], "meta_info": {"completion_tokens": 0, "finish_reason": {"type": "stop"}}},
            "bad_response",
            id="empty",
        ),
        pytest.param({"meta_info": {"finish_reason": {"type": "abort", "message": "retracted"}}}, "abort", id="abort"),
        pytest.param(
            {"output_ids": [5, "6"], "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "stop"}}},
            "bad_response",
            id="id-not-an-int",
        ),
        pytest.param(
            {"output_ids": [5, True], "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "stop"}}},
            "bad_response",
            id="id-a-bool",
        ),
        pytest.param(
            {"output_ids": [5, 1], "meta_info": {"completion_tokens": 2, "finish_reason": None}},
            "bad_response",
            id="no-finish-reason",
        ),
        pytest.param([{"output_ids": [5]}], "bad_response", id="not-an-object"),
    ],
)
def test_responses_that_do_not_add_up_are_transient(body: Any, cause: str) -> None:
    with pytest.raises(TransientError) as info:
        check_response(json.dumps(body).encode())
    assert info.value.cause == cause


def test_a_server_disagreeing_on_the_prompt_length_is_judged_at_validate_not_retried() -> None:
    body = {"output_ids": [5, 1], "meta_info": {"completion_tokens": 2, "prompt_tokens": 9, "finish_reason": STOP}}
    assert check_response(json.dumps(body).encode()).meta_info["prompt_tokens"] == 9


def test_a_configured_priority_is_sent_with_every_request_and_none_without(
    simulator: Simulator, renderer: ChatRenderer
) -> None:
    """SGLang's /generate takes `priority` (io_struct.GenerateReqInput); a deployment sharing its fleet with live
    traffic sets one, and every request carries it. Without one, the field is not sent at all: a server started with
    --abort-on-priority-when-disabled would abort any request that carries it."""
    from tests.loopback import RecordingProxy

    prompt = renderer.render_ids([{"role": "user", "content": "hello"}], None)
    with RecordingProxy(simulator.url) as proxy:
        asyncio.run(_generate([proxy.url], prompt, SAMPLING, priority=-5))
        asyncio.run(_generate([proxy.url], prompt, SAMPLING))
    [with_priority, without] = proxy.bodies
    assert with_priority["priority"] == -5 and with_priority["input_ids"] == prompt
    assert "priority" not in without and without["input_ids"] == prompt
