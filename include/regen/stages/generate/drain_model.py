"""A model of the drain: the whole-run fleet utilization that a run's shards, settings and answer lengths give, worked
out in a second where a run takes hours. The run report sets it beside what the run measured (`fleet_usage.model`):
fed the lengths the run predicted, it is the utilization the run could expect; fed the lengths its answers had, it
is what the run's dealing and in-flight budget allow, so that a measured figure well below it points at the fleet or
the client rather than at the settings. bench/bench_drain.py prints it beside every run it measures, the
differential that keeps it honest (docs/benchmarks.md), and bench/drain_model.py sweeps settings with it.

What it models, each as the pipeline does it: a dataset dealt into shards of `shard_size` conversations (a
single-turn row is a conversation of one turn), the longest predicted work first, or taken as prepare dealt them; the
shards run as the DAG maps them (the longest predicted conversation first across datasets: `run_order`),
`shard_tasks` at a time (the pool), the next one `task_gap_s` after a task ends (Airflow's scheduling of the next
mapped task); each task keeps at most `in_flight / shard_tasks` requests out, its conversations longest first, a
conversation's next turn sent when its previous one is answered; the servers' `slots` admit their waiting queue by
arrival or, with chain priority, by the level turn_priority gives the work a request's conversation has left; an
answer takes its tokens x `decode_ms`. What it leaves out: prefill, the prefix cache, the servers' separate queues
(one queue for the fleet), checkpoints, faults, and the length fit refining a first version's order as answers
arrive.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from regen.layout import VERDICTS_SUFFIX, DatasetLocation
from regen.samples import sample_of, turn_of
from regen.stages.generate.conversations import turn_priority
from regen.stages.generate.order import longest_work_first
from regen.storage import Storage, read_table

MAX_ANSWERS = 1_000_000  # a run's answers the report models: at 10^6, 45 s and 600 MB on a 2-core machine
Turn = tuple[int, int]  # (predicted tokens, the answer's tokens)
Conversation = list[Turn]
Shard = list[Conversation]


@dataclass(frozen=True)
class Settings:
    shard_size: int = 20
    shard_tasks: int = 4
    in_flight: int = 96
    slots: int = 32
    longest_first: bool = True
    chain_priority: bool = False
    decode_ms: float = 4.5
    task_gap_s: float = 3.0


def work(conversation: Conversation) -> int:
    return sum(predicted for predicted, _ in conversation)


def deal(dataset: list[Conversation], settings: Settings) -> list[Shard]:
    """A dataset's shards as prepare deals them: longest predicted work first (or in the source's order)."""
    rows = sorted(dataset, key=lambda turns: -work(turns)) if settings.longest_first else list(dataset)
    return [rows[i : i + settings.shard_size] for i in range(0, len(rows), settings.shard_size)]


def drain(datasets: list[list[Conversation]], settings: Settings) -> dict[str, float]:
    """The run's utilization (busy slot-seconds over slots x first request to last answer) and its window, the
    datasets dealt as prepare deals them and their shards in the run's order."""
    return drain_shards(
        run_order([shard for dataset in datasets for shard in deal(dataset, settings)], settings), settings
    )


def run_order(shards: Sequence[Sequence[Sequence[tuple[int | None, int]]]], settings: Settings) -> list[Any]:
    """The shards (given dataset after dataset, as prepare dealt them) in the order the DAG maps them: the longest
    predicted conversation first across datasets (regen.pipeline.shards.shard_groups; a shard with no prediction
    where the median is), or as given when the run keeps the source's order."""
    if not settings.longest_first:
        return list(shards)

    def longest(shard: Sequence[Sequence[tuple[int | None, int]]]) -> int | None:
        known = [[p for p, _ in c if p is not None] for c in shard]
        return max((sum(turns) for turns in known if turns), default=None)

    return [shards[i] for i in longest_work_first([longest(shard) for shard in shards])]


