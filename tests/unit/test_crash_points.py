"""Every write a fault can land on: a seeded sample of the crash points of a small complete run (tools/crash_points/:
every mutating storage operation of every task's first try, and of its second after the first was killed,
failed before it lands, after it lands with its reply lost, with the task's process killed right after it, and on the
local root killed before its rename), on the local root and on S3 through the fault proxy. After each, as Airflow
would go on (retries, then a Resume when the run is red), the data must be complete and right, split by split. The
whole enumeration is bench/bench_crashpoints.py. A failure prints the one-line command that runs its point again."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tools.crash_points import CrashPoint, Harness, Operation, harness, outcome_lines, result_line, sample, summary
from tools.crash_points.harness import MEET_TRIES
from tools.crash_points.points import FAULTS, RENEW, TORN

pytestmark = pytest.mark.crashpoints

SEED = int(os.environ.get("CRASHPOINTS_SEED", "49"))
# Of about 1,980 (local: first and second tries, four faults) and 1,550 (S3: three): enough to reach most kinds of
# point with any seed, few enough to keep the suite under 30 minutes on CI (the S3 runs cost about three local ones).
SAMPLED = {"local": 40, "s3": 10}


@pytest.fixture(scope="module", params=list(SAMPLED))
def running(request: pytest.FixtureRequest) -> Iterator[Harness]:
    with harness(request.param) as made:
        yield made


def test_a_sample_of_crash_points_leaves_every_version_complete_and_right(running: Harness) -> None:
    points = sample(running.points(), SAMPLED[running.backend], SEED)
    print(f"{running.backend}: {len(running.points())} crash points, {len(points)} sampled with seed {SEED}")
    outcomes = [running.run(point) for point in points]
    print(summary(outcomes), result_line(running.backend, outcomes))
    failed = [o for o in outcomes if o.violations or o.missed]
    assert not failed, "\n".join(line for o in failed for line in outcome_lines(running.backend, o))
    assert sum(o.resumed for o in outcomes) < len(points)  # most faults are absorbed by a retry


def test_the_harness_leaves_its_process_as_it_found_it() -> None:
    """Other tests run after it in the same worker: the deployment's config, plain storage and fresh claims left
    alone are theirs again."""
    from moto import backends

    from regen import claims
    from regen.pipeline import run_storage
    from regen.stages.publish import dataset_report

    before, opened, held = os.environ.get("REGEN_CONFIG"), run_storage.open_storage, run_storage.held
    fresh, plots, listed = claims.FRESH_SHARE, dataset_report._plots, backends.list_of_moto_modules
    with harness("local"):
        assert os.environ.get("REGEN_CONFIG") != before and run_storage.open_storage is not opened
        assert dataset_report._plots is not plots and backends.list_of_moto_modules is not listed
    assert os.environ.get("REGEN_CONFIG") == before and run_storage.open_storage is opened
    assert run_storage.held is held
    assert fresh == claims.FRESH_SHARE
    assert dataset_report._plots is plots and backends.list_of_moto_modules is listed


def test_the_fault_free_run_publishes_every_dataset_both_splits_and_a_gap_in_shard_numbers(running: Harness) -> None:
    reference = running._reference_data
    assert sorted(reference) == ["chats", "parts", "tools"]
    assert all(not got.problems for got in reference.values())
    # Held-out prompts of every dataset: a record in the other split than the fault-free run's is a violation.
    assert all(got.records["train"] and got.records["validation"] for got in reference.values())
    # Its first part lost most of its prompts at tokenize (too long): one shard where two were numbered.
    assert reference["parts"].shards == ["shard-00000", "shard-00002", "shard-00003"]
    assert len(running._reference_ops) > 30 and "plan" in running._reference_ops


def test_every_task_s_points_include_its_claim_and_the_claim_s_renewal(running: Harness) -> None:
    """A task replayed from a restored root finds its version's claim old and writes it first: the traced run's
    tasks write it too, so a point names the operation its replay makes, and the claim is a point of every task
    that writes a version; its timed renewal is one more."""
    writers = [t for t in running._reference_ops if t.split("[")[0].endswith(("_group", "_part", "_dataset"))]
    for task in writers:
        first = running._reference_ops[task][0]
        assert first.key.endswith("/writer.json") and first.method in ("create", "replace"), (task, first)
    renewals = {p.task for p in running.points() if p.op.method == RENEW and p.after is None}
    assert {t for t in writers if not t.startswith("verify_dataset")} <= renewals


@pytest.mark.parametrize("running", ["local"], indirect=True)  # the harness's own rule: one root shows it
def test_a_point_whose_operation_no_try_makes_fails_the_harness_and_is_not_fired(running: Harness) -> None:
    outcome = running.run(CrashPoint("report", Operation("put_bytes", "crashpoint-mini/runs/nowhere.json"), "crash"))
    assert outcome.missed and outcome.reruns == MEET_TRIES - 1 and not outcome.violations
    assert summary([outcome])["crash"]["fired"] == 0 and result_line("local", [outcome]).startswith("local: red")


def test_second_tries_reach_what_only_a_retry_does(running: Harness) -> None:
    """A prepare killed halfway left prompts its retry deletes as stale; a generate killed once its shard's raw
    answers landed left checkpoints its retry removes as leftovers. Those deletes are points too, and a crash right
    after one leaves the version complete and right."""
    second = [p for p in running.points() if p.after is not None and p.fault == "crash" and p.op.method == "delete"]
    stale = [p for p in second if p.task == "prepare_dataset[parts]"]
    assert stale and all(p.op not in running._reference_ops[p.task] for p in stale)  # the first try made none
    leftover = [
        p
        for p in second
        if p.task == "generate_group[chats/shard-00000]" and p.after.key.endswith("/raw/shard-00000.jsonl.zst")
    ]
    assert leftover and all("/raw/shard-00000/" in p.op.key for p in leftover)
    for point in (stale[0], leftover[0]):
        outcome = running.run(point)
        assert not outcome.missed and not outcome.violations, outcome


@pytest.mark.parametrize("running", ["local"], indirect=True)  # an S3 object lands whole or not at all
def test_a_write_killed_before_its_rename_leaves_no_temporary_file_in_the_root(
    running: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local write killed mid-write leaves its temporary file; the version's delivery removes it, and the harness
    checks every point's root for one."""
    from regen.pipeline.run_storage import RunStorage

    [point] = [
        p
        for p in running.points()
        if p.fault == TORN and p.after is None and p.op.key.endswith("tools/cp-1/train/shard-00000.parquet")
    ]
    assert running.run(point).violations == []
    monkeypatch.setattr(RunStorage, "remove_stale_temporaries", lambda *_: None)
    [left] = running.run(point).violations
    assert left.startswith("1 temporary files left by killed writers: ['crashpoint-mini/tools/cp-1/train/.tmp-")


