"""The crash-point harness's own rules (tools/crash_points/), without running a run: a point names its operation by
what it is, so that it meets the same one in every run; a point that meets none is the harness's failure, never
counted as fired; and the records are compared split by split."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tools.crash_points import CrashPoint, Operation, Outcome, parse_point, result_line, summary
from tools.crash_points.checks import Delivered, differences
from tools.crash_points.harness import first_try_kills
from tools.crash_points.memo import memoised
from tools.crash_points.points import RENEW, Arm, Injector

KEY = "crashpoint-mini/tools/cp-1"


@pytest.mark.parametrize(
    "point",
    [
        pytest.param(CrashPoint("plan", Operation("create", "p/.write-check-*", 2), "lost_reply"), id="first-try"),
        pytest.param(
            CrashPoint(
                "generate_group[tools/shard-00000 +1]",
                Operation("delete", f"{KEY}/raw/shard-00000/part-00000.jsonl"),
                "torn",
                after=Operation("put_file", f"{KEY}/raw/shard-00000.jsonl.zst"),
            ),
            id="second-try",
        ),
    ],
)
def test_a_point_parses_as_it_prints(point: CrashPoint) -> None:
    assert parse_point(str(point)) == point


def test_an_operation_is_named_by_method_key_and_occurrence_and_the_armed_one_fires_once() -> None:
    """The nth write of a key is the same operation however many others come before it in a run (a claim written
    or not, a checkpoint part more or fewer); what a try draws afresh (a probe's token) is `*`."""
    injector = Injector()
    injector.start("t", Arm(Operation("put_bytes", f"{KEY}/progress.json", 2), "before"))
    answers = [
        injector.next("replace", f"{KEY}/writer.json"),
        injector.next("put_bytes", f"{KEY}/progress.json"),
        injector.next("put_bytes", "p/.write-check-0123456789abcdef0123"),
        injector.next("put_bytes", f"{KEY}/progress.json"),
        injector.next("put_bytes", f"{KEY}/progress.json"),
    ]
    assert answers == [None, None, None, "before", None]
    assert [str(op) for op in injector.ops] == [
        f"replace {KEY}/writer.json@1",
        f"put_bytes {KEY}/progress.json@1",
        "put_bytes p/.write-check-*@1",
        f"put_bytes {KEY}/progress.json@2",
        f"put_bytes {KEY}/progress.json@3",
    ]
    assert injector.fired == f"put_bytes {KEY}/progress.json@2:before"


def test_a_claim_s_timed_renewal_is_named_apart_from_its_first_write() -> None:
    injector = Injector()
    injector.start("t", None)
    injector.next("replace", f"{KEY}/writer.json")
    renewer = threading.Thread(target=injector.next, args=("replace", f"{KEY}/writer.json"), name="claim-tools")
    renewer.start()
    renewer.join()
    assert injector.ops == [Operation("replace", f"{KEY}/writer.json"), Operation(RENEW, f"{KEY}/writer.json")]


def test_a_point_that_meets_no_operation_is_the_harness_s_failure_not_fired() -> None:
    point = CrashPoint("report", Operation("put_bytes", "nowhere"), "crash")
    met = Outcome(point, True, False, [], {})
    missed = Outcome(point, True, False, [], {}, missed=["try 1 never made put_bytes nowhere@1"], reruns=2)
    assert summary([met, missed])["crash"] == {
        "points": 2,
        "second_try": 0,
        "fired": 1,
        "missed": 1,
        "rerun": 1,
        "resumed": 0,
        "violations": 0,
    }
    assert result_line("local", [met]).startswith("local: green")
    assert result_line("local", [met, missed]).startswith("local: red")


def test_a_record_in_the_other_split_is_a_difference() -> None:
    """Its id and input_ids the same, in validation/ where the fault-free run has it in train/."""
    want = Delivered("v", {"train": {"a": (1,), "b": (2,)}, "validation": {"c": (3,)}, "truncated": {}})
    moved = Delivered("v", {"train": {"a": (1,)}, "validation": {"b": (2,), "c": (3,)}, "truncated": {}})
    assert differences("tools", want, want, "v") == []
    assert differences("tools", moved, want, "v") == [
        "tools: train/ differs: 1 missing, 0 extra, 0 changed",
        "tools: validation/ differs: 0 missing, 1 extra, 0 changed",
    ]


def test_a_first_try_is_killed_halfway_and_once_its_result_landed() -> None:
    """A retry meets half a task's work in storage, and a result whose leftovers were not removed yet."""
    parts = [f"{KEY}/raw/shard-00000/part-0000{n}.jsonl" for n in range(3)]
    made = [Operation("replace", f"{KEY}/writer.json"), *(Operation("put_bytes", part) for part in parts)]
    made += [Operation("put_file", f"{KEY}/raw/shard-00000.jsonl.zst"), *(Operation("delete", p) for p in parts)]
    made += [Operation("put_bytes", f"{KEY}/reports/shard-0000{n}.generate.json") for n in range(4)]
    raw, halfway = made[4], made[(len(made) - 1) // 2]
    assert halfway.method == "delete" and first_try_kills(made) == [halfway, raw]
    assert first_try_kills(made[:9]) == [raw]  # halfway is the raw file itself: one kill
    assert first_try_kills(made[:4]) == [made[1]] and first_try_kills([]) == []


def test_the_harness_draws_a_report_s_plots_once_for_the_data_they_draw(tmp_path: Path) -> None:
    """A crash point's run publishes the reference run's data again: its plots are the ones drawn first, byte for
    byte; other data, or other counts in the report, are drawn anew. The run's timing and cost are no part of a plot."""
    import pyarrow as pa

    from regen.stages.publish import dataset_report

    def verdicts(longest: int) -> pa.Table:
        lengths = {"prompt_len": [3, longest], "output_len": [5, 9], "reasoning_len": [1, 2]}
        return pa.table({name: pa.array(values, pa.int64()) for name, values in lengths.items()})

    report = {"verdicts": {"ok": 2}, "throughput": {"seconds": 1.0}}
    drawn = dataset_report._plots(verdicts(7), report)
    with memoised(tmp_path):
        first = dataset_report._plots(verdicts(7), report)
        again = dataset_report._plots(verdicts(7), {**report, "throughput": {"seconds": 2.5}, "cost": {"usd": 1.0}})
        other = dataset_report._plots(verdicts(8), report)
        counted = dataset_report._plots(verdicts(7), {**report, "verdicts": {"ok": 1, "invalid": 1}})
    assert first == again == drawn and set(first) == {"lengths.png", "verdicts.png"}
    assert other["lengths.png"] != first["lengths.png"] and counted["verdicts.png"] != first["verdicts.png"]
    assert len(list((tmp_path / "plots").glob("*.pickle"))) == 3
