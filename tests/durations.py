"""Each work unit's seconds in a recent whole run of the suite (tests/durations.json), so that pytest-xdist's two
workers are handed the units longest first (tests/conftest.py) and neither idles at the end while the other runs a
unit of minutes. Only an order: a unit the file does not know gets an estimate by its kind, and a stale figure only
packs the workers less well.

Recorded from a run's `--durations=0` report:

    PYTEST_ADDOPTS="--durations=0 --durations-min=1" make test 2>&1 | tee var/suite.log
    .venv/bin/python -m tests.durations var/suite.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

FILE = Path(__file__).with_name("durations.json")
REAL_SERVER_MODULES = {
    "tests/e2e/test_real_sglang.py",
    "tests/e2e/test_real_sglang_chat.py",
    "tests/e2e/test_simulator_matches_real_sglang.py",
}


def work_unit(nodeid: str) -> str:
    """The unit one xdist worker runs whole: a parity test alone, the real server's modules together, else a module."""
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/parity/"):
        return nodeid
    return "real SGLang server" if module in REAL_SERVER_MODULES else module


def recorded() -> dict[str, float]:
    return json.loads(FILE.read_text()) if FILE.exists() else {}


def estimate(unit: str, tests: int, seconds: dict[str, float]) -> float:
    """The unit's recorded seconds, else a guess by its kind: the real server's and end-to-end modules minutes, a
    parity test a minute or two, another test a second."""
    if unit in seconds:
        return seconds[unit]
    if unit == "real SGLang server":
        return 600.0
    if "/e2e/" in unit or unit.endswith("test_crash_points.py"):
        return 300.0
    return 100.0 if "/parity/" in unit else float(tests)


def from_report(text: str) -> dict[str, float]:
    """Seconds per unit (setup, call and teardown summed) from pytest's `--durations=0` lines."""
    seconds: dict[str, float] = defaultdict(float)
    for taken, nodeid in re.findall(r"^([\d.]+)s (?:setup|call|teardown)\s+(\S+)", text, re.MULTILINE):
        seconds[work_unit(nodeid)] += float(taken)
    return {unit: round(total) for unit, total in sorted(seconds.items(), key=lambda kv: -kv[1]) if total >= 5}


if __name__ == "__main__":
    FILE.write_text(json.dumps(from_report(Path(sys.argv[1]).read_text()), indent=1) + "\n")
    print(f"{FILE}: {len(recorded())} units")
