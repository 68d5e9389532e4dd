"""The fleet a crash point's run meets. `sound`: it answers every prompt. `losing`: it loses answers, so that the
writes made only then are crash points too: a first run, never faulted, meets a fleet that aborts some prompts on
every attempt (the simulator's --abort-prompt-rate, drawn from each prompt: the same prompts in every run) and goes red
past the allowance (max_server_rejected_share); the run traced and faulted is its Resume, on a fleet mended but for
one prompt, within the allowance. So the Resume reopens the finished shards that hold fleet losses (their shard
reports, the version's fleet-losses.jsonl and raw files deleted, a checkpoint part written: checkpoints.reopen),
asks a shard that failed early for its losses again (its checkpoints kept), and publishes with the answer still lost
listed in fleet-losses.jsonl.

With the harness's deployment (checks.write_deployment), a prompt is aborted when its draw (the simulator's, from its
ids) is below the rate; the draws nearest the rates: parts' 0.053 (shard-00000), 0.453 and 0.454 (shard-00002), then
0.541; chats' first conversation's first turn 0.123 (its third 0.127); tools' first prompt 0.199, then 0.565. So the
first run's fleet (LOST_RATE) loses:
- parts: one answer in shard-00000 and two in shard-00002, each shard within its allowance of 2 (of 8 answers), so
  they finish; their version's 3 are past it: publish writes fleet-losses.jsonl and fails (TooManyServerRejections);
- chats: a conversation's first turn, and with it its later two (3 of 7 answers, allowance 1): its shard fails early;
- tools: one prompt at both temperatures, 2 of 8 answers, within its allowance: published with its fleet-losses.jsonl.
The Resume's fleet (MENDED_RATE) still loses parts' first answer: parts is published with it listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SOUND_ARGS = ("--omit-think-end-rate", "0")  # every answer ends its thinking: the data's rejections are few and fixed
LOST_RATE, MENDED_RATE = 0.5, 0.1  # the simulator's --abort-prompt-rate: the first run's fleet, then its Resume's
LOSS_SHARE = 0.25  # max_server_rejected_share: of 8 answers 2 may be lost, of chats' 7 one
LOSS_ATTEMPTS = 2  # max_attempts: an answer aborted on every attempt is lost after one backoff, not four


@dataclass(frozen=True)
class Fleet:
    name: str
    args: tuple[str, ...] = SOUND_ARGS  # the simulator's, for the traced run, the crash points' runs, their Resumes
    lossy: tuple[str, ...] | None = None  # the first run's fleet, before the traced Resume; None: no first run
    defaults: dict[str, Any] = field(default_factory=dict)  # the deployment's, over write_deployment's


FLEETS = {
    "sound": Fleet("sound"),
    "losing": Fleet(
        "losing",
        args=(*SOUND_ARGS, "--abort-prompt-rate", str(MENDED_RATE)),
        lossy=(*SOUND_ARGS, "--abort-prompt-rate", str(LOST_RATE)),
        defaults={"max_server_rejected_share": LOSS_SHARE, "max_attempts": LOSS_ATTEMPTS},
    ),
}

# The first run's failures that make its Resume take the paths only a fleet's losses take; each must be there.
LOST = {
    "publish_dataset[parts]": "TooManyServerRejections",  # its shards finished with losses: reopened by the Resume
    "generate_group[chats/shard-00000]": "TooManyServerRejections",  # failed early: its losses asked again
}


def check_first_run(errors: dict[str, str], lists: dict[str, bool]) -> None:
    """The losing fleet's first run is red where LOST says, and left fleet-losses.jsonl for parts (red) and tools
    (published): else the deployment or the draws changed and the Resume would take none of the paths it is for."""
    wrong = {t: errors.get(t, "green") for t, want in LOST.items() if not errors.get(t, "").startswith(want)}
    unlisted = [dataset for dataset in ("parts", "tools") if not lists.get(dataset)]
    if wrong or unlisted:
        raise RuntimeError(
            f"the losing fleet's first run lost other answers than it is built for (see tools/crash_points/fleet.py): "
            f"tasks not failed as expected: {wrong}; no fleet-losses.jsonl: {unlisted}; its errors: {errors}"
        )
