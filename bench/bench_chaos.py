"""Chaos, measured: eagle3_regen on CeleryExecutor while its parts crash and its bucket goes dark, against the same
run without faults, in one bench.

    .venv/bin/python bench/bench_chaos.py [--prompts 20000] [--report var/bench/chaos.json]

One stack: PostgreSQL (the machine's, a database of the bench's own), a Redis of the bench's own on a private port
as the Celery broker (restarted as a fault; the machine's Redis is never touched), two Celery workers, moto's S3
behind tools/s3_fault_proxy.py, two simulators. N production-like rows (scale_rows.py, 1% of them on-policy
conversations in a second dataset) are run twice, into two versions: first without faults (the baseline), then
with these, each once a share of the answers expected was given:

    0.15  SIGKILL a Celery worker (its process group and every process below it) and start it again
    0.30  restart the scheduler
    0.45  S3 dark for 10 s (every request answered 503)
    0.60  restart Redis
    0.75  restart the triggerer (the datasets' waits for their shards are deferred to it)

Each run: its state and wall time; every source row published once or rejected once with its reason, counted from
the data read back from S3 (scale_once.py); `regen verify` of each published version; task tries and retries.
Exit 0 only when both runs succeeded, every count holds and every version verifies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report_file import save  # noqa: E402
from scale_once import count_once, source_prompts  # noqa: E402
from scale_rows import generate  # noqa: E402

from tools.devstack import Stack  # noqa: E402

PROFILE = "kimi-k2.5-mini"
BUCKET = "regen-chaos"
FAULTS = (
    (0.15, "kill a Celery worker"),
    (0.30, "restart the scheduler"),
    (0.45, "S3 dark"),
    (0.60, "restart Redis"),
    (0.75, "restart the triggerer"),
)
S3_DARK_S = 10.0


def write_config(folder: Path, args: argparse.Namespace, files: dict[str, Path]) -> Path:
    config = {
        "defaults": {
            "profile": PROFILE,
            "storage_root": f"s3://{BUCKET}/chaos",
            "shard_size": args.shard_size,
            "in_flight": args.in_flight,
            "shard_tasks": args.shard_tasks,
            "retry_delay_s": 5,
            "sampling": {"max_new_tokens": 4096, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0},
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"]},
        "datasets": {
            "chaos": {"paths": [str(files["main"])], "format": "auto"},
            "chaos_on_policy": {"paths": [str(files["on_policy"])], "format": "auto", "turns": "on_policy"},
        },
    }
    path = folder / "regen.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def plant(stack: Stack, fault: str, run_id: str) -> dict[str, Any]:
    """One fault, and what it met: for the triggerer, how many datasets' waits were deferred to it."""
    started = time.monotonic()
    met: dict[str, Any] = {}
    if fault == "kill a Celery worker":
        stack.restart("celery-1", kill=True)
    elif fault == "restart the scheduler":
        stack.restart("scheduler")
    elif fault == "S3 dark":
        stack.s3_outage(S3_DARK_S)
    elif fault == "restart Redis":
        stack.restart("redis")
        stack.wait_for_broker()
    elif fault == "restart the triggerer":
        waits = [s for task, _, s in stack.task_states(run_id) if task == "deliver_dataset.wait_for_shards"]
        met["waits_deferred"] = waits.count("deferred")
        stack.restart("triggerer")
    return {"fault": fault, "took_s": round(time.monotonic() - started, 1), **met}


def run(stack: Stack, version: str, datasets: list[str], expected: int, chaos: bool) -> dict[str, Any]:
    baseline_answers, started = stack.answered(), time.monotonic()
    conf = {
        "datasets": datasets,
        "endpoints": [s.url for s in stack.fleet],
        "version": version,
        "skip_unchanged": False,
    }
    run_id = stack.trigger(conf)
    planted: list[dict[str, Any]] = []
    pending = list(FAULTS) if chaos else []
    while (state := stack.call("GET", f"/dags/eagle3_regen/dagRuns/{run_id}")["state"]) not in ("success", "failed"):
        done = stack.answered() - baseline_answers
        while pending and done >= pending[0][0] * expected:
            share, fault = pending.pop(0)
            planted.append({"at_share": share, "at_answers": done, **plant(stack, fault, run_id)})
            print(f"  {time.monotonic() - started:.0f}s: {planted[-1]}", flush=True)
        print(f"  {time.monotonic() - started:.0f}s: {done} answers of ~{expected}", flush=True)
        time.sleep(2)
    wall = time.monotonic() - started
    return {
        "run_id": run_id,
        "state": state,
        "wall_s": round(wall, 1),
        "faults": planted,
        "faults_not_reached": [fault for _, fault in pending],
        "simulator_answers": stack.answered() - baseline_answers,
        "tries": tries(stack, run_id),
        "failures": stack.failures(run_id) if state != "success" else [],
    }


