"""Fleet utilization over a multi-shard eagle3_regen run on a real executor, several SGLang endpoints.

    .venv/bin/python bench/bench_fleet.py [--prompts 4800] [--shard-size 400] [--endpoints 3] [--decode-ms 40]

Airflow (scheduler, dag-processor, api-server; LocalExecutor on PostgreSQL) runs the DAG on a generated dataset
against several simulators. Utilization is measured server-side: the simulators' busy slot-seconds (time integral
of running requests) over their running slots times the generation window, which opens when the first shard task
starts generating and closes with the last answer. The baseline in the same run is one shard task holding the same
in-flight budget (pool of one slot), i.e. no overlap across shard boundaries.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.devstack import Stack  # noqa: E402

MAX_RUNNING = 32  # running slots per simulated server


def write_dataset(folder: Path, prompts: int, shard_size: int, in_flight: int, shard_tasks: int) -> Path:
    rows = [
        {"input": f"Task {i}: write a function that returns the {i}th prime, and explain it."} for i in range(prompts)
    ]
    (folder / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "defaults": {
            "profile": "kimi-k2.5-mini",
            "storage_root": str(folder / "storage"),
            "shard_size": shard_size,
            "in_flight": in_flight,
            "shard_tasks": shard_tasks,
            "tokenize_workers": 1,  # this benchmark measures generation; prepare is bench_prepare.py's
            "sampling": {"max_new_tokens": 1024, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0},
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"]},  # the bench's simulators
        "datasets": {"bench": {"paths": ["bench.jsonl"], "format": "input_output"}},
    }
    path = folder / f"regen-{shard_tasks}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def one_run(folder: Path, args: argparse.Namespace, shard_tasks: int) -> dict[str, Any]:
    capacity = MAX_RUNNING * args.endpoints
    in_flight = int(capacity * args.margin)  # a margin over the fleet's slots, as docs/scaling.md advises
    os.environ["REGEN_CONFIG"] = str(write_dataset(folder, args.prompts, args.shard_size, in_flight, shard_tasks))
    simulator_args = ["--max-running", str(MAX_RUNNING), "--decode-ms-per-token", str(args.decode_ms)]
    stack = Stack(
        folder / f"airflow-{shard_tasks}",
        purpose="bench_fleet",
        simulators=args.endpoints,
        simulator_args=simulator_args,
        pool_slots=shard_tasks,
    )
    with stack:
        run_id = stack.trigger({"endpoints": [s.url for s in stack.fleet], "version": f"bench-{shard_tasks}"})
        state = stack.wait_for_run(run_id, timeout_s=1800)
        if state != "success":
            raise SystemExit(f"run {state}: {stack.task_states(run_id)}")
        report = stack.xcom(run_id, "report")
        stats = [s.stats() for s in stack.fleet]
    starts = [g["started_at"] for d in report["datasets"] for g in d["generation"]]
    window = max(s["last_end"] for s in stats) - min(starts)
    busy = sum(s["busy_slot_seconds"] for s in stats)
    return {
        "shard_tasks": shard_tasks,
        "in_flight": in_flight,
        "fleet_slots": capacity,
        "answered": sum(s["answered"] for s in stats),
        "generation_window_s": round(window, 1),
        "utilization": round(busy / (capacity * window), 4),
        "client_side_estimate": report["fleet_usage"]["utilization"],
    }


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the stack's processes are stopped too
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4800)
    parser.add_argument("--shard-size", type=int, default=400)
    parser.add_argument("--endpoints", type=int, default=3)
    parser.add_argument("--decode-ms", type=float, default=40.0, help="per output token (answers average ~115 tokens)")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--margin", type=float, default=3.0, help="in-flight budget over the fleet's running slots")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="regen-bench-fleet-") as tmp:
        overlapped = one_run(Path(tmp), args, shard_tasks=4)
        print("pool of 4 shard tasks", json.dumps(overlapped), flush=True)
        if args.skip_baseline:
            return
        baseline = one_run(Path(tmp), args, shard_tasks=1)
        print("baseline (one shard task at a time)", json.dumps(baseline), flush=True)
    print(
        f"utilization {overlapped['utilization']:.3f} vs {baseline['utilization']:.3f} without overlap "
        f"(ratio {overlapped['utilization'] / baseline['utilization']:.2f})"
    )


if __name__ == "__main__":
    main()
