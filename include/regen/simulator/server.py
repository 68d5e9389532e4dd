"""An HTTP server that speaks SGLang's native protocol (shared SGLANG_API.md) over a simulated model.

Faithful where the client depends on it: request shapes (single, batch, `n`), sampling-parameter validation with
SGLang's 400 messages and its error-body shapes (regen.simulator.request_checks), `output_ids` that include the matched
EOS, `finish_reason` stop and length, `meta_info` counts, duplicate-rid rejection, and /health answering 503 until
warm-up ends. A latency model (prefill + decode time per token, a cap on running requests, the rest queued) lets it
stand in for a server under load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from regen.profiles import Profile
from regen.sglang.parity import PROVEN_SGLANG_VERSION
from regen.simulator.defects import BY_NAME, defect_sent, plant_in_response
from regen.simulator.faults import FaultModel, abort_answer, server_error
from regen.simulator.model import SimulatedModel
from regen.simulator.prefix_cache import PrefixCache
from regen.simulator.request_checks import (
    EngineError,
    UnknownField,
    check_context,
    engine_error,
    schema_error,
    split_batch,
    verify_sampling,
)
from regen.simulator.slots import Slots

log = logging.getLogger(__name__)

Item = tuple[list[int], dict[str, Any], str, int]  # prompt_ids, sampling params, rid, index in the batch

# meta_info keys SGLang sends on a stream's last chunk only (the last five: with --enable-metrics)
STREAM_FINAL_ONLY = (
    "weight_versions",
    "e2e_latency",
    "request_received_ts",
    "first_token_latency",
    "api_server_dispatch_finish_ts",
    "request_finished_ts",
    "decode_throughput",
)


@dataclass(frozen=True)
class LatencyModel:
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    max_running: int = 256
    warmup_s: float = 0.0
    priority_scheduling: bool = False  # the waiting queue by request priority, then arrival (regen.simulator.slots)
    low_priority_values_first: bool = False

    def seconds(self, prompt_tokens: int, output_tokens: int) -> float:
        return prompt_tokens * self.prefill_s_per_token + output_tokens * self.decode_s_per_token


@dataclass
class Counters:
    """What tests and benchmarks read over HTTP (GET /sim/stats): answers, faults, and busy time.

    `busy_slot_seconds` is the time integral of running requests; two reads give the utilization over the time
    between them: delta busy_slot_seconds / (max_running x delta now).
    """

    max_running: int
    requests: int = 0  # /generate calls
    answered: int = 0  # answers sent (batch items count one each)
    running: int = 0
    waiting: int = 0  # requests queued for a running slot
    busy_slot_seconds: float = 0.0
    changed_at: float = 0.0
    first_start: float | None = None  # unix time: comparable with the client's own timestamps
    last_end: float | None = None
    faults: dict[str, int] = field(default_factory=dict)
    defects: dict[str, int] = field(default_factory=dict)  # planted and still in the answer sent, by kind

    def _advance(self, now: float) -> None:
        self.busy_slot_seconds += self.running * (now - self.changed_at)
        self.changed_at = now

    def slot_taken(self) -> None:
        now = time.monotonic()
        self._advance(now)
        self.running += 1
        self.first_start = self.first_start or time.time()

    def slot_released(self) -> None:
        now = time.monotonic()
        self._advance(now)
        self.running -= 1
        self.last_end = time.time()

    def as_dict(self) -> dict[str, Any]:
        now = time.monotonic()
        self._advance(now)
        window = (self.last_end - self.first_start) if self.first_start and self.last_end else 0.0
        return {
            **dataclasses.asdict(self),
            "now": now,
            "window_s": window,
            "utilization": self.busy_slot_seconds / (self.max_running * window) if window else 0.0,
        }


class SimulatorState:
    def __init__(
        self,
        model: SimulatedModel,
        profile: Profile,
        latency: LatencyModel,
        context_length: int,
        record_path: Path | None,
        faults: FaultModel | None = None,
        fault_seed: int = 0,
        version: str = PROVEN_SGLANG_VERSION,
        parsers: dict[str, str | None] | None = None,
    ) -> None:
        self.model = model
        # The parsers /server_info reports: those it was started with, by default the profile's.
        self.parsers = parsers or {
            "tool_call_parser": profile.tool_call_parser,
            "reasoning_parser": profile.reasoning_parser,
        }
        self.version = version  # the SGLang version /server_info reports; "": one that does not say
        # What /model_info and /server_info say of the model, as SGLang does: --model-path as given (a folder in most
        # deployments), --served-model-name (the name clients use), and whether sampling seeds are applied.
        name = profile.served_model_names[0]
        self.served: dict[str, Any] = {
            "model_path": name,
            "served_model_name": name,
            "enable_deterministic_inference": True,  # the simulated model draws from sampling_seed
            "enable_metrics": False,  # with it, an answer's meta_info says how long it waited for a running slot
            "enable_priority_scheduling": latency.priority_scheduling,
            "schedule_low_priority_values_first": latency.low_priority_values_first,
        }
        self.faults = faults or FaultModel()
        self.fault_rng = random.Random(fault_seed)
        self.counters = Counters(max_running=latency.max_running)
        self.profile = profile
        self.latency = latency
        self.context_length = context_length
        self.started = time.monotonic()
        self.running = Slots(latency.max_running, latency.priority_scheduling, latency.low_priority_values_first)
        self.prefix_cache = PrefixCache(context_length * latency.max_running)
        self.active_rids: set[str] = set()
        self.record_file = record_path.open("a", encoding="utf-8") if record_path else None

    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.latency.warmup_s


STATE = web.AppKey("state", SimulatorState)


def _finish(full: list[int], params: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """Cut the model's answer where SGLang would: a stop id (kept in output_ids) or max_new_tokens."""
    stop_ids = set(params["stop_token_ids"] or [])
    limit = params["max_new_tokens"]
    for position, token_id in enumerate(full):
        if limit is not None and position >= limit:
            return full[:limit], {"type": "length", "length": limit}
        is_eos = position == len(full) - 1 and not params["ignore_eos"]
        if is_eos or token_id in stop_ids:
            return full[: position + 1], {"type": "stop", "matched": token_id}
    return full, {"type": "length", "length": limit}


