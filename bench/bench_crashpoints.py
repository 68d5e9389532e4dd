"""Every crash point of a small complete run (tools/crash_points/), on the local root and on S3 through the fault
proxy: every mutating storage operation of every task's first try, and of its second after the first was killed
(halfway, or once its result landed), each named by what it is, x the faults (before it lands, its reply lost after
it landed, the task SIGKILLed after it landed, and on the local root a write killed before its rename), each run on
as Airflow would and checked after. Prints, per root and fault, the crash points run, the faults that met their
operation and those that missed it (the harness's failures), the runs that ended red and were resumed, and the
violations; and the enumeration's time against the fault-free run's, measured in the same run (the baseline: the
stack, the traced run and the second tries' recording).

    .venv/bin/python bench/bench_crashpoints.py                      # both roots, every point (hours here)
    .venv/bin/python bench/bench_crashpoints.py --root s3 --sample 50 --seed 3
    .venv/bin/python bench/bench_crashpoints.py --root s3 --part 0/2 & ... --part 1/2    # two processes, two cores
    .venv/bin/python bench/bench_crashpoints.py --root local --fleet losing    # the Resume of a run red on fleet losses

`--skip LOG` (repeatable) leaves out the points an earlier enumeration's `--log` holds: an enumeration cut short goes
on, in as many parts as the machine takes, and its figures are the logs' lines together.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report_file import save
from tools.crash_points import harness, outcome_lines, result_line, sample, summary
from tools.crash_points.fleet import FLEETS


def enumerate_root(
    root: str,
    count: int | None,
    seed: int,
    part: tuple[int, int],
    log: Path | None = None,
    fleet: str = "sound",
    done: frozenset[str] = frozenset(),
) -> dict[str, object]:
    started = time.monotonic()
    with harness(root, fleet) as running:
        every = running.points()  # (the second tries recorded)
        baseline_s = time.monotonic() - started  # the stack, the traced fault-free run, the second tries recorded
        index, parts = part
        points = [p for p in sample(every, count, seed) if str(p) not in done][index::parts]
        second = sum(p.after is not None for p in every)
        print(
            f"{root} ({fleet} fleet): {len(every)} crash points ({len(running._reference_ops)} tasks, {second} in "
            f"second tries); running {len(points)}"
        )
        outcomes, began = [], time.monotonic()
        for number, point in enumerate(points, 1):
            outcomes.append(outcome := running.run(point))
            if log is not None:  # a line a point as it is run: an enumeration cut short still counts what it ran
                with log.open("a") as lines:
                    line = {"point": str(point), "missed": outcome.missed, "resumed": outcome.resumed}
                    print(json.dumps({**line, "violations": outcome.violations}), file=lines)
            for line in outcome_lines(root, outcome):
                print(f"  {line}")
            if number % 50 == 0:
                print(f"  {number}/{len(points)} in {time.monotonic() - began:.0f} s")
        elapsed = time.monotonic() - began
    table = summary(outcomes)
    for fault, row in table.items():
        print(f"  {fault:>10}: {row}")
    print(f"  {result_line(root, outcomes)}")
    per_point = elapsed / max(len(points), 1)
    print(
        f"  {elapsed:.0f} s for {len(points)} points: {per_point:.2f} s a point, {per_point / baseline_s:.2f}x the "
        f"fault-free run with its stack and recording ({baseline_s:.1f} s)"
    )
    return {
        "points": len(every),
        "run": len(points),
        "by_fault": table,
        "seconds": elapsed,
        "baseline_s": baseline_s,
        "violations": sum(bool(o.violations) for o in outcomes),
        "missed": sum(bool(o.missed) for o in outcomes),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", choices=("local", "s3"), action="append", help="default: both")
    parser.add_argument("--sample", type=int, default=None, help="this many points a root, drawn by --seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fleet", choices=FLEETS, default="sound", help="losing: tools/crash_points/fleet.py")
    parser.add_argument("--part", default="0/1", help="i/n: every n-th point from the i-th, to run n processes at once")
    parser.add_argument("--report", type=Path, help="write the figures as JSON here")
    parser.add_argument("--log", type=Path, help="append each point's outcome here as a JSON line, as it is run")
    parser.add_argument("--skip", type=Path, action="append", default=[], help="a --log whose points are not run again")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    index, parts = (int(n) for n in args.part.split("/"))
    roots = args.root or ["local", "s3"]
    done = frozenset(json.loads(line)["point"] for log in args.skip for line in log.read_text().splitlines())
    figures = {
        root: enumerate_root(root, args.sample, args.seed, (index, parts), args.log, args.fleet, done) for root in roots
    }
    if args.report:
        save(args.report, figures)
    return 1 if any(f["violations"] or f["missed"] for f in figures.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