@pytest.mark.parametrize("running", ["local"], indirect=True)  # the check reads storage alike on both roots
def test_a_retry_that_asks_a_checkpointed_answer_again_is_a_violation(
    running: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generate try killed after it checkpointed answers: its retry must ask only what no checkpoint held. Planted:
    each try forgets one checkpointed answer when it decides what to ask (and only then, so the shard still ends
    whole), which re-asks one answer, fewer than the count bound on answers asked again lets through."""
    from regen.stages.generate import generate

    [point] = [
        p
        for p in running.points()
        if p.task == "generate_group[tools/shard-00002]"
        and p.after is None
        and p.fault == "crash"
        and p.op.key.endswith("/raw/shard-00002.generation.json")
    ]
    load, calls = generate.load_checkpoints, []

    def forgetting(storage: Any, shard: Any) -> Any:
        found = load(storage, shard)
        if not calls and found.answers:  # a try's first read: what it asks
            found.answers.pop(min(found.answers))
        calls.append(shard)
        return found

    monkeypatch.setattr(generate, "load_checkpoints", forgetting)
    outcome = running.run(point)
    assert outcome.extra_generations == 1  # within the count bound (IN_FLIGHT, CHECKPOINT_EVERY): the exact check
    assert [v.split(", e.g.")[0] for v in outcome.violations] == ["1 checkpointed answers asked again by a later try"]


KEY = "crashpoint-mini/tools/cp-1"
REPORT_FILE = f"{KEY}/report/*/verdicts.png"  # a publish try's report folder is drawn afresh (`*`)


def publish_retry(op: Operation, fault: str) -> CrashPoint:
    """publish's second try, its first killed with half its report written."""
    return CrashPoint("publish_dataset[tools]", op, fault, after=Operation("put_bytes", REPORT_FILE))


@pytest.mark.parametrize(
    "point",
    [
        pytest.param(
            publish_retry(Operation("create", f"{KEY}/manifest.json"), "lost_reply"),
            id="the-winner-died-before-its-cleanup",
        ),
        pytest.param(publish_retry(Operation("delete", REPORT_FILE), "before"), id="its-cleanup-failed"),
    ],
)
def test_a_published_version_keeps_no_report_of_a_publish_try_that_died(running: Harness, point: CrashPoint) -> None:
    """Found by second-try points: publish's first try killed with half its report written; then its second's
    manifest landing with its reply lost (the try fails before removing the first's report, and the third finds the
    version published), or its removal of that report failing (logged, and the task green). The first's files were
    left, unlisted, and the version failed `regen verify`."""
    outcome = running.run(point)
    assert not outcome.missed and outcome.violations == []


# A losing fleet (tools/crash_points/fleet.py): the run faulted is the Resume of a run red past the fleet-loss
# allowance, on a fleet mended but for one prompt. Its points are some 1,450 (local); a few are run here.
LOSING_SAMPLED, LOSING_OF_LOSSES = 3, 2


@pytest.fixture(scope="module")
def losing() -> Iterator[Harness]:
    with harness("local", "losing") as made:
        yield made


def of_losses(point: CrashPoint) -> bool:
    """A write made only when the fleet lost answers: the version's fleet-losses.jsonl (publish's, reopen's delete),
    or a finished shard's report or raw file deleted by generate (reopen)."""
    key, deleted = point.op.key, point.op.method == "delete" and point.task.startswith("generate_")
    return key.endswith("/fleet-losses.jsonl") or (
        deleted and re.search(r"/(reports|raw)/shard-\d+\.(json|jsonl\.zst)$", key) is not None
    )


def test_a_losing_fleet_s_points_include_reopen_s_writes_and_the_fleet_losses_list(losing: Harness) -> None:
    """The Resume reopens parts' finished shards that hold fleet losses (their reports, the version's list and raw
    files deleted, each's answers and rejections written as a checkpoint part), asks chats' shard that failed early
    for its losses again, and publishes parts with the answer still lost listed in fleet-losses.jsonl: each of those
    operations is a crash point, first try and second. Fails when the fleet stops losing answers."""
    key, reopening = f"crashpoint-mini/parts/{losing.version}", "generate_group[parts/shard-00000 +1]"
    first = {(p.task, str(p.op)) for p in losing.points() if p.after is None}
    want = [
        *[(reopening, f"delete {key}/{k}@1") for k in ("reports/shard-00000.json", "fleet-losses.jsonl")],
        (reopening, f"put_bytes {key}/raw/shard-00000/part-00000.jsonl@1"),  # reopen's part: no checkpoint before it
        *[(reopening, f"delete {key}/{k}@1") for k in ("raw/shard-00000.jsonl.zst", "reports/shard-00002.json")],
        ("publish_dataset[parts]", f"put_bytes {key}/fleet-losses.jsonl@1"),
        (
            "generate_group[chats/shard-00000]",
            f"put_file crashpoint-mini/chats/{losing.version}/raw/shard-00000.jsonl.zst@1",
        ),
    ]
    assert [w for w in want if w not in first] == []
    assert {p.fault for p in losing.points() if of_losses(p) and p.after is None} == {*FAULTS, TORN}
    assert any(of_losses(p) for p in losing.points() if p.after is not None)  # a retry's too
    assert "533c3e382d1d309e156b" in losing._reference_data["parts"].rejected  # lost still (listed): kept rejected


def test_a_sample_of_a_losing_fleet_s_points_leaves_every_version_complete_and_right(losing: Harness) -> None:
    every = losing.points()
    points = sample([p for p in every if of_losses(p)], LOSING_OF_LOSSES, SEED)
    points += [p for p in sample(every, LOSING_SAMPLED, SEED) if p not in points]
    outcomes = [losing.run(point) for point in points]
    print(f"local, losing fleet: {len(every)} crash points; {summary(outcomes)} {result_line('local', outcomes)}")
    failed = [o for o in outcomes if o.violations or o.missed]
    assert not failed, "\n".join(line for o in failed for line in outcome_lines("local", o, "losing"))


def test_a_resume_killed_once_a_lost_turn_was_answered_asks_the_turns_it_ended_again(losing: Harness) -> None:
    """chats' shard failed early in the first run: a conversation's first turn lost to the fleet, its later two
    rejected as ended by it. The Resume's try answers the first two turns, flushes them (a checkpoint part) and is
    killed; its retry finds the first turn answered and must ask the third again (`Checkpoints.ask_again` releases a
    turn ended by a turn a later try answered). Before, it kept the third rejected as ended by a turn it published:
    the version was published one answer short of the fault-free Resume's."""
    key = f"crashpoint-mini/chats/{losing.version}/raw/shard-00000/part-00004.jsonl"
    outcome = losing.run(CrashPoint("generate_group[chats/shard-00000]", Operation("put_bytes", key), "crash"))
    assert not outcome.missed and outcome.violations == []