async def _one(
    state: SimulatorState,
    prompt_ids: list[int],
    params: dict[str, Any],
    rid: str,
    index: int,
    extra_s: float = 0.0,
    priority: int | None = None,
) -> dict[str, Any]:
    started, received = time.monotonic(), time.time()
    seed = params["sampling_seed"]
    answer = state.model.answer(prompt_ids, None if seed is None else seed + index)
    output_ids, finish_reason = _finish(answer.ids, params)
    state.counters.waiting += 1
    async with state.running.slot(priority):
        state.counters.waiting -= 1
        state.counters.slot_taken()
        queued_s, forward_entry = time.monotonic() - started, time.time()
        cached = state.prefix_cache.admit(prompt_ids)  # only the uncached part is prefilled
        try:
            await asyncio.sleep(state.latency.seconds(len(prompt_ids) - cached, len(output_ids)) + extra_s)
        finally:
            state.counters.slot_released()
    output_ids, defect = defect_sent(answer.defect, answer.defect_at, output_ids, finish_reason, state.model.roles)
    meta_info = {  # the keys and types SGLang 0.5.23 answers with (some only a GPU server fills)
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": len(prompt_ids),
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(output_ids),
        "cached_tokens": cached,
        "weight_versions": [{"version": "default", "start": 0, "end": len(output_ids)}],
        "cached_tokens_details": {"device": cached, "host": 0},
        "dp_rank": None,
        "e2e_latency": round(time.monotonic() - started, 6),
        "response_sent_to_client_ts": time.time(),
    }
    if state.served["enable_metrics"]:  # SGLang's request time stats (unix times, seconds), with --enable-metrics
        prefilled = forward_entry + state.latency.seconds(len(prompt_ids) - cached, 0)
        finished = time.time()
        meta_info |= {
            "storage_prefetch_wait": 0.0,
            "storage_staging_wait": 0.0,
            "forward_entry_time": forward_entry,
            "prefill_finished_time": prefilled,
            "queue_time": queued_s,
            "request_received_ts": received,  # this and the rest: on a stream's last chunk only
            "first_token_latency": prefilled - received,
            "api_server_dispatch_finish_ts": received,
            "request_finished_ts": finished,
        }
        if len(output_ids) > 1:  # tokens after the first over the time they took
            meta_info["decode_throughput"] = (len(output_ids) - 1) / max(finished - prefilled, 1e-6)
    text = _text(state, output_ids, finish_reason, params)
    if defect is not None and BY_NAME[defect].in_response:
        text, meta_info = plant_in_response(defect, text, meta_info, len(output_ids), random.Random(answer.variant))
    if defect is not None:
        state.counters.defects[defect] = state.counters.defects.get(defect, 0) + 1
    if state.record_file:
        record = {
            "rid": rid,
            "input_ids": prompt_ids,
            "output_ids": output_ids,
            "finish_reason": finish_reason,
            "sampling": {"temperature": params["temperature"], "sampling_seed": params["sampling_seed"]},
            "priority": priority,
            "defect": defect,
            "received_at": received,  # wall clock, as the two below: a bench's timeline of the fleet
            "admitted_at": forward_entry,
            "answered_at": time.time(),  # a test compares it with when it killed a client
        }
        state.record_file.write(json.dumps(record) + "\n")
        state.record_file.flush()
    state.counters.answered += 1
    return {"text": text, "output_ids": output_ids, "meta_info": meta_info}


