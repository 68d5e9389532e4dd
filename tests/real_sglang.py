"""Pytest fixtures for the real SGLang 0.5.23 server on CPU (tools/real_sglang.py); loaded by tests/conftest.py.

Interface (kept stable; tests of other modules use it):
- `real_sglang` (session): a `tools.real_sglang.RealServer` serving the tiny model as `kimi-k2.5-mini` (profile
  kimi-k2.5-mini: Kimi-K2.5-layout mini tokenizer, `--tool-call-parser kimi_k2 --reasoning-parser kimi_k2`), launched
  as production launches it: `--model-path <a cache folder not named after the model> --served-model-name
  kimi-k2.5-mini --log-requests --log-requests-level 3`. Fields: `url`, `served_name`, `model` (the folder), `log`;
  `finished()` is every request it finished, parsed from its log ({rid, input_ids, output_ids, text, meta_info};
  its own warm-up and health probes left out);
  `alive()`. Do not stop or kill it (it is shared): start your own with `start_real_servers` for that.
- `real_sglang_qwen` (session): the same for profile qwen3.6 (Qwen3.6's tokenizer, served as `qwen3.6`,
  `--tool-call-parser qwen3_coder --reasoning-parser qwen3`).
- `real_sglang_pair` (module): two more kimi-k2.5-mini servers (started together), for a router in front of them.
Greedy answers (temperature 0) follow tools/tiny_model.py's scripts: reasoning, `</think>`, content, EOS; and when the
prompt declares a tool named `get_weather`, reasoning, `</think>`, one call `get_weather({"city": "Paris"})`, EOS.
The first use builds the SGLang env (minutes, once per lock) and the model folder (seconds); a server starts in about
30-60 s.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.messages import function_tool
from tools.real_sglang import RealServer, start_real_servers

GET_WEATHER = function_tool(
    "get_weather",
    "Get the current weather in a city",
    {"city": {"type": "string", "description": "the city"}},
    ["city"],
)
# A tool the tiny model never calls: with only it declared, the model answers in content.
CURRENCY = function_tool(
    "convert_currency", "Convert an amount between currencies", {"amount": {"type": "number"}}, ["amount"]
)


SHARED: list[RealServer] = []  # the session's servers, stopped early by `stop_shared`


def _serve(factory: pytest.TempPathFactory, profile: str) -> Iterator[RealServer]:
    folder = factory.mktemp(f"real-sglang-{profile}")
    [server] = start_real_servers([folder / "server.log"], profile)
    SHARED.append(server)
    yield server
    server.stop()


def stop_shared() -> None:
    """The session's servers stopped once the modules sharing them ran (tests/conftest.py): on CPU, an idle SGLang
    scheduler keeps about half a core busy, which the rest of the session would pay for."""
    for server in SHARED:
        server.stop()


@pytest.fixture(scope="session")
def real_sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    yield from _serve(tmp_path_factory, "kimi-k2.5-mini")


@pytest.fixture(scope="session")
def real_sglang_qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    yield from _serve(tmp_path_factory, "qwen3.6")


@pytest.fixture(scope="module")
def real_sglang_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RealServer]]:
    folder = tmp_path_factory.mktemp("real-sglang-pair")
    servers = start_real_servers([folder / "server0.log", folder / "server1.log"])
    yield servers
    for server in servers:
        server.stop()
