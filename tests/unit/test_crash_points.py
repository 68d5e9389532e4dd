"""Every write a fault can land on: a seeded sample of the crash points of a small complete run (tools/crash_points.py:
every mutating storage operation of every task, failed before it lands, after it lands with its reply lost, and with
the task's process killed right after it), on the local root and on S3 through the fault proxy. After each, as
Airflow would go on (retries, then a Resume when the run is red), the data must be complete and right. The whole
enumeration is bench/bench_crashpoints.py. A failure prints the one-line command that runs its point again."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tools.crash_points import Harness, harness, sample, summary

pytestmark = pytest.mark.crashpoints

SEED = int(os.environ.get("CRASHPOINTS_SEED", "49"))
# Of about 490 each (the S3 runs are whole runs, the local ones start at their task): enough to reach most tasks with
# any seed, few enough to keep the suite under 30 minutes on CI (90 + 15 took 8.7 of its 28 minutes).
SAMPLED = {"local": 40, "s3": 10}


@pytest.fixture(scope="module", params=list(SAMPLED))
def running(request: pytest.FixtureRequest) -> Iterator[Harness]:
    with harness(request.param) as made:
        yield made


def test_a_sample_of_crash_points_leaves_every_version_complete_and_right(running: Harness) -> None:
    points = sample(running.points(), SAMPLED[running.backend], SEED)
    print(f"{running.backend}: {len(running.points())} crash points, {len(points)} sampled with seed {SEED}")
    outcomes = [running.run(point) for point in points]
    table = summary(outcomes)
    print(table)
    failed = [o for o in outcomes if o.violations]
    again = f".venv/bin/python -m tools.crash_points --root {running.backend} --point"
    assert not failed, "\n".join(f"{o.point}: {o.violations}\n  again: {again} '{o.point}'" for o in failed)
    # The faults were injected: a task makes about the operations the fault-free run made (its checkpoints and
    # merges follow the clock, so a few may not be reached).
    assert sum(row["fired"] for row in table.values()) >= 0.9 * len(points)
    assert sum(row["resumed"] for row in table.values()) < len(points)  # most faults are absorbed by a retry


def test_the_harness_leaves_its_process_as_it_found_it() -> None:
    """Other tests run after it in the same worker: the deployment's config and plain storage are theirs again."""
    from regen.pipeline import run_storage

    before, opened = os.environ.get("REGEN_CONFIG"), run_storage.open_storage
    with harness("local"):
        assert os.environ.get("REGEN_CONFIG") != before and run_storage.open_storage is not opened
    assert os.environ.get("REGEN_CONFIG") == before and run_storage.open_storage is opened


def test_the_fault_free_run_publishes_every_dataset_and_a_gap_in_shard_numbers(running: Harness) -> None:
    reference = running._reference_data
    assert sorted(reference) == ["chats", "parts", "tools"]
    assert all(got.records and not got.problems for got in reference.values())
    # Its first part lost most of its prompts at tokenize (too long): one shard where two were numbered.
    assert reference["parts"].shards == ["shard-00000", "shard-00002", "shard-00003"]
    assert len(running._reference_ops) > 30 and "plan" in running._reference_ops
