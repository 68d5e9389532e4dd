"""A model of the drain: the whole-run fleet utilization a run's settings give, in a second where bench_drain.py takes
minutes, so that settings can be swept before one is measured.

    .venv/bin/python bench/drain_model.py [--on-policy 140] [--single 0] [--second 0] [--shard-size 20]
                                          [--shard-tasks 4] [--in-flight 96] [--slots 32] [--chain-priority]

What it models, each as the pipeline does it: each dataset dealt into shards of `shard_size` conversations (a
single-turn row is a conversation of one turn), the longest predicted work first (an on-policy conversation's: the sum
of its turns' reference answers; a single-turn row's: its reference, or a second version's last answer) or in the
source's order; the shards run as the DAG maps them (dataset after dataset), `shard_tasks` at a time (the pool), the
next one `task_gap_s` after a task ends (Airflow's scheduling of the next mapped task); each task keeps at most
`in_flight / shard_tasks` requests out, its conversations longest first, a conversation's next turn sent when its
previous one is answered; the servers' `slots` admit their waiting queue by arrival, or with `--chain-priority` by the
level regen.stages.generate.conversations.turn_priority gives the work a request's conversation has left; an answer
takes its tokens x `decode_ms`. What it leaves out: prefill, the prefix cache, the servers' separate queues (one queue
for the fleet), checkpoints, faults, and the length fit refining a first version's order as answers arrive.

bench_drain.py prints this model's figure beside each run it measures: the differential that keeps the model honest
(docs/benchmarks.md has both).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
from dataclasses import dataclass

from regen.stages.generate.conversations import turn_priority

Turn = tuple[int, int]  # (predicted tokens: the reference answer's or the last version's, the answer's tokens)


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


def deal(dataset: list[list[Turn]], settings: Settings) -> list[list[list[Turn]]]:
    """A dataset's shards, each a list of conversations in the order its task sends them."""
    rows = list(dataset)
    if settings.longest_first:
        rows.sort(key=lambda turns: -sum(predicted for predicted, _ in turns))
    return [rows[i : i + settings.shard_size] for i in range(0, len(rows), settings.shard_size)]


def drain(datasets: list[list[list[Turn]]], settings: Settings) -> dict[str, float]:
    """The run's utilization (busy slot-seconds over slots x first request to last answer) and its window."""
    shards = [shard for dataset in datasets for shard in deal(dataset, settings)]
    share = -(-settings.in_flight // settings.shard_tasks)
    clock = itertools.count()  # ties by order of events
    events: list[tuple[float, int, str, tuple[int, int, int]]] = []  # (when, tie, what, (task, conversation, turn))
    waiting: list[tuple[int, int, tuple[int, int, int]]] = []  # the fleet's queue: (rank, tie, request)
    tasks: list[dict[str, list[list[Turn]] | int]] = []
    requests: dict[int, list[Turn]] = {}  # a conversation by its id(), for the events that name it
    running, busy, last, end, started = 0, 0.0, 0.0, 0.0, iter(shards)

    def send(task: int, conversation: list[Turn], turn: int) -> None:
        left = sum(predicted for predicted, _ in conversation[turn:])
        rank = -turn_priority(0, "larger", left) if settings.chain_priority else 0
        heapq.heappush(waiting, (rank, next(clock), (task, id(conversation), turn)))
        requests[id(conversation)] = conversation

    def start() -> None:
        shard = next(started, None)
        if shard is not None:
            tasks.append({"pending": list(shard), "live": 0, "left": len(shard)})
            fill(len(tasks) - 1)

    def fill(task: int) -> None:
        state = tasks[task]
        while state["pending"] and state["live"] < share:
            state["live"] += 1
            send(task, state["pending"].pop(0), 0)

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


def conversations(count: int, max_turns: int = 8, median: int = 500, seed: int = 55) -> list[list[Turn]]:
    """bench_drain.py's on-policy dataset: each turn's reference lognormal around `median` tokens (sigma 1) and the
    target's answer that times lognormal(0, 0.5), both at most 6,000 tokens."""
    draw, rows = random.Random(seed), []
    for _ in range(count):
        turns = []
        for _ in range(draw.randint(1, max_turns)):
            reference = max(1, min(6000, round(median * math.exp(draw.gauss(0.0, 1.0)))))
            turns.append((reference, max(2, min(6000, round(reference * math.exp(0.5 * draw.gauss(0.0, 1.0)))))))
        rows.append(turns)
    return rows


def single_turn(count: int, noise: float | None, median: int = 500, seed: int = 51) -> list[list[Turn]]:
    """Single-turn rows whose answers are lognormal around `median` tokens (sigma 1, 25 to 8,000), each predicted by
    a reference that many times lognormal(0, `noise`), or exactly (None: a second version's last answers)."""
    draw = random.Random(seed)
    rows = []
    for _ in range(count):
        answer = max(25, min(8000, round(median * math.exp(draw.gauss(0.0, 1.0)))))
        predicted = answer if noise is None else max(1, round(answer * math.exp(noise * draw.gauss(0.0, 1.0))))
        rows.append([(predicted, answer)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--on-policy", type=int, default=140, help="conversations of 1 to 8 turns")
    parser.add_argument("--single", type=int, default=0, help="single-turn rows of a first version (references)")
    parser.add_argument("--second", type=int, default=0, help="single-turn rows of a second version")
    parser.add_argument("--shard-size", type=int, default=20)
    parser.add_argument("--shard-tasks", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=96)
    parser.add_argument("--slots", type=int, default=32, help="the fleet's running slots")
    parser.add_argument("--source-order", action="store_true", help="longest_first off")
    parser.add_argument("--chain-priority", action="store_true")
    args = parser.parse_args()
    datasets = [single_turn(args.single, 0.5), conversations(args.on_policy), single_turn(args.second, None, seed=52)]
    settings = Settings(
        args.shard_size, args.shard_tasks, args.in_flight, args.slots, not args.source_order, args.chain_priority
    )
    print(drain([d for d in datasets if d], settings))


if __name__ == "__main__":
    main()
