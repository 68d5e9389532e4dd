"""The answers the fleet lost, counted against what `max_server_rejected_share` lets a dataset version keep.

The policy is stated once, in docs/guarantees.md ("A fleet's fault is never written off as the data's"); this module
is its count. An answer refused (HTTP 400, from a second server too where there is one), aborted or miscounted on
every attempt is the fleet's loss, and so is every later turn of the on-policy conversation such a loss ended: their
`earlier_turn_unusable` rejections name the turn that ended it and why (`ended_by`). The data's own rejections, and
the turns they end (a timeout on servers that answer others, an id outside the vocabulary, an answer cut by
max_new_tokens or that reads as no message), never count. The allowance is the version's, over every answer of all
its shards: publish counts them all (`check_version`); a shard counts its own against it only to fail early.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from regen.errors import FinalError
from regen.layout import DatasetLocation
from regen.manifest import ShardManifest
from regen.reasons import Reason
from regen.storage import Storage

# Not a sample that timed out on servers answering others: the poison prompt is the data's, whatever the share.
FLEET_FAULTS = frozenset({Reason.SERVER_REJECTED, Reason.SERVER_ABORTED, Reason.COUNT_MISMATCH})
DEFAULT_SHARE = 0.02
SHOWN = 20  # the ids a message or the run report names; the version's fleet-losses.jsonl lists them all
DAG_ID = "eagle3_regen"
MEANING = (
    "server_rejected: HTTP 400, from a second server too where there is one; server_aborted: finish_reason abort on "
    "every attempt; count_mismatch: completion_tokens != len(output_ids) on every attempt; earlier_turn_unusable "
    "after one of them: the later turns of the on-policy conversation it ended"
)

Rejections = Mapping[str, Mapping[str, Any]]  # answer id -> its rejection: {"reason", "detail", ...}


class TooManyServerRejections(FinalError):
    """More answers lost to the fleet than the version may keep: red, and never published. Each is kept with its
    reason, and the next try asks it again (a failed shard's retry, or a Resume of the version)."""


def is_fleet_loss(rejected: Mapping[str, Any]) -> bool:
    reason = rejected.get("reason")
    if reason == Reason.EARLIER_TURN_UNUSABLE:
        reason = (rejected.get("ended_by") or {}).get("reason")
    return reason in FLEET_FAULTS


def fleet_losses(rejected: Rejections) -> dict[str, Mapping[str, Any]]:
    return {answer_id: r for answer_id, r in rejected.items() if is_fleet_loss(r)}


def allowance(share: float, answers: int) -> int:
    """The fleet losses a version of `answers` answers may keep: its share of them, and one alone always."""
    return max(1, int(share * answers))


def check_losses(where: str, losses: Rejections, answers: int, share: float, then: str) -> None:
    """Raises TooManyServerRejections when `losses` are past the allowance of a version of `answers` answers, naming
    the endpoints and reasons with their counts, a few ids, and `then`: what to do."""
    allowed = allowance(share, answers)
    if len(losses) <= allowed:
        return
    direct = [r for r in losses.values() if r["reason"] in FLEET_FAULTS]  # a later turn was never sent
    endpoints = Counter(r.get("endpoint") or "unknown" for r in direct)
    reasons = Counter(_kind(r) for r in losses.values())
    more = f" and {len(losses) - SHOWN} more" if len(losses) > SHOWN else ""
    raise TooManyServerRejections(
        f"{where}: the fleet lost {len(losses)} of {answers} answers, past max_server_rejected_share {share:.0%} of "
        f"the dataset version's answers ({allowed} may be kept, one always); by endpoint: "
        f"{dict(endpoints.most_common())}; by reason: {dict(reasons.most_common())}; e.g. "
        f"{', '.join(list(losses)[:SHOWN])}{more} ({MEANING}). {then}"
    )


def _kind(rejected: Mapping[str, Any]) -> str:
    if rejected["reason"] in FLEET_FAULTS:
        return str(rejected["reason"])
    return f"{rejected['reason']} after {rejected['ended_by']['reason']}"


def version_answers(storage: Storage, location: DatasetLocation) -> int | None:
    """Every answer the version asks for, over all its shards, as prepare recorded them (None: not recorded)."""
    if not storage.exists(location.prepared):
        return None
    shards = json.loads(storage.get_bytes(location.prepared)).get("shards") or []
    return sum(s.get("num_answers") or s["num_prompts"] for s in shards) or None


def version_losses(storage: Storage, shards: Iterable[ShardManifest]) -> dict[str, dict[str, Any]]:
    """Every fleet loss of a version's finished shards, read from the rejected/ files of those whose counts hold a
    fleet fault (a conversation's later turns are lost only after one), each with its shard."""
    found: dict[str, dict[str, Any]] = {}
    for shard in shards:
        if not any(reason in FLEET_FAULTS for reason in shard.stats["generate"].dropped_by_reason):
            continue
        for line in storage.get_bytes(shard.keys.rejected("generate")).splitlines():
            rejected = json.loads(line)
            if is_fleet_loss(rejected):
                found[rejected["id"]] = {**rejected, "shard": shard.name}
    return found


def check_version(
    storage: Storage, location: DatasetLocation, shards: list[ShardManifest], share: float
) -> dict[str, Any]:
    """A finished version's fleet losses, listed whole in its fleet-losses.jsonl (removed when there are none) and
    counted against its allowance: past it, TooManyServerRejections, and publish writes no manifest. Otherwise what
    the published summary says of them ({} for none)."""
    losses = version_losses(storage, shards)
    listed = _record(storage, location, losses)
    answers = sum(s.stats["generate"].total for s in shards)
    then = (
        f"Mend the fleet (look at those endpoints' logs: retractions, out of memory; a router's sick worker), then "
        f"Resume the version: {resume_command([location.dataset], location.version)} (or its Resume button on the "
        f"Drafter data page): each shard asks its lost answers again and keeps the rest. All of them: {listed}"
    )
    check_losses(f"{location.dataset} {location.version}", losses, answers, share, then)
    return {"lost": len(losses), "ids": list(losses)[:SHOWN], "list": listed} if losses else {}


def _record(storage: Storage, location: DatasetLocation, losses: Mapping[str, Mapping[str, Any]]) -> str | None:
    key = location.fleet_losses
    if not losses:
        if storage.exists(key):
            storage.delete(key)
        return None
    storage.put_bytes(key, b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in losses.values()))
    return storage.uri(key)


def read_losses(storage: Storage, location: DatasetLocation) -> list[dict[str, Any]]:
    """The version's fleet-losses.jsonl, as its last publish wrote it ([]: none, or not counted yet)."""
    key = location.fleet_losses
    if not storage.exists(key):
        return []
    return [json.loads(line) for line in storage.get_bytes(key).splitlines()]


def resume_command(datasets: list[str], version: str) -> str:
    """The Airflow CLI's trigger of a Resume of `version` (the conf the Drafter data page's Resume proposes): its
    prepared prompts and finished answers are kept, and every answer not finished or lost to the fleet is asked."""
    conf = json.dumps({"datasets": datasets, "version": version})
    return f"airflow dags trigger {DAG_ID} --conf {shlex.quote(conf)}"
