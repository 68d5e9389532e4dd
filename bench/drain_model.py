"""The drain model (regen.stages.generate.drain_model) over bench_drain.py's datasets, to sweep a run's settings in a
second before one is measured:

    .venv/bin/python bench/drain_model.py [--on-policy 140] [--single 0] [--second 0] [--shard-size 20]
                                          [--shard-tasks 4] [--in-flight 96] [--slots 32] [--chain-priority]
"""

from __future__ import annotations

import argparse
import math
import random

from regen.stages.generate.drain_model import Settings, Turn, drain


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
