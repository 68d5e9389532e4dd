"""A run with more shards than Airflow maps (its max_map_length, 1,024), through a real scheduler, and what each
mapped task instance costs the scheduler.

    .venv/bin/python bench/bench_scheduler.py [--shards 1100] [--baseline-shards 40] [--shard-task-limit 256]

One-prompt shards, so every task instance is nearly all orchestration. Beyond the config's `shard_task_limit`, the
DAG groups consecutive shards, several per mapped task. Measured: wall time, and the scheduler process's own CPU
seconds (its LocalExecutor workers excluded) per mapped task instance. The baseline in the same run is a small run
(`--baseline-shards`, one shard per task) on the same stack.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regen.pipeline import shard_groups  # noqa: E402
from tools.devstack import DAG_ID, Stack  # noqa: E402

SHARD_STAGES = 3  # generate, validate, export: mapped task instances per shard task


def write_config(folder: Path, shards: int, shard_task_limit: int) -> Path:
    rows = [{"input": f"Task {i}: say hello."} for i in range(shards)]
    (folder / f"bench-{shards}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "defaults": {
            "storage_root": str(folder / "storage"),
            "shard_size": 1,
            "in_flight": 4,
            "shard_tasks": 4,
            "tokenize_workers": 1,
            "shard_task_limit": shard_task_limit,
            "sampling": {"max_new_tokens": 64, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0},
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"]},  # the bench's simulators
        "datasets": {f"bench{shards}": {"paths": [f"bench-{shards}.jsonl"], "format": "input_output"}},
    }
    path = folder / "regen.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def scheduler_cpu_s(stack: Stack) -> float:
    import psutil

    times = psutil.Process(stack.processes["scheduler"].pid).cpu_times()
    return float(times.user + times.system)


def one_run(stack: Stack, shards: int, limit: int) -> dict[str, Any]:
    cpu, started = scheduler_cpu_s(stack), time.monotonic()
    run_id = stack.trigger({"datasets": [f"bench{shards}"], "endpoints": [stack.simulator]})
    while (state := stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"]) not in ("success", "failed"):
        time.sleep(60)
        path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances"
        done = stack.call("GET", path, params={"limit": 1, "state": "success"})["total_entries"]
        print(
            f"  {time.monotonic() - started:.0f}s: {done} task instances done, "
            f"scheduler CPU {scheduler_cpu_s(stack) - cpu:.0f}s",
            flush=True,
        )
    wall, cpu = time.monotonic() - started, scheduler_cpu_s(stack) - cpu
    tasks = len(shard_groups([{"dataset": "bench", "shard_count": shards}], limit))
    mapped = tasks * SHARD_STAGES
    result = {
        "shards": shards,
        "shard_tasks": tasks,
        "state": state,
        "mapped_task_instances": mapped,
        "wall_s": round(wall, 1),
        "wall_s_per_mapped_ti": round(wall / mapped, 3),
        "scheduler_cpu_s": round(cpu, 1),
        "scheduler_cpu_s_per_mapped_ti": round(cpu / mapped, 4),
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the stack's processes are stopped too
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=1100)
    parser.add_argument("--baseline-shards", type=int, default=40)
    parser.add_argument("--shard-task-limit", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="regen-bench-scheduler-") as tmp:
        folder = Path(tmp)
        # One config naming both datasets, so that both runs share the stack (the DAG's form is parsed from it).
        wide = json.loads(write_config(folder, args.shards, args.shard_task_limit).read_text())
        narrow = json.loads(write_config(folder, args.baseline_shards, args.shard_task_limit).read_text())
        wide["datasets"].update(narrow["datasets"])
        (folder / "regen.yaml").write_text(json.dumps(wide))
        os.environ["REGEN_CONFIG"] = str(folder / "regen.yaml")
        with Stack(folder / "airflow", purpose="bench_scheduler") as stack:
            baseline = one_run(stack, args.baseline_shards, args.shard_task_limit)
            wide_run = one_run(stack, args.shards, args.shard_task_limit)
    ratio = wide_run["scheduler_cpu_s_per_mapped_ti"] / baseline["scheduler_cpu_s_per_mapped_ti"]
    print(
        f"{args.shards} shards: {wide_run['state']}; scheduler CPU per mapped task instance "
        f"{wide_run['scheduler_cpu_s_per_mapped_ti']} s ({ratio:.2f}x the {args.baseline_shards}-shard baseline); "
        f"wall per mapped task instance {wide_run['wall_s_per_mapped_ti']} s"
    )
    tasks = len(shard_groups([{"dataset": "bench", "shard_count": 10_000_000 // 2000}], args.shard_task_limit))
    print(
        f"10M prompts at shard_size 2000 = 5000 shards in {tasks} shard tasks = {tasks * SHARD_STAGES} mapped task "
        f"instances: ~{tasks * SHARD_STAGES * wide_run['scheduler_cpu_s_per_mapped_ti'] / 60:.0f} scheduler CPU minutes"
    )
    return 0 if wide_run["state"] == baseline["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
