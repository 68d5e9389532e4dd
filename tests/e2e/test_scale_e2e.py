"""The scale bench in miniature, so its path stays tested: generated production-like rows through the real scheduler
against a flaky simulated fleet, every prompt published exactly once, the report's figures within the targets that
hold at any size (XCom per task, no ejection of servers that are only as flaky as the rest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_the_scale_bench_in_miniature_publishes_every_prompt_once_with_bounded_xcom(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    command = [sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--prompts", "2000", "--shard-size", "400"]
    command += ["--part-prompts", "800"]  # the main dataset's prepare in three parts
    command += ["--fault-rate", "0.2", "--stack-name", "test_scale", "--report", str(report_path)]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    report = json.loads(report_path.read_text())

    assert report["state"] == "success"
    assert set(report["exactly_once"]) == {"scale", "scale_on_policy"}
    assert all(check["ok"] for check in report["exactly_once"].values()), report["exactly_once"]
    assert all(v["exit"] == 0 for v in report["verify"].values())
    # 20% of calls failed on both servers: retried, and neither server ejected for it.
    health = report["fleet_health"]
    assert sum(health["retries_by_cause"].values()) > 0.1 * health["requests"] and health["ejections"] == 0
    # The values are counts and ranges, not lists: a shard task's is a range at any number of shards per group
    # (tests/unit/test_nightly.py measures it at 1,000).
    assert max(x["max_bytes"] for x in report["xcom"].values()) < 64 * 1024
    shard_tasks = [f"process_shard.{stage}_shard" for stage in ("generate", "validate", "export")]
    assert all(report["xcom"][task]["max_bytes"] < 1024 for task in shard_tasks)
    assert report["xcom"]["prepare_dataset"]["max_bytes"] < 1024
    parts = [u for u in report["task_usage"] if u["task"] == "prepare_part"]
    assert sorted(u["map_index"] for u in parts) == [0, 1, 2] and report["xcom"]["prepare_part"]["max_bytes"] < 1024
    # Every stage's CPU came from the tasks' usage lines, and the floor was measured on the same rows.
    assert {"prepare", "generate", "validate", "export", "verify", "publish"} <= set(report["stages"])
    assert all(report["stages"][s]["cpu_s"] > 0 for s in ("prepare", "generate", "validate", "export"))
    assert report["floor"]["cpu_s_total"] > 0 and report["floor_ratio"]["total"]["ratio"] > 1
