"""What an SGLang server says about the model it serves, read as check_server needs it: the name clients use, the
size of its vocabulary, and whether it honours sampling seeds.

- The name: `--served-model-name` (`served_model_name` in /get_model_info and /get_server_info, the id in /v1/models),
  which SGLang sets to `--model-path` when it is not given. `model_path` is what `--model-path` was: in most
  deployments a local folder (`/models/Kimi-K2.5`), so it names nothing a profile can expect.
- The vocabulary: SGLang 0.5.23 has no range check on input ids, and one id at or past the model's vocabulary kills
  the server (an IndexError in the embedding; every request in flight is lost). Its HTTP API does not report the
  vocabulary, so it is read from `vocab_size` where a server reports it, else from the model's config.json when
  `model_path` is a folder this process can read (the served model's own config: `vocab_size`, or
  `text_config.vocab_size` for multimodal checkpoints such as Kimi-K2.5's). None: unknown.
- Seeds: `sampling_seed` changes nothing unless the server runs `--enable-deterministic-inference`
  (`enable_deterministic_inference` in /get_server_info).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def served_name(server: dict[str, Any], model: dict[str, Any]) -> str:
    """The name clients use for the model (its --served-model-name); the model path only where neither answer
    has one (an older server)."""
    return str(model.get("served_model_name") or server.get("served_model_name") or model.get("model_path") or "")


def config_vocab(model_path: str) -> int | None:
    """The vocabulary of the checkpoint at `model_path`, when it is a folder here with a readable config.json."""
    config = Path(model_path) / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (data, data.get("text_config") or {}):
        if isinstance(section, dict) and isinstance(section.get("vocab_size"), int):
            return int(section["vocab_size"])
    return None


def served_vocab(server: dict[str, Any], model: dict[str, Any]) -> int | None:
    """The served model's vocabulary: as the server reports it, else from its config.json; None when unknown."""
    for answer in (model, server):
        if isinstance(answer.get("vocab_size"), int):
            return int(answer["vocab_size"])
    return config_vocab(str(model.get("model_path") or server.get("model_path") or ""))


def seeds_honoured(server: dict[str, Any]) -> bool | None:
    """Whether the server applies `sampling_seed` (its --enable-deterministic-inference); None: it does not say."""
    value = server.get("enable_deterministic_inference")
    return bool(value) if isinstance(value, bool) else None


def fleet_seeds_honoured(fleet: list[dict[str, Any]]) -> bool | None:
    """Over a checked fleet (check_fleet's endpoints, a router's workers within): True only if every server honours
    seeds, False if one does not, None when none says."""
    answers = [s.get("seeds_honoured") for endpoint in fleet for s in (endpoint.get("workers") or [endpoint])]
    if any(a is False for a in answers):
        return False
    return True if answers and all(a is True for a in answers) else None


def context_length_of(server: dict[str, Any]) -> int | None:
    """The longest prompt and answer the server takes, as its server info reports it."""
    value = server.get("context_length") or server.get("max_req_input_len")
    return int(value) if value else None


def gpus_of(server: dict[str, Any]) -> int | None:
    """A server's GPUs: tensor- times data-parallel size, as its server info reports them."""
    tp, dp = server.get("tp_size"), server.get("dp_size") or 1
    return int(tp) * int(dp) if isinstance(tp, int) and tp > 0 else None


def priority_order(server: dict[str, Any]) -> str | None:
    """How the server admits its waiting queue: "larger" or "smaller" priority values first with
    --enable-priority-scheduling (the second with --schedule-low-priority-values-first), "arrival" without it;
    None: it does not say."""
    enabled = server.get("enable_priority_scheduling")
    if not isinstance(enabled, bool):
        return None
    if not enabled:
        return "arrival"
    return "smaller" if server.get("schedule_low_priority_values_first") is True else "larger"


def fleet_priority_order(fleet: list[dict[str, Any]]) -> str | None:
    """The order every server of a checked fleet (a router's workers within) admits by, "larger" or "smaller";
    None when one schedules by arrival, does not say, or the servers differ."""
    orders = {s.get("priority_order") for endpoint in fleet for s in (endpoint.get("workers") or [endpoint])}
    return orders.pop() if len(orders) == 1 and orders <= {"larger", "smaller"} else None
