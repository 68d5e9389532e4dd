"""The drain model (regen.stages.generate.drain_model) over bench_drain.py's datasets, to sweep a run's settings in a
second before one is measured:

    .venv/bin/python bench/drain_model.py [--on-policy 140] [--single 0] [--second 0] [--shard-size 20]
                                          [--shard-tasks 4] [--in-flight 96] [--slots 32] [--chain-priority]
                                          [--datasets N] [--exact]

`--datasets N` works out N datasets of the same shape, drawn with seeds 1 to N, and prints the spread of their
utilization (how much of a row's figure is its one dataset); `--exact` predicts every answer exactly.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

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
    parser.add_argument("--datasets", type=int, default=0, help="the spread over this many datasets (seeds 1 to N)")
    parser.add_argument("--exact", action="store_true", help="every answer predicted exactly")
    args = parser.parse_args()
    settings = Settings(
        args.shard_size, args.shard_tasks, args.in_flight, args.slots, not args.source_order, args.chain_priority
    )

    def night(seed: int | None) -> list[list[list[Turn]]]:
        seeds = (51, 55, 52) if seed is None else (seed, seed + 1000, seed + 2000)
        datasets = [
            single_turn(args.single, 0.5, seed=seeds[0]),
            conversations(args.on_policy, seed=seeds[1]),
            single_turn(args.second, None, seed=seeds[2]),
        ]
        if args.exact:
            datasets = [[[(answer, answer) for _, answer in turns] for turns in rows] for rows in datasets]
        return [d for d in datasets if d]

    if not args.datasets:
        print(drain(night(None), settings))
        return
    figures = sorted(drain(night(seed), settings)["utilization"] for seed in range(1, args.datasets + 1))
    print(
        {
            "datasets": args.datasets,
            "mean": round(statistics.mean(figures), 4),
            "tenth_percentile": figures[len(figures) // 10],
            "min": figures[0],
            "below_0.95": sum(f < 0.95 for f in figures),
        }
    )


if __name__ == "__main__":
    main()
