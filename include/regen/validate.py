"""Stage 4: token-fidelity checks on every raw record. All checks are on ids; text is never consulted.

`validate_record` is pure. A record passes only if its prompt ends with the profile's generation suffix, the output
ends with an EOS id (so `finish_reason` length fails: truncated answers are counted, never passed as complete), and
reasoning is closed exactly once. A missing `</think>` right before a tool-call section is reported on its own: it is
a known Kimi behaviour, not corruption.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from regen.chat import TokenRoles
from regen.manifest import ShardManifest, StageStats
from regen.storage import Storage

log = logging.getLogger(__name__)

OK = "ok"


def validate_record(
    prompt_ids: list[int], output_ids: list[int], finish_reason: dict[str, Any], roles: TokenRoles
) -> str:
    """The verdict for one record: "ok" or the first failed check's name."""
    suffix = list(roles.generation_suffix)
    if prompt_ids[-len(suffix) :] != suffix:
        return "prompt_suffix_mismatch"
    if not output_ids:
        return "empty_output"
    if finish_reason.get("type") == "length":
        return "truncated"
    if output_ids[-1] not in roles.eos_ids:
        return "no_eos_at_end"
    if roles.reasoning_end is None:
        return OK
    thinking = prompt_ids[-1] != roles.reasoning_end  # "<think></think>" prompts have reasoning turned off
    closes = output_ids.count(roles.reasoning_end)
    if not thinking:
        return OK if closes == 0 else "unexpected_reasoning_end"
    if closes == 1:
        return OK
    if closes == 0 and roles.tool_calls_begin is not None and roles.tool_calls_begin in output_ids:
        return "reasoning_end_missing_before_tool_call"
    return "reasoning_end_missing" if closes == 0 else "reasoning_end_repeated"


def verdicts_key(shard: ShardManifest) -> str:
    return shard.key("reports", "-verdicts.json")


def run_validate(shard: ShardManifest, storage: Storage, roles: TokenRoles) -> ShardManifest:
    if shard.raw_key is None:
        raise ValueError(f"{shard.name} has no raw answers yet: run generate first")
    stats = StageStats()
    verdicts: dict[str, str] = {}
    for line in storage.get_bytes(shard.raw_key).decode("utf-8").splitlines():
        record = json.loads(line)
        verdict = validate_record(
            record["prompt_ids"], record["output_ids"], record["meta_info"]["finish_reason"], roles
        )
        verdicts[record["id"]] = verdict
        if verdict == OK:
            stats.keep()
        else:
            stats.drop(verdict)
    body = json.dumps({"shard": shard.name, "stats": stats.to_dict(), "verdicts": verdicts}).encode()
    key = verdicts_key(shard)
    storage.put_bytes(key, body)
    log.info("%s %s validated: %s", shard.location.dataset, shard.name, stats.to_dict())
    return shard.with_stage("validate", stats, {key: hashlib.sha256(body).hexdigest()})
