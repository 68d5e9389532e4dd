"""Day-to-day operations through a real scheduler, as docs/operations.md tells an operator to do them: a fleet that dies
mid-run, a task process killed mid-generate, a failed run completed from a new run, nights backfilled. The recovery
commands are taken from docs/operations.md and run exactly as written there.

The stack's config is a nightly deployment's: a schedule, the fleet at a fixed local port (started and killed by the
tests), an S3 storage root, short retry delays so that a failure shows within seconds.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from regen.layout import version_from_run_id
from regen.sglang.client import answer_id_of
from tests.conftest import kept_keys
from tools.devstack import ADMIN, DAG_ID, Simulator, Stack, free_port, start_simulator, wait_until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BUCKET = "regen-ops"
# Answers each dataset asks for: one per prompt, or one per turn of C1's on-policy conversations (8 of them here).
ANSWERS = {"B1_glaive": 36, "B2_opencodeinstruct": 48, "C1_multiturn": 21}
SLOW = ("--decode-ms-per-token", "20", "--max-running", "8")  # about 25 s for both datasets: time to kill it
IN_FLIGHT, SHARD_TASKS = 16, 4
HEARTBEAT_S = 20  # the scheduler's heartbeat timeout: a task whose supervisor was killed is retried after it
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # a task runner's title names its TI


class Operations:
    def __init__(self, stack: Stack, port: int) -> None:
        self.stack, self.port = stack, port
        self.failed_night = ""  # the first scheduled run, red for want of a fleet
        self.published_version = ""  # the version that completed it, at the default storage root

    def fleet(self, *args: str) -> Simulator:
        return start_simulator(self.stack.home, *args, port=self.port)

    def readme(self, *blocks: str, **env: str) -> str:
        """The operations page's recovery blocks, run by bash exactly as written, with the token block first."""
        script = "\n".join(readme_block(name) for name in ("token", *blocks))
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        variables = {"AIRFLOW_URL": self.stack.api, "AIRFLOW_USER": ADMIN[0], "AIRFLOW_PASSWORD": ADMIN[1], **env}
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            env={**self.stack.env(), "PATH": path, **variables},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{blocks}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def first_night(self) -> str:
        """The scheduled run that unpausing the DAG starts at once (its latest night, no catch-up), once it has ended:
        made by the module's first test, or by a later test run alone, which must not share the fleet with it."""
        if not self.failed_night:
            wait_until("DAG parsed", lambda: self.stack.call("GET", f"/dags/{DAG_ID}"), 180)
            self.stack.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
            scheduled = wait_until(
                "a scheduled run", lambda: [r for r in self.runs() if r["run_type"] == "scheduled"], 120
            )
            assert len(scheduled) == 1
            self.failed_night = scheduled[0]["dag_run_id"]
            self.stack.wait_for_run(self.failed_night, 180)
        return self.failed_night

    def runs(self) -> list[dict[str, Any]]:
        return list(self.stack.call("GET", f"/dags/{DAG_ID}/dagRuns", params={"limit": 100})["dag_runs"])

    def wait_until_rerun(self, run_id: str, timeout_s: float = 300) -> str:
        """The run's state once it left `failed` (a clear re-queues it) and finished again."""
        wait_until(f"{run_id} re-queued", lambda: self.state(run_id) != "failed", 60)
        return self.stack.wait_for_run(run_id, timeout_s)

    def state(self, run_id: str) -> str:
        return str(self.stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"])

    def train_ids(self, report: dict[str, Any]) -> Counter[str]:
        """Every published training record's sample id (trained on or held out), over the run's datasets."""
        s3, ids = self.stack.s3_client(), Counter[str]()
        for dataset in report["datasets"]:
            manifest_key = dataset["manifest"].removeprefix(f"s3://{BUCKET}/")
            manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=manifest_key)["Body"].read())
            root = manifest["root"].removeprefix(f"s3://{BUCKET}/") + "/"
            for key in (key for shard in manifest["shards"] for key in kept_keys(shard)):
                body = s3.get_object(Bucket=BUCKET, Key=root + key)["Body"].read()
                ids.update(pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist())
        return ids


def readme_block(name: str) -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    found = re.search(rf"<!-- recovery:{name} -->\n```bash\n(.*?)```", text, re.S)
    assert found, f"docs/operations.md has no recovery block {name!r}"
    return found.group(1)