def _text(state: SimulatorState, output_ids: list[int], finish_reason: dict[str, Any], params: dict[str, Any]) -> str:
    """What SGLang's detokenizer sends: the decode of output_ids, minus the matched stop id unless no_stop_trim."""
    text_ids = output_ids
    matched = finish_reason.get("matched")
    if finish_reason["type"] == "stop" and not params["no_stop_trim"] and output_ids and output_ids[-1] == matched:
        text_ids = output_ids[:-1]
    return state.model.decode_text(text_ids, params["skip_special_tokens"], params["spaces_between_special_tokens"])


async def generate(request: web.Request) -> web.StreamResponse:
    state: SimulatorState = request.app[STATE]
    state.counters.requests += 1
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        return schema_error(f"Invalid JSON body: {e}")
    if not isinstance(body, dict):
        return schema_error("The request body must be a JSON object.")
    try:
        prompts, samplings, rids, is_batch = split_batch(body)
        params = [verify_sampling(s, state.model.vocab_size) for s in samplings]
        for prompt_ids, p in zip(prompts, params, strict=True):
            check_context(len(prompt_ids), p["max_new_tokens"], state.context_length)
            if any(not 0 <= t < state.model.vocab_size for t in prompt_ids):
                raise EngineError(f"Token id out of range: the vocabulary has {state.model.vocab_size} ids.")
    except UnknownField as e:
        return web.json_response({"error": str(e)}, status=400)
    except (EngineError, TypeError) as e:
        return engine_error(str(e))
    except KeyError as e:
        return schema_error(f"Missing field: {e}")
    items: list[Item] = []
    for i, (prompt_ids, p, rid) in enumerate(zip(prompts, params, rids, strict=True)):
        base_rid = rid or uuid.uuid4().hex
        for k in range(p["n"]):
            items.append((prompt_ids, p, uuid.uuid4().hex if p["n"] > 1 else base_rid, i * p["n"] + k))
    item_rids = [item[2] for item in items]
    if state.active_rids.intersection(item_rids) or len(set(item_rids)) < len(item_rids):
        return engine_error("Duplicate request ID detected")
    state.active_rids.update(item_rids)
    try:
        priority = body.get("priority")  # GenerateReqInput.priority: an int or none, for every item
        if body.get("stream"):
            return await _stream(request, state, items, priority)
        return await _answer(request, state, items, is_batch, priority)
    finally:
        state.active_rids.difference_update(item_rids)


async def _stream(
    request: web.Request, state: SimulatorState, items: list[Item], priority: int | None = None
) -> web.StreamResponse:
    """SGLang's default stream: Server-Sent Events, each chunk the CUMULATIVE text and output_ids so far with
    `finish_reason` null until the last, then `[DONE]`. The answer is made whole first, then sent in chunks."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for prompt_ids, params, rid, index in items:
        whole = await _one(state, prompt_ids, params, rid, index, priority=priority)
        ids = whole["output_ids"]
        for end in range(1, len(ids) + 1):
            last = end == len(ids)
            meta = {**whole["meta_info"], "completion_tokens": end}
            # SGLang stamps the first chunk with when it was sent, and with --enable-metrics the last one too (its
            # request time stats carry the first chunk's stamp)
            if end > 1 and not (last and state.served["enable_metrics"]):
                del meta["response_sent_to_client_ts"]
            if not last:
                meta = {key: value for key, value in meta.items() if key not in STREAM_FINAL_ONLY} | {
                    "finish_reason": None
                }
            so_far = _text(state, ids[:end], meta["finish_reason"] or {"type": "length"}, params)
            chunk = {"text": whole["text"] if last else so_far, "output_ids": ids[:end], "meta_info": meta}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _aborted(rid: str, now: float) -> dict[str, Any]:
    return abort_answer(rid, now, now)


async def _answer(
    request: web.Request, state: SimulatorState, items: list[Item], is_batch: bool, priority: int | None = None
) -> web.Response:
    fault = state.faults.draw(state.fault_rng)
    if fault:
        state.counters.faults[fault] = state.counters.faults.get(fault, 0) + 1
    if fault == "http_500":
        return server_error(500, "Internal server error: the scheduler raised an exception.")
    if fault == "http_503":
        return server_error(503, "The request queue is full.")
    if fault == "reset":
        assert request.transport is not None
        request.transport.abort()  # the client sees the connection drop, no response
        return web.Response(status=500)
    if fault == "hang" or any(state.faults.hangs(item[0]) for item in items):
        await asyncio.sleep(state.faults.hang_s)  # cancelled when the client gives up and disconnects
    now, extra_s = time.monotonic(), state.faults.slow_s if fault == "slow" else 0.0
    results = await asyncio.gather(
        *(
            _aborted(rid, now)
            if fault == "abort" or state.faults.aborts(p)
            else _one(state, p, params, rid, i, extra_s, priority)
            for p, params, rid, i in items
        )
    )
    return web.json_response(results if is_batch or len(results) > 1 else results[0])
