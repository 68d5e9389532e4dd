"""`python -m tools.crash_points`: a sample of the crash points, every one, or the ones named (a failure prints its
command); exit 1 when a point found a violation or missed its operation."""

from __future__ import annotations

import argparse
import json
import logging

from tools.crash_points import harness, outcome_lines, parse_point, result_line, sample, summary


def main(argv: list[str] | None = None) -> int:
    import tools.crash_points

    parser = argparse.ArgumentParser(
        description=tools.crash_points.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", choices=("local", "s3"), default="local")
    parser.add_argument("--sample", type=int, default=None, help="this many points, drawn by --seed (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--point", action="append", default=[], help="run only this point, as a failure prints it")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    with harness(args.root) as running:
        every = running.points()
        points = [parse_point(p) for p in args.point] or sample(every, args.sample, args.seed)
        second = sum(p.after is not None for p in every)
        print(
            f"{args.root}: {len(every)} crash points in all ({second} in second tries); running {len(points)} "
            f"(seed {args.seed})"
        )
        outcomes = []
        for point in points:
            outcomes.append(outcome := running.run(point))
            for line in outcome_lines(args.root, outcome):
                print(line)
        print(json.dumps(summary(outcomes)))
        print(result_line(args.root, outcomes))
    return 1 if any(o.violations or o.missed for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