def requested(sim: Simulator) -> Counter[str]:
    """Sample ids the server answered (a rid is sample id, nonce, attempt); check_server's probes left out."""
    return Counter(answer_id_of(r["rid"]) for r in sim.records() if not r["rid"].startswith("regen-probe"))


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operations]:
    project = ROOT / "config" / "regen.yaml"
    config = yaml.safe_load(project.read_text())
    for dataset in config["datasets"].values():
        dataset["paths"] = [str((project.parent / path).resolve()) for path in dataset["paths"]]
    # C1 trimmed to its first four chats and first four tool conversations (21 turns): enough conversations to be
    # killed midway, few enough that their sequential turns do not set the pace of every run here.
    folder = tmp_path_factory.mktemp("config")
    lines = (ROOT / "data" / "samples" / "C1_multiturn.jsonl").read_text().splitlines()
    (folder / "C1.jsonl").write_text("\n".join(lines[:4] + lines[12:16]) + "\n")
    config["datasets"]["C1_multiturn"]["paths"] = [str(folder / "C1.jsonl")]
    port = free_port()  # the fleet's, started and killed on it all module long
    config["governance"]["allowed_storage_roots"] = [f"s3://{BUCKET}"]
    config["defaults"].update(
        endpoints=[f"http://127.0.0.1:{port}"],
        storage_root=f"s3://{BUCKET}/nightly",
        schedule="0 2 * * *",
        shard_size=48,  # one shard for B1, one for B2: the fewest task instances that still overlap
        in_flight=IN_FLIGHT,
        shard_tasks=SHARD_TASKS,
        task_retries=1,
        retry_delay_s=1,
        fleet_wait_s=3,
        max_attempts=2,
        checkpoint_s=1,
    )
    config_path = folder / "regen.yaml"
    config_path.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("REGEN_CONFIG", str(config_path))
        stack = Stack(
            tmp_path_factory.mktemp("ops"),
            purpose="ops",
            with_s3=True,
            simulators=0,
            heartbeat_timeout_s=HEARTBEAT_S,
        )
        with stack:
            stack.s3_client().create_bucket(Bucket=BUCKET)
            yield Operations(stack, port)


def test_the_first_scheduled_run_with_no_fleet_is_red_and_writes_nothing(ops: Operations) -> None:
    """Unpaused, a scheduled DAG runs its latest night at once (and only it: no catch-up). Nothing listens yet."""
    stack, night = ops.stack, ops.first_night()
    assert stack.wait_for_run(night, 1) == "failed"
    states = {task: state for task, _, state in stack.task_states(night)}
    assert states["check_server"] == "failed" and states["prepare_dataset"] == "upstream_failed"
    assert "Contents" not in stack.s3_client().list_objects_v2(Bucket=BUCKET, Prefix="nightly/kimi-k2.5-mini/B")


def test_the_failed_night_is_completed_by_a_new_run_with_its_id_as_version(ops: Operations) -> None:
    stack, run_id = ops.stack, ops.failed_night
    sim = ops.fleet()
    try:
        response = json.loads(ops.readme("new-run", RUN_ID=run_id).strip().splitlines()[-1])
        new_run = response["dag_run_id"]
        assert response["conf"] == {"version": run_id}  # a scheduled run's settings are the config's defaults
        assert stack.wait_for_run(new_run, 300) == "success", stack.task_states(new_run)
    finally:
        sim.stop()
    published = stack.xcom(new_run, "report")["datasets"]
    assert sorted(d["dataset"] for d in published) == sorted(ANSWERS)
    for dataset in published:
        assert dataset["version"] == version_from_run_id(run_id)
        assert dataset["manifest"].startswith(f"s3://{BUCKET}/nightly/kimi-k2.5-mini/{dataset['dataset']}/")
    ops.published_version = version_from_run_id(run_id)


def test_a_run_whose_fleet_dies_is_red_and_clearing_it_completes_it(ops: Operations) -> None:
    stack, sim = ops.stack, ops.fleet(*SLOW)
    earlier = requested(sim)  # the port's record file is shared by every server on it
    try:
        run_id = stack.trigger({"storage_root": f"s3://{BUCKET}/clear"})
        wait_until("answers before the fleet dies", lambda: sim.stats()["answered"] >= 24, 180)
        sim.stop()
        assert stack.wait_for_run(run_id, 300) == "failed"
        before = requested(sim) - earlier
        instances = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        failed = [t for t in instances if t["task_id"] == "process_shard.generate_shard" and t["state"] == "failed"]
        assert failed, stack.task_states(run_id)
        # A dataset with unfinished shards cannot be verified or published by retrying: both failed on the first try.
        for task_id in ("deliver_dataset.verify_dataset", "deliver_dataset.publish_dataset"):
            ended = [t for t in instances if t["task_id"] == task_id and t["state"] == "failed"]
            assert ended and {t["try_number"] for t in ended} == {1}, stack.task_states(run_id)
        alert = stack.task_log(run_id, failed[0]["task_id"], failed[0]["map_index"], failed[0]["try_number"])
        assert f"eagle3-regen FAILED: process_shard.generate_shard [{failed[0]['rendered_map_index']}]" in alert
        assert "FleetUnavailable" in alert

        sim = ops.fleet(*SLOW)  # the fleet is back
        ops.readme("clear", RUN_ID=run_id)
        assert ops.wait_until_rerun(run_id) == "success", stack.task_states(run_id)
        after = requested(sim) - before - earlier
    finally:
        sim.stop()
    report = stack.xcom(run_id, "report")
    published = ops.train_ids(report)
    assert report["unpublished"] == [] and sorted(d["dataset"] for d in report["datasets"]) == sorted(ANSWERS)
    assert set(published.values()) == {1}  # every sample exactly once
    dropped = sum(d["stages"][stage]["dropped"] for d in report["datasets"] for stage in ("generate", "validate"))
    assert sum(ANSWERS.values()) - len(published) == dropped
    # Answers finished before the fleet died were not requested again: at most one the server recorded but was
    # killed before it could send.
    assert len(set(before) & set(after)) <= 1
    assert set(before) | set(after) >= set(published)


