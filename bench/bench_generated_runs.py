"""Generated runs at scale: tests/contract/test_generated_runs.py's state machine for thousands of runs, every
problem collected with the steps that made it (not stopped at the first), and what the runs covered counted.

    .venv/bin/python bench/bench_generated_runs.py --examples 500 --seed 1 --report var/bench/generated.json

Pointed at another checkout's library (PYTHONPATH=that/include:that), it says which breaks the contract finds there
by itself: docs/benchmarks.md#generated-runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

os.environ["REGEN_GENERATED_COLLECT"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def signature(problem: str) -> str:
    """A problem's kind: its text without the dataset, version, ids and numbers."""
    kind = problem.split(": ", 1)[1] if re.match(r"^(d\d+/|run-|fresh-)", problem) else problem
    return re.sub(r"[0-9a-f]{20}\S*|\d+(\.\d+)?", "#", kind)[:160]


def summary(args: argparse.Namespace, generated: Any, seconds: float, batches: int) -> dict[str, Any]:
    """The figures of the batches run so far: runs, what they covered, every kind of problem with its first steps."""
    kinds: dict[str, dict[str, Any]] = {}
    for found in generated.FOUND:
        for problem in found["problems"]:
            entry = kinds.setdefault(signature(problem), {"count": 0, "first": problem, "steps": found["steps"]})
            entry["count"] += 1
    covered = dict(sorted(generated.COVERED.items()))
    return {
        "examples": min(args.examples, batches * args.batch),
        "seed": args.seed,
        "batches": batches,
        "runs": covered.get("runs", 0),
        "seconds": round(seconds, 1),
        "seconds_per_run": round(seconds / max(1, covered.get("runs", 1)), 2),
        "examples_with_problems": len(generated.FOUND),
        "problems": kinds,
        "covered": covered,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=500, help="state machine examples (each a few runs)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100, help="examples per batch, each seeded seed*1000+batch")
    parser.add_argument("--report", type=Path, help="the figures so far, rewritten after every batch")
    args = parser.parse_args()

    from hypothesis import HealthCheck, Phase, seed, settings
    from hypothesis.stateful import run_state_machine_as_test

    from tests.contract import test_generated_runs as generated

    started = time.monotonic()
    batches = -(-args.examples // args.batch)
    for batch in range(batches):  # the figures so far written after each batch: a long run reports as it goes
        machine = seed(args.seed * 1000 + batch)(generated.GeneratedRuns)
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=min(args.batch, args.examples - batch * args.batch),
                stateful_step_count=6,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            ),
        )
        report = summary(args, generated, time.monotonic() - started, batch + 1)
        if args.report:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(json.dumps(report, indent=1, default=str))
        print(
            f"batch {batch + 1}/{batches}: {report['runs']} runs, {len(report['problems'])} kinds of problem, "
            f"{report['seconds']} s",
            flush=True,
        )
    print(json.dumps({k: v for k, v in report.items() if k != "problems"}, indent=1))
    for kind, entry in sorted(report["problems"].items(), key=lambda item: -int(str(item[1]["count"]))):
        print(f"{entry['count']:>5}  {kind}\n       first: {str(entry['first'])[:300]}")
        print("       steps: " + "\n              ".join(map(str, entry["steps"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
