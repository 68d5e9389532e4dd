"""Faults the simulator injects, each shaped the way SGLang (or the network) produces it.

Faults are drawn per HTTP request from their own random stream, so a prompt is not doomed to fail on every attempt;
except `hang_prompt_rate`'s and `abort_prompt_rate`'s, drawn from the prompt itself: such a prompt hangs (or is
aborted, as a sick worker retracts it) on every attempt, on every server.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from aiohttp import web

FAULT_KINDS = ("http_500", "http_503", "reset", "hang", "abort", "slow")


@dataclass(frozen=True)
class FaultModel:
    http_500_rate: float = 0.0
    http_503_rate: float = 0.0
    reset_rate: float = 0.0  # the connection drops with no response
    hang_rate: float = 0.0  # no answer for hang_s (the client's timeout fires first)
    abort_rate: float = 0.0  # HTTP 200 with finish_reason abort
    slow_rate: float = 0.0  # slow_s added to the latency
    slow_s: float = 2.0
    hang_s: float = 3600.0
    hang_prompt_rate: float = 0.0  # of prompts (by their ids), each hanging for hang_s on every attempt
    abort_prompt_rate: float = 0.0  # of prompts (by their ids), each aborted on every attempt

    def hangs(self, prompt_ids: list[int]) -> bool:
        """Whether this prompt is one that never gets an answer in time: drawn from its ids, the same everywhere."""
        return _drawn(prompt_ids, self.hang_prompt_rate, "")

    def aborts(self, prompt_ids: list[int]) -> bool:
        """Whether this prompt is one the fleet aborts on every attempt (a stream of its own: not the hanging ones)."""
        return _drawn(prompt_ids, self.abort_prompt_rate, "abort")

    def __post_init__(self) -> None:
        rates = [getattr(self, f"{kind}_rate") for kind in FAULT_KINDS]
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError(
                f"fault rates must be >= 0 and sum to at most 1, got {dict(zip(FAULT_KINDS, rates, strict=True))}"
            )

    def draw(self, rng: random.Random) -> str | None:
        x = rng.random()
        for kind in FAULT_KINDS:
            rate = getattr(self, f"{kind}_rate")
            if x < rate:
                return kind
            x -= rate
        return None


def _drawn(prompt_ids: list[int], rate: float, stream: str) -> bool:
    if not rate:
        return False
    digest = hashlib.sha256(f"{stream}{prompt_ids}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def server_error(status: int, message: str) -> web.Response:
    """SGLang's shape for scheduler aborts that carry a status (queue full, waiting timeout)."""
    body = {"object": "error", "message": message, "type": str(status), "param": None, "code": status}
    return web.json_response(body, status=status)


def abort_answer(rid: str, started: float, now: float) -> dict[str, Any]:
    """An aborted request: HTTP 200, no output, no prompt_tokens (as SGLang sends after a retraction)."""
    return {
        "text": "",
        "output_ids": [],
        "meta_info": {
            "id": rid,
            "finish_reason": {
                "type": "abort",
                "message": "Abort before prefill",
                "status_code": None,
                "err_type": None,
            },
            "completion_tokens": 0,
            "e2e_latency": round(now - started, 6),
        },
    }
