"""`python -m tools.crash_points`: a sample of the crash points, every one, or the ones named (a failure prints its
command); exit 1 when a point found a violation or missed its operation."""

from __future__ import annotations

import argparse
import json
import logging
import re

from tools.crash_points import harness, outcome_lines, parse_point, result_line, sample, summary
from tools.crash_points.fleet import FLEETS


def main(argv: list[str] | None = None) -> int:
    import tools.crash_points

    parser = argparse.ArgumentParser(
        description=tools.crash_points.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", choices=("local", "s3"), default="local")
    parser.add_argument(
        "--fleet",
        choices=tuple(FLEETS),
        default="sound",
        help="losing: the Resume of a run red past the fleet-loss allowance is the run faulted (crash_points.fleet)",
    )
    parser.add_argument("--sample", type=int, default=None, help="this many points, drawn by --seed (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--match", default=None, help="only the points this regular expression finds in (as a failure prints them)"
    )
    parser.add_argument("--point", action="append", default=[], help="run only this point, as a failure prints it")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    with harness(args.root, args.fleet) as running:
        every = running.points()
        chosen = [p for p in every if re.search(args.match, str(p))] if args.match else every
        points = [parse_point(p) for p in args.point] or sample(chosen, args.sample, args.seed)
        second = sum(p.after is not None for p in every)
        print(
            f"{args.root} ({args.fleet} fleet): {len(every)} crash points in all ({second} in second tries); "
            f"running {len(points)} (seed {args.seed})"
        )
        outcomes = []
        for point in points:
            outcomes.append(outcome := running.run(point))
            for line in outcome_lines(args.root, outcome, args.fleet):
                print(line)
        print(json.dumps(summary(outcomes)))
        print(result_line(args.root, outcomes))
    return 1 if any(o.violations or o.missed for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