def tries(stack: Stack, run_id: str) -> dict[str, Any]:
    """How many task instances needed more than one try, by task."""
    instances = stack.call("GET", f"/dags/eagle3_regen/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
    retried = Counter(t["task_id"] for t in instances["task_instances"] if t["try_number"] > 1)
    return {"task_instances": instances["total_entries"], "retried": dict(retried)}


def check(stack: Stack, run_id: str, config: Any, folder: Path, id_format: str) -> dict[str, Any]:
    """Each published version read back from S3: every source row once (scale_once), and `regen verify`."""
    report = stack.xcom(run_id, "report")
    s3, checks = stack.s3_client(), {}
    for published in report["datasets"]:
        dataset, manifest = published["dataset"], published["manifest"]
        prefix = manifest.removeprefix(f"s3://{BUCKET}/").rsplit("/", 1)[0]
        local = folder / prefix
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/"):
            for item in page.get("Contents", []):
                target = folder / item["Key"]
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(BUCKET, item["Key"], str(target))
        rows = source_prompts(config.dataset(dataset), id_format)
        counted = count_once(local, rows)
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL_S3": stack.s3_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        verify = subprocess.run(
            [str(Path(sys.executable).parent / "regen"), "verify", manifest], capture_output=True, text=True, env=env
        )
        checks[dataset] = {
            "records": published.get("records"),
            "exactly_once": {k: counted[k] for k in ("source_rows", "prompts", "published", "rejected", "problems")},
            "verify_exit": verify.returncode,
            "verify_problems": verify.stderr.strip()[-2000:] if verify.returncode else "",
            "ok": counted["ok"] and verify.returncode == 0,
        }
    return checks


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the stack's processes are stopped too
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=20_000, help="rows generated, on-policy ones included")
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--shard-tasks", type=int, default=3, help="generate tasks at once (the pool's slots)")
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--answer-tokens", type=int, default=300, help="mean answer length, reasoning included")
    parser.add_argument("--decode-ms-per-token", type=float, default=2.0, help="the simulators' pace")
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a temp one)")
    args = parser.parse_args(argv)
    from regen.config import load_config
    from regen.profiles import lookup

    id_format = lookup(PROFILE).tool_call_id_format
    with tempfile.TemporaryDirectory(prefix="regen-bench-chaos-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = {"main": folder / "main.jsonl", "on_policy": folder / "on_policy.jsonl"}
        counts = generate(files["main"], args.prompts, "production", 0, files["on_policy"], 0.01)
        os.environ["REGEN_CONFIG"] = str(write_config(folder, args, files))
        config = load_config(Path(os.environ["REGEN_CONFIG"]))
        datasets = list(config.datasets)
        expected = sum(len(answers) for d in datasets for _, prompts in source_prompts(
            config.dataset(d), id_format) for _, answers in prompts)  # fmt: skip
        part = max(4, args.answer_tokens // 4)  # reasoning and answer, each uniform in [part, 3 part]
        stack = Stack(
            folder / "airflow",
            purpose="bench_chaos",
            with_s3=True,
            s3_outages=True,
            simulators=2,
            simulator_args=[
                *("--max-running", "1024", "--min-tokens", str(part), "--max-tokens", str(3 * part)),
                *("--decode-ms-per-token", str(args.decode_ms_per_token)),
            ],
            pool_slots=args.shard_tasks,
            executor="CeleryExecutor",
            own_redis=True,
        )
        report: dict[str, Any] = {"prompts": args.prompts, "rows": counts, "answers_expected": expected}
        with stack:
            stack.s3_client().create_bucket(Bucket=BUCKET)
            for name, chaos in (("baseline", False), ("chaos", True)):
                print(f"{name}: {args.prompts} rows, {expected} answers expected", flush=True)
                result = run(stack, name, datasets, expected, chaos)
                if result["state"] == "success":
                    result["published"] = check(stack, result["run_id"], config, folder / "read-back" / name, id_format)
                report[name] = result
        base, chaos_run = report["baseline"], report["chaos"]
        report["chaos_over_baseline_wall"] = round(chaos_run["wall_s"] / base["wall_s"], 2)
    print(json.dumps(report, indent=1, default=str))
    save(args.report, report)
    ok = all(
        r["state"] == "success" and r.get("published") and all(c["ok"] for c in r["published"].values())
        for r in (base, chaos_run)
    )
    print(f"baseline {base['wall_s']} s, chaos {chaos_run['wall_s']} s: x{report['chaos_over_baseline_wall']}")
    return 0 if ok and not chaos_run["faults_not_reached"] else 1


if __name__ == "__main__":
    sys.exit(main())
