"""Several answers per prompt: at each of a dataset's temperatures, `samples_per_prompt` times.

Each sample has its own stable id (prompt id, temperature, index) and its own explicit `sampling_seed`, derived
from that id and sent with the request: a rerun sends the same seeds, so a server that is deterministic for a seed
answers the same. A dataset with one sample per prompt and no temperatures of its own keeps its prompts' ids and
sends no seed (the run's sampling as it is). An on-policy conversation (regen.on_policy) answers one sample turn by
turn: each turn has an id of its own, and its own seed derived from that id when its sample has one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    id: str
    temperature: float | None  # None: the run's temperature
    index: int
    seed: int | None


def seed_of(sample_id: str) -> int:
    """A seed SGLang takes (a non-negative 31-bit integer), the same for a sample id on every run."""
    return int.from_bytes(hashlib.sha256(sample_id.encode()).digest()[:4], "big") & 0x7FFFFFFF


def samples_of(prompt_id: str, temperatures: list[float] | None, per_prompt: int) -> list[Sample]:
    if temperatures is None and per_prompt == 1:
        return [Sample(prompt_id, None, 0, None)]
    samples = []
    at_temperatures: list[float | None] = list(temperatures) if temperatures else [None]
    for temperature in at_temperatures:
        for index in range(per_prompt):
            at = "" if temperature is None else f"@t{temperature:g}"
            sample_id = f"{prompt_id}{at}#{index}"
            samples.append(Sample(sample_id, temperature, index, seed_of(sample_id)))
    return samples


TURN = "/turn-"  # an on-policy turn's id: its conversation sample's id, this, and the turn's number from 1


def turn_id(sample_id: str, turn: int) -> str:
    return f"{sample_id}{TURN}{turn}"


def turn_of(answer_id: str) -> int | None:
    """An on-policy turn's number (from 1), or None for any other answer id."""
    _, sep, turn = answer_id.rpartition(TURN)
    return int(turn) if sep and turn.isdigit() else None


def sample_of(answer_id: str) -> str:
    """The sample (prompts/ row) an answer id belongs to: itself, or the conversation of an on-policy turn."""
    sample, sep, turn = answer_id.rpartition(TURN)
    return sample if sep and turn.isdigit() else answer_id
