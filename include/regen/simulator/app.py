"""The simulator's HTTP app: SGLang's native endpoints wired to the simulated engine (regen.simulator.server), its
informational endpoints (health, model and server info, loads, models) and its `--api-key` check, as SGLang 0.5.23
answers them."""

from __future__ import annotations

import secrets
import time
from typing import Any

from aiohttp import web

from regen.simulator.server import STATE, SimulatorState, generate


async def health(request: web.Request) -> web.Response:
    state: SimulatorState = request.app[STATE]
    return web.Response(status=200 if state.ready() else 503)


async def model_info(request: web.Request) -> web.Response:
    state: SimulatorState = request.app[STATE]
    return web.json_response(
        {
            "model_path": state.served["model_path"],
            "served_model_name": state.served["served_model_name"],
            "tokenizer_path": state.profile.tokenizer,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }
    )


async def server_info(request: web.Request) -> web.Response:
    state: SimulatorState = request.app[STATE]
    version = {"version": state.version} if state.version else {}
    return web.json_response(
        {
            **version,
            **state.served,
            "context_length": state.context_length,
            "max_req_input_len": state.context_length - 1,
            "max_total_num_tokens": state.context_length * state.latency.max_running,
            "max_running_requests": state.latency.max_running,
            "max_queued_requests": None,
            "reasoning_parser": state.parsers["reasoning_parser"],  # as the server was started (--reasoning-parser)
            "tool_call_parser": state.parsers["tool_call_parser"],
            "incremental_streaming_output": False,
            "skip_tokenizer_init": False,
            "tp_size": 8,
            "dp_size": 1,
            "requests_served": state.counters.answered,
        }
    )


def _load(state: SimulatorState) -> dict[str, Any]:
    """One data-parallel rank's load, with the core fields of SGLang's LoadSnapshot."""
    counters, slots = state.counters, state.latency.max_running
    return {
        "dp_rank": 0,
        "num_running_reqs": counters.running,
        "num_waiting_reqs": counters.waiting,
        "max_running_requests": slots,
        "max_total_num_tokens": state.context_length * slots,
        "utilization": counters.running / slots,
    }


async def loads(request: web.Request) -> web.Response:
    """GET /v1/loads: one entry per data-parallel rank (this simulator has one)."""
    state: SimulatorState = request.app[STATE]
    return web.json_response({"timestamp": time.time(), "version": state.version, "loads": [_load(state)]})


async def get_load(request: web.Request) -> web.Response:
    """GET /get_load, the deprecated shim: `num_reqs` counts running and waiting requests together."""
    load = _load(request.app[STATE])
    running, waiting = load["num_running_reqs"], load["num_waiting_reqs"]
    return web.json_response(
        [{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting, "ts_tic": time.perf_counter()}]
    )


async def models(request: web.Request) -> web.Response:
    state: SimulatorState = request.app[STATE]
    name = state.served["served_model_name"]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(state.started),
                    "owned_by": "sglang",
                    "root": name,
                    "max_model_len": state.context_length,
                }
            ],
        }
    )


async def flush_cache(request: web.Request) -> web.Response:
    state: SimulatorState = request.app[STATE]
    if state.active_rids:
        return web.Response(status=400, text="Cache not flushed: requests are running.")
    return web.Response(text="Cache flushed.")


async def stats(request: web.Request) -> web.Response:
    state: SimulatorState = request.app[STATE]
    return web.json_response(state.counters.as_dict())


async def abort_request(request: web.Request) -> web.Response:
    return web.Response(status=200)


# Paths SGLang's --api-key leaves open, for probes and scrapers (srt/utils/auth.py `decide_request_auth`, 0.5.23).
OPEN_PATHS = ("/health", "/ready", "/metrics")


def api_key_middleware(api_key: str) -> Any:
    """SGLang's `--api-key`: every request but health, readiness and metrics needs `Authorization: Bearer <key>`
    (compared in constant time), else 401 `{"error": "Unauthorized"}`."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path.startswith(OPEN_PATHS):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), api_key.encode()):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def build_app(state: SimulatorState, api_key: str | None = None) -> web.Application:
    app = web.Application(client_max_size=1024**3, middlewares=[api_key_middleware(api_key)] if api_key else [])
    app[STATE] = state
    app.router.add_route("POST", "/generate", generate)
    app.router.add_route("PUT", "/generate", generate)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, health)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/loads", loads)
    app.router.add_get("/get_load", get_load)
    app.router.add_post("/flush_cache", flush_cache)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_get("/sim/stats", stats)
    return app