def _alive(process: psutil.Process) -> bool:
    """Running, not merely a zombie waiting for its new parent to reap it."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _generating_task_processes(stack: Stack, port: int, at_least: int = 1) -> list[psutil.Process]:
    """Task processes of this stack's scheduler with a connection open to the fleet: shard tasks mid-generate."""
    found = []
    for process in psutil.Process(stack.processes["scheduler"].pid).children(recursive=True):
        try:
            if any(c.raddr and c.raddr.port == port for c in process.net_connections(kind="tcp")):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found if len(found) >= at_least else []


def test_sigkill_of_a_runner_or_a_supervisor_mid_generate_is_resumed_exactly_once_per_sample(ops: Operations) -> None:
    ops.first_night()  # ended: no other run asks the fleet meanwhile (the counts below are this run's alone)
    stack, sim = ops.stack, ops.fleet(*SLOW)
    s3, earlier = stack.s3_client(), requested(sim)  # the port's record file is shared by every server on it
    earlier_records = len(sim.records())

    def conversations_midway() -> bool:
        """C1's shard task has checkpointed second turns: conversations are under way."""
        listing = s3.list_objects_v2(Bucket=BUCKET, Prefix="sigkill/kimi-k2.5-mini/C1_multiturn/")
        parts = [o["Key"] for o in listing.get("Contents", []) if "/part-" in o["Key"]]
        return any(b"/turn-2" in s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in parts)

    def shard_tasks_generating() -> dict[str, psutil.Process]:
        """Generating task runners by the shards they generate (a runner's title names its task instance)."""
        processes = _generating_task_processes(stack, ops.port, 2)
        instances = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        groups = stack.xcom(run_id, "list_shards")  # what each mapped shard task generates, by map index
        label = [f"{group['dataset']}/shard-{group['first']:05d}" for group in groups]
        shard_of = {t["id"]: label[t["map_index"]] for t in instances if t["task_id"].endswith(".generate_shard")}
        titles = {p: " ".join(p.cmdline()) for p in processes}
        found = {shard_of.get(next(iter(UUID.findall(title)), ""), title): p for p, title in titles.items()}
        seen.update(found)
        return found if any(shard.startswith("C1_multiturn/") for shard in found) else {}

    try:
        run_id = stack.trigger({"storage_root": f"s3://{BUCKET}/sigkill"})
        triggered_at = time.time()
        wait_until("on-policy conversations under way", conversations_midway, 180, poll_s=0.2)
        print(f"SIGKILL: C1's second turns checkpointed {time.time() - triggered_at:.1f} s after the trigger")
        seen: dict[str, psutil.Process] = {}
        try:
            generating = wait_until("C1's shard task and another generating", shard_tasks_generating, 60)
        except TimeoutError as e:
            raise AssertionError(f"generating task processes seen: {sorted(seen)}") from e
        # C1's task runner is killed mid-conversation, and another task's supervisor: its runner dies with it
        # (PR_SET_PDEATHSIG), so nothing goes on generating beside the retry, which comes once the heartbeat timeout
        # has passed.
        runner = next(p for shard, p in generating.items() if shard.startswith("C1_multiturn/"))
        orphan = next(p for p in generating.values() if p is not runner)
        victims = [runner, orphan]
        killed_at = time.time()
        print(f"SIGKILL: {sorted(generating)} generating; killed {killed_at - triggered_at:.1f} s after the trigger")
        runner.send_signal(signal.SIGKILL)
        orphan.parent().send_signal(signal.SIGKILL)
        wait_until("the task runners gone", lambda: not [p for p in victims if _alive(p)], 10, poll_s=0.1)
        assert stack.wait_for_run(run_id, 300) == "success", stack.task_states(run_id)
        print(f"SIGKILL: the run recovered in {time.time() - killed_at:.0f} s (heartbeat timeout {HEARTBEAT_S} s)")
        answered = requested(sim) - earlier
        first_answered_at: dict[str, float] = {}  # sample id -> when the server first answered it, in this run
        for record in sim.records()[earlier_records:]:
            first_answered_at.setdefault(answer_id_of(record["rid"]), record["answered_at"])
    finally:
        sim.stop()
    report = stack.xcom(run_id, "report")
    published = ops.train_ids(report)
    assert set(published.values()) == {1}
    retried = [
        t
        for t in stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        if t["task_id"] == "process_shard.generate_shard" and t["try_number"] == 2
    ]
    assert len(retried) == len(victims)
    logs = [stack.task_log(run_id, t["task_id"], t["map_index"], 2) for t in retried]
    resumed = sum(int(n) for log in logs for n in re.findall(r"(\d+) checkpointed", log))
    assert resumed > 0  # the retries resumed from the killed attempts' checkpoints
    # Redone: only the killed tries' requests in flight and the answers they finished in their last 2 s. Requests in
    # flight were answered after the kill (or never), so every redone sample was first answered at most 2 s before.
    redone = {sample for sample, count in answered.items() if count > 1}
    late = {s for s, at in first_answered_at.items() if at >= killed_at - 2.0}
    assert redone <= late, {s: round(killed_at - first_answered_at[s], 2) for s in redone - late}
    finished_last_2s = sum(killed_at - 2.0 <= at <= killed_at for at in first_answered_at.values())
    assert len(redone) <= IN_FLIGHT + finished_last_2s
    print(f"SIGKILL: {len(redone)} answers redone; bound {IN_FLIGHT} in flight + {finished_last_2s} finished in 2 s")
    # C1's conversations were killed midway: some had turns answered before the kill and the rest after it, resumed
    # at their first unfinished turn (each turn published once, above).
    conversation = {s: s.rpartition("/turn-")[0] for s in first_answered_at if "/turn-" in s}
    before = {conversation[s] for s in conversation if first_answered_at[s] < killed_at}
    after = {conversation[s] for s in conversation if first_answered_at[s] > killed_at}
    assert before & after
    # The report counts the killed tries' generation too: more tries than shards generated.
    generations = [g for dataset in report["datasets"] for g in dataset["generation"]]
    assert sum(g["tries"] for g in generations) > sum(dataset["generated_shards"] for dataset in report["datasets"])
    assert sum(g["answered"] for g in generations) >= sum(published.values())


