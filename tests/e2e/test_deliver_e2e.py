"""Each dataset is delivered once its own shards are: through the real scheduler, a small dataset is published
while a large one's shards are still generating (each dataset's wait for its own shards deferred to the
triggerer); a failed shard fails its own dataset's wait at once, naming it, and clearing the failed tasks resumes it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools.devstack import DAG_ID, Stack, start_simulator, wait_until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
# About 2 s an answer; twelve shards of four through two pool slots take a minute, one shard a few seconds.
SLOW_FLEET = ("--decode-ms-per-token", "20", "--max-running", "8")
POOL_SLOTS = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("deliver")
    samples = ROOT / "data" / "samples"
    (folder / "small.jsonl").write_text("".join((samples / "B1_glaive.jsonl").read_text().splitlines(True)[:4]))
    config = yaml.safe_load((ROOT / "config" / "regen.yaml").read_text())
    config["datasets"] = {  # the small one first: its group is map index 0, the first the pool takes
        "small": {"format": "openai_messages", "paths": [str(folder / "small.jsonl")]},
        "large": {"format": "input_output", "paths": [str(samples / "B2_opencodeinstruct.jsonl")]},
    }
    config["governance"]["allowed_storage_roots"] = [str(folder / "storage")]
    config["defaults"].update(
        storage_root=str(folder / "storage"),
        shard_size=4,  # small: one shard; large: twelve
        task_retries=0,  # nothing here is transient: a retry would hide a failure
        fleet_wait_s=5,  # a shard whose fleet is gone fails in seconds, not after the default two minutes
        verify_poll_s=2,
        longest_first=False,  # the datasets in their listed order: longest first would rank the small one's shard
        # by its rows' reference answers, maybe after the large one's, and the large one could end first
    )
    (folder / "regen.yaml").write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("REGEN_CONFIG", str(folder / "regen.yaml"))
        with Stack(folder / "airflow", purpose="deliver", simulator_args=list(SLOW_FLEET), pool_slots=POOL_SLOTS) as s:
            yield s


def instances(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    found = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
    return list(found["task_instances"])


def ended(ti: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(ti["end_date"])


def test_a_small_dataset_is_published_before_a_large_ones_shards_finish(stack: Stack) -> None:
    run_id = stack.trigger({"endpoints": [stack.simulator], "datasets": ["small", "large"]})
    assert stack.wait_for_run(run_id, 900) == "success", stack.failures(run_id)
    tis = instances(stack, run_id)
    groups = stack.xcom(run_id, "list_shards")
    large = {i for i, group in enumerate(groups) if group["dataset"] == "large"}
    assert len(large) == 12
    large_shards = [t for t in tis if t["task_id"] == "process_shard.export_shard" and t["map_index"] in large]
    published = {t["rendered_map_index"]: t for t in tis if t["task_id"] == "deliver_dataset.publish_dataset"}
    assert {name: t["state"] for name, t in published.items()} == {"small": "success", "large": "success"}
    # The small dataset's version was published while the large one's shards were still running.
    last_large_shard = max(ended(t) for t in large_shards)
    assert ended(published["small"]) < last_large_shard, (published["small"]["end_date"], last_large_shard)
    assert ended(published["large"]) > last_large_shard
    # Each dataset waited, deferred, for its own shards only: the small one's wait ended before the large shards did,
    # the large one's after; one try each, nothing failed and retried.
    waits = {t["rendered_map_index"]: t for t in tis if t["task_id"] == "deliver_dataset.wait_for_shards"}
    assert ended(waits["small"]) < last_large_shard < ended(waits["large"])
    delivered = [t for t in tis if t["task_id"].startswith("deliver_dataset.")]
    assert {(t["state"], t["try_number"]) for t in delivered} == {("success", 1)}, delivered


def test_a_failed_shard_fails_its_own_wait_at_once_and_clearing_the_failed_tasks_resumes_it(stack: Stack) -> None:
    folder = stack.home.parent
    sim = start_simulator(folder, *SLOW_FLEET)  # a fleet of this test's own, to kill mid-run
    port = sim.url.rsplit(":", 1)[-1]
    try:
        conf = {"endpoints": [sim.url], "datasets": ["small", "large"], "storage_root": str(folder / "storage/cut")}
        run_id = stack.trigger(conf)

        def small_published() -> bool:
            done = {(t["task_id"], t["rendered_map_index"]): t["state"] for t in instances(stack, run_id)}
            return done.get(("deliver_dataset.publish_dataset", "small")) == "success"

        wait_until("the small dataset published", small_published, 300)
        sim.stop()  # the large dataset's remaining shards fail: their fleet is gone
        assert stack.wait_for_run(run_id, 300) == "failed"
        tis = instances(stack, run_id)
        waits = {t["rendered_map_index"]: t for t in tis if t["task_id"] == "deliver_dataset.wait_for_shards"}
        assert (waits["small"]["state"], waits["large"]["state"], waits["large"]["try_number"]) == (
            "success",
            "failed",
            1,
        )
        failed_shards = [t for t in tis if t["task_id"].startswith("process_shard.") and t["state"] == "failed"]
        assert failed_shards
        # At once: within a few polls of the first failed shard, not once every shard ended.
        first_failed = min(ended(t) for t in failed_shards)
        assert (ended(waits["large"]) - first_failed).total_seconds() < 30, (waits["large"], first_failed)
        log = stack.task_log(run_id, "deliver_dataset.wait_for_shards", waits["large"]["map_index"])
        assert "large: not verified, shards did not finish: large/shard-" in log and "generate_shard: failed" in log
        assert "Clear the run's failed tasks to resume" in log  # the alert's advice: clearing mends it

        sim = start_simulator(folder, port=int(port))  # the fleet is back, at full speed: the rest is no test of time
        stack.call("POST", f"/dags/{DAG_ID}/dagRuns/{run_id}/clear", json={"dry_run": False, "only_failed": True})
        wait_until(
            f"{run_id} re-queued",
            lambda: stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"] != "failed",
            60,
        )
        assert stack.wait_for_run(run_id, 900) == "success", stack.failures(run_id)
    finally:
        sim.stop()
    published = {
        t["rendered_map_index"]: t["state"]
        for t in instances(stack, run_id)
        if t["task_id"] == "deliver_dataset.publish_dataset"
    }
    assert published == {"small": "success", "large": "success"}