def drain_shards(shards: list[Shard], settings: Settings) -> dict[str, float]:
    """The run's utilization and window, its shards given in the order the DAG maps them."""
    if settings.longest_first:  # a task sends its conversations longest first
        shards = [sorted(shard, key=lambda turns: -work(turns)) for shard in shards]
    share = -(-settings.in_flight // settings.shard_tasks)
    clock = itertools.count()  # ties by order of events
    events: list[tuple[float, int, str, tuple[int, int, int]]] = []  # (when, tie, what, (task, conversation, turn))
    waiting: list[tuple[int, int, tuple[int, int, int]]] = []  # the fleet's queue: (rank, tie, request)
    tasks: list[dict[str, Any]] = []
    requests: dict[int, Conversation] = {}  # a conversation by its id(), for the events that name it
    running, busy, last, end, started = 0, 0.0, 0.0, 0.0, iter(shards)

    def send(task: int, conversation: Conversation, turn: int) -> None:
        left = work(conversation[turn:])
        rank = -turn_priority(0, "larger", left) if settings.chain_priority else 0
        heapq.heappush(waiting, (rank, next(clock), (task, id(conversation), turn)))
        requests[id(conversation)] = conversation

    def start() -> None:
        shard = next(started, None)
        if shard is not None:
            tasks.append({"pending": list(shard), "live": 0, "left": len(shard)})
            fill(len(tasks) - 1)
            if not shard:  # (a shard whose every answer was rejected before generate: its task ends at once)
                heapq.heappush(events, (now + settings.task_gap_s, next(clock), "start", (0, 0, 0)))

    def fill(task: int) -> None:
        state = tasks[task]
        while state["pending"] and state["live"] < share:
            state["live"] += 1
            send(task, state["pending"].pop(0), 0)

    now = 0.0
    for _ in range(settings.shard_tasks):
        heapq.heappush(events, (0.0, next(clock), "start", (0, 0, 0)))
    while events:
        now, _, what, (task, conversation_id, turn) = heapq.heappop(events)
        busy, last = busy + running * (now - last), now
        if what == "start":
            start()
        else:
            running, end = running - 1, now
            conversation = requests[conversation_id]
            if turn + 1 < len(conversation):
                send(task, conversation, turn + 1)
            else:
                state = tasks[task]
                state["live"] -= 1
                state["left"] -= 1
                fill(task)
                if not state["left"]:
                    heapq.heappush(events, (now + settings.task_gap_s, next(clock), "start", (0, 0, 0)))
        while running < settings.slots and waiting:
            _, _, (task, conversation_id, turn) = heapq.heappop(waiting)
            running += 1
            seconds = requests[conversation_id][turn][1] * settings.decode_ms / 1000
            heapq.heappush(events, (now + seconds, next(clock), "answer", (task, conversation_id, turn)))
    return {"utilization": round(busy / (settings.slots * end), 4) if end else 0.0, "window_s": round(end, 1)}


def version_shards(storage: Storage, location: DatasetLocation) -> list[list[list[tuple[int | None, int]]]]:
    """A version's shards as the model takes them, from validate's verdicts (every answer the fleet gave): each
    shard's conversations, each turn (the length prepare expected, None where none; the answer's length)."""
    keys = sorted(k for k in storage.list_keys(f"{location.prefix}/reports/") if k.endswith(VERDICTS_SUFFIX))
    shards = []
    for key in keys:
        table = read_table(storage, key, ["id", "output_len"], optional=("expected_tokens",))
        ids, lengths = table.column("id").to_pylist(), table.column("output_len").to_pylist()
        expected = table.column("expected_tokens").to_pylist() if "expected_tokens" in table.column_names else []
        turns: dict[str, list[tuple[int, int | None, int]]] = {}
        for row, answer_id in enumerate(ids):
            predicted = expected[row] if expected else None
            turns.setdefault(sample_of(answer_id), []).append((turn_of(answer_id) or 0, predicted, lengths[row]))
        shards.append([[(p, n) for _, p, n in sorted(conversation)] for conversation in turns.values()])
    return shards


def run_model(
    run: dict[str, Any], fleet_usage: dict[str, Any], shards: list[list[list[tuple[int | None, int]]]]
) -> dict[str, Any]:
    """The model's figures for a run (`run`: its spec's dict; `fleet_usage`: what the run measured, whose time per
    output token sets the model's; `shards`: version_shards of its datasets, in the order the run generated them):
    `predicted`, fed the lengths prepare expected (a turn without one counts as the median of those known; None when
    none is known), and `with_answer_lengths`, fed the answers' own."""
    slots, tokens = fleet_usage.get("slots"), fleet_usage.get("output_tokens")
    if not slots or not tokens or not any(shards):
        return {"reason": "no answers, or the fleet's slots unknown"}
    held = fleet_usage.get("server_side")  # the servers' busy share: their time per token, where they said
    seconds = held * slots * fleet_usage["window_s"] if held else fleet_usage["request_seconds"]
    tasks = run.get("shard_tasks", 4)
    settings = Settings(
        shard_size=run.get("shard_size", Settings.shard_size),  # (the shards are given: only reported)
        shard_tasks=tasks,
        in_flight=run["concurrency"] * tasks,
        slots=slots,
        longest_first=run.get("longest_first", True),
        chain_priority=run.get("chain_priority", False),
        decode_ms=max(seconds * 1000 / tokens, 1e-6),
    )
    known = sorted(p for shard in shards for c in shard for p, _ in c if p is not None)
    median = known[len(known) // 2] if known else 0
    shards = run_order(shards, settings)

    def fed(length: Callable[[int | None, int], int]) -> list[Shard]:
        return [[[(median if p is None else p, length(p, n)) for p, n in c] for c in shard] for shard in shards]

    answers = drain_shards(fed(lambda _, n: n), settings)
    predicted = drain_shards(fed(lambda p, _: median if p is None else p), settings) if known else None
    return {
        "predicted": predicted and predicted["utilization"],
        "with_answer_lengths": answers["utilization"],
        "window_s": answers["window_s"],
        "answers": sum(len(c) for shard in shards for c in shard),
        "predicted_answers": len(known),
        "settings": {**vars(replace(settings, decode_ms=round(settings.decode_ms, 4)))},
    }


def run_figures(
    storage: Storage, run: dict[str, Any], published: list[dict[str, Any]], fleet_usage: dict[str, Any]
) -> dict[str, Any]:
    """run_model for a run from its published datasets' reports: those it generated (its datasets', in the run's
    order: run_order), each version's every shard (a Resume's figure is its version's whole)."""
    order = {name: i for i, name in enumerate(run["datasets"])}
    generated = sorted((p for p in published if p.get("generation")), key=lambda p: order.get(p["dataset"], 0))
    answers = sum(p.get("stages", {}).get("generate", {}).get("kept", 0) for p in generated)
    if answers > MAX_ANSWERS:
        return {"reason": f"{answers} answers: more than the {MAX_ANSWERS} the model works out in the report task"}
    shards = [
        shard
        for p in generated
        for shard in version_shards(
            storage, DatasetLocation(storage.root_uri, run["profile"], p["dataset"], p["version"])
        )
    ]
    return run_model(run, fleet_usage, shards)