def test_a_backfill_over_two_nights_reprocesses_only_the_failed_night(ops: Operations) -> None:
    stack = ops.stack

    def night(date: str) -> dict[str, Any]:
        runs = [r for r in ops.runs() if r["run_type"] == "backfill" and r["logical_date"].startswith(date)]
        assert len(runs) == 1, runs
        return runs[0]

    def backfill_finished(date: str) -> str:
        wait_until(
            f"backfill run {date}",
            lambda: [r for r in ops.runs() if r["logical_date"] and r["logical_date"].startswith(date)],
            120,
        )
        return stack.wait_for_run(night(date)["dag_run_id"], 300)

    def backfills_done() -> bool:  # Airflow runs one backfill per DAG at a time
        backfills = stack.call("GET", "/backfills", params={"dag_id": DAG_ID})["backfills"]
        return all(b["completed_at"] for b in backfills)

    def backfill(day: str) -> None:
        wait_until("earlier backfills completed", backfills_done, 120)
        stack.cli("backfill", "create", "--dag-id", DAG_ID, "--from-date", day, "--to-date", f"{day}T23:00")

    backfill("2026-11-01")
    assert backfill_finished("2026-11-01") == "failed"  # the fleet is down that night
    sim = ops.fleet()
    try:
        backfill("2026-11-02")
        assert backfill_finished("2026-11-02") == "success"
        second_night = night("2026-11-02")

        wait_until("earlier backfills completed", backfills_done, 120)
        ops.readme("backfill", FROM="2026-11-01", TO="2026-11-02T23:00")
        assert ops.wait_until_rerun(night("2026-11-01")["dag_run_id"]) == "success"
        answered = sim.stats()["answered"]
    finally:
        sim.stop()
    fields = ("dag_run_id", "state", "start_date", "end_date")
    assert [night("2026-11-02")[f] for f in fields] == [second_night[f] for f in fields]  # the good night: untouched
    # Both nights found the datasets unchanged since the version that completed the first scheduled run: each sent
    # check_server's probe and nothing else.
    assert answered == 2
    for date in ("2026-11-01", "2026-11-02"):
        report = stack.xcom(night(date)["dag_run_id"], "report")
        assert report["datasets"] == [] and report["unpublished"] == []
        assert {(d["dataset"], d["version"]) for d in report["unchanged"]} == {
            (name, ops.published_version) for name in ANSWERS
        }
