"""eagle3_regen end to end at scale, through the real scheduler, against a fast simulated fleet: where the time,
CPU, memory, metadata DB and storage go, and how far the pipeline's CPU is from the floor (bench_floor.py).

    .venv/bin/python bench/bench_scale.py [--prompts 1000000] [--shape production|short] [--endpoints 2]
        [--part-prompts 50000] [--celery] [--kill-at 0.5] [--fault-rate 0.21] [--report var/bench/scale.json]

Airflow (scheduler, dag-processor, api-server; LocalExecutor on PostgreSQL, or CeleryExecutor with two workers on
Redis with --celery) runs the DAG on N generated rows (scale_rows.py; `--on-policy-share` of them C1-style
conversations in a `turns: on_policy` dataset) against K simulators with many slots and no latency, answering about
`--answer-tokens` tokens. Measured:
  per stage    wall window and prompts/s (task instance start/end in the metadata DB, every try), CPU seconds and
               peak RSS of its tasks (each task's `eagle3-regen task usage:` log line, regen_airflow.usage)
  processes    the scheduler's own CPU, the executor and supervisors (the scheduler's tree less its tasks), the
               api-server and dag-processor, the simulators (separately: they stand in for GPUs)
  metadata DB  rows and MB per table grown over the run; XCom entries and bytes per task
  storage      objects and bytes per folder of the published versions, per 1k prompts
  verify       `regen verify` of each published version (wall, CPU)
  floor        bench_floor.py on the same rows; the pipeline's task CPU over it, per stage and in total
  exactly once every source row published once or rejected once, by id: the ids computed from the rows themselves,
               the records read back from train/, truncated/ and rejected/ (scale_once.py); with --kill-at, one
               generating task's process is SIGKILLed and the scheduler restarted once that share of answers was given
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psutil  # noqa: E402
import scale_measure as measure  # noqa: E402
from bench_floor import print_floor, run_floor  # noqa: E402
from report_file import save  # noqa: E402
from scale_once import source_prompts  # noqa: E402
from scale_report import print_report  # noqa: E402
from scale_rows import generate  # noqa: E402

from tools.devstack import Stack  # noqa: E402

PROFILE = "kimi-k2.5-mini"
# Floor steps that stand for each stage's unavoidable work.
FLOOR_OF = {
    "prepare": ("parse", "template", "encode"),
    "generate": ("request", "response"),
    "validate+export": ("parquet",),
    "verify+publish": ("sha256",),
}


def write_config(folder: Path, args: argparse.Namespace, files: dict[str, Path]) -> Path:
    datasets: dict[str, Any] = {"scale": {"paths": [str(files["main"])], "format": "auto"}}
    if "on_policy" in files:
        datasets["scale_on_policy"] = {"paths": [str(files["on_policy"])], "format": "auto", "turns": "on_policy"}
    config = {
        "defaults": {
            "profile": PROFILE,
            "storage_root": str(folder / "storage"),
            "shard_size": args.shard_size,
            "in_flight": args.in_flight,
            "shard_tasks": args.shard_tasks,
            **({"prepare_part_prompts": args.part_prompts} if args.part_prompts else {}),
            "retry_delay_s": 5,
            "sampling": {"max_new_tokens": 4096, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0},
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"]},  # the bench's simulators
        "datasets": datasets,
    }
    path = folder / "regen.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def generating_process(stack: Stack) -> psutil.Process | None:
    """A task process with a connection open to a simulator: a shard task mid-generate."""
    ports = {int(s.url.rsplit(":", 1)[1]) for s in stack.fleet}
    for name, component in stack.processes.items():
        if name != "scheduler" and not name.startswith("celery-"):
            continue
        for process in psutil.Process(component.pid).children(recursive=True):
            try:
                if any(c.raddr and c.raddr.port in ports for c in process.net_connections(kind="tcp")):
                    return process
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
    return None


def kill_and_restart(stack: Stack, lost: dict[str, float]) -> dict[str, Any]:
    """SIGKILL one generating task process, then restart the scheduler (its LocalExecutor workers and the tasks
    they run go with it); what the old scheduler's tree had spent is kept in `lost`."""
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        victim = generating_process(stack)
        time.sleep(0.2)
    if victim is None:
        raise SystemExit("--kill-at: no generating task process found")
    title = " ".join(victim.cmdline())[:160]
    victim.send_signal(signal.SIGKILL)
    killed_at = datetime.now(UTC)
    before = measure.tree_cpu(stack.processes["scheduler"].pid)
    lost["scheduler_own"] += before["own"]
    lost["scheduler_tree"] += before["tree"]
    stack.restart_scheduler()
    print(f"  killed {victim.pid} ({title}) and restarted the scheduler", flush=True)
    return {"killed_pid": victim.pid, "killed": title, "at_answers": stack.answered(), "at": killed_at}


def run(stack: Stack, args: argparse.Namespace, datasets: list[str], expected: int) -> dict[str, Any]:
    lost = {"scheduler_own": 0.0, "scheduler_tree": 0.0}
    tables_before, cpu_before = measure.db_tables(stack.database), measure.processes_cpu(stack)
    started = time.monotonic()
    conf = {
        "datasets": datasets,
        "endpoints": [s.url for s in stack.fleet],
        "version": "bench-scale",
        "skip_unchanged": False,
    }
    run_id = stack.trigger(conf)
    kill: dict[str, Any] | None = None
    while (state := stack.call("GET", f"/dags/eagle3_regen/dagRuns/{run_id}")["state"]) not in ("success", "failed"):
        done = stack.answered()
        if args.kill_at is not None and kill is None and done >= args.kill_at * expected:
            kill = kill_and_restart(stack, lost)
        print(f"  {time.monotonic() - started:.0f}s: {done} answers of ~{expected}", flush=True)
        time.sleep(5 if args.kill_at is not None and kill is None else 15)
    wall = time.monotonic() - started
    cpu_after, tries = measure.processes_cpu(stack), measure.task_tries(stack.database, run_id)
    if kill is not None:  # how long until a task started again after the kill and restart
        restarted = [t["start"] for t in tries if t["start"] is not None and t["start"] > kill["at"]]
        kill["first_task_start_after_s"] = round((min(restarted) - kill.pop("at")).total_seconds(), 1)
    cpu = {
        name: {k: round(v - cpu_before.get(name, {}).get(k, 0.0), 2) for k, v in after.items()}
        for name, after in cpu_after.items()
    }
    if kill is not None:  # the first scheduler's share, spent before the restart
        cpu["scheduler"]["own"] = round(cpu_after["scheduler"]["own"] + lost["scheduler_own"], 2)
        cpu["scheduler"]["tree"] = round(cpu_after["scheduler"]["tree"] + lost["scheduler_tree"], 2)
    return {
        "run_id": run_id,
        "state": state,
        "wall_s": round(wall, 1),
        "kill": kill,
        "process_cpu_s": cpu,
        "db_growth": measure.db_growth(tables_before, measure.db_tables(stack.database)),
        "xcom": measure.xcom_bytes(stack.database, run_id),
        "tries": tries,
        "simulator_answers": stack.answered(),  # probes and answers redone after a kill included
        "usage": measure.usage_lines(stack.home / "logs", run_id),
        "failures": stack.failures(run_id) if state != "success" else [],
    }


def stage_table(result: dict[str, Any], prompts: int, floor: dict[str, Any] | None) -> dict[str, Any]:
    times = measure.stage_times(result.pop("tries"), prompts)
    usage = measure.usage_by_stage(result["usage"])
    order = ["plan", "dataset_names", "check_server", "prepare", "list_shards", *measure.STAGES[1:], "report"]
    names = sorted(set(times) | set(usage), key=lambda s: (order.index(s) if s in order else len(order), s))
    stages = {s: {**times.get(s, {}), **usage.get(s, {})} for s in names}
    for s in stages.values():
        s["pipeline_cpu_s"] = round(s.get("cpu_s", 0.0) + s.get("children_cpu_s", 0.0), 2)
    ratios: dict[str, Any] = {}
    if floor is not None:
        for group, steps in FLOOR_OF.items():
            pipeline = sum(stages.get(s, {}).get("pipeline_cpu_s", 0.0) for s in group.split("+"))
            floor_cpu = sum(floor["cpu_s"][step] for step in steps)
            ratios[group] = {
                "pipeline_cpu_s": round(pipeline, 2),
                "floor_cpu_s": round(floor_cpu, 2),
                "ratio": round(pipeline / floor_cpu, 1) if floor_cpu else None,
            }
        total = sum(s["pipeline_cpu_s"] for s in stages.values())
        ratios["total"] = {
            "pipeline_cpu_s": round(total, 2),
            "floor_cpu_s": floor["cpu_s_total"],
            "ratio": round(total / floor["cpu_s_total"], 1),
        }
    return {"stages": stages, "floor_ratio": ratios}


def processes(result: dict[str, Any], stages: dict[str, Any]) -> dict[str, Any]:
    cpu = result.pop("process_cpu_s")
    tasks = round(sum(s["pipeline_cpu_s"] for s in stages.values()), 2)
    airflow = {n: c for n, c in cpu.items() if not n.startswith("simulator-")}
    executors = sum(c["tree"] for n, c in airflow.items() if n == "scheduler" or n.startswith("celery-"))
    return {
        "tasks_cpu_s": tasks,
        "scheduler_own_cpu_s": cpu["scheduler"]["own"],
        "executor_and_supervisors_cpu_s": round(executors - cpu["scheduler"]["own"] - tasks, 2),
        "api_server_cpu_s": cpu.get("api-server", {}).get("tree"),
        "dag_processor_cpu_s": cpu.get("dag-processor", {}).get("tree"),
        "simulators_cpu_s": round(sum(c["tree"] for n, c in cpu.items() if n.startswith("simulator-")), 2),
        "raw": cpu,
    }


def fleet_health(folder: Path) -> dict[str, Any]:
    """Requests, retries by cause and ejections over the run's generate tasks, from the run report."""
    reports = sorted((folder / "storage" / PROFILE / "runs").glob("*.json"))
    datasets = json.loads(reports[-1].read_text())["datasets"] if reports else []  # none: the run never reported
    generations = [g for d in datasets for g in d.get("generation", [])]
    retries: dict[str, int] = {}
    for g in generations:
        for cause, n in g["retries_by_cause"].items():
            retries[cause] = retries.get(cause, 0) + n
    return {
        "requests": sum(g["requests"] for g in generations),
        "retries_by_cause": retries,
        "ejections": sum(g.get("ejections", 0) for g in generations),
    }


def published(folder: Path, datasets: list[str], prompts: int) -> dict[str, Any]:
    """Each dataset's published version: its storage, every source row counted once from the data, verify, page."""
    from regen.config import load_config
    from regen.profiles import lookup

    config, root = load_config(folder / "regen.yaml"), folder / "storage"
    versions, checks, verify = [], {}, {}
    for dataset in datasets:
        try:
            version, manifest = measure.published(root, PROFILE, dataset)
        except FileNotFoundError:
            checks[dataset] = {"ok": False, "error": "not published"}
            continue
        versions.append(version)
        rows = source_prompts(config.dataset(dataset), lookup(PROFILE).tool_call_id_format)
        checks[dataset] = measure.exactly_once(version, manifest, rows)
        verify[dataset] = measure.time_verify(dataset, root)
    return {
        "storage": measure.storage_usage(versions, prompts),
        "exactly_once": checks,
        "verify": verify,
        "page": page_cold_load(root, datasets),
    }


def page_cold_load(root: Path, datasets: list[str]) -> dict[str, Any]:
    """The Drafter data page on the result, as its first visitor gets it: the catalog read with no cache, then the
    HTML rendered."""
    from regen.storage import LocalStorage
    from regen.ui.catalog import Catalog
    from regen.ui.page import page

    storage = LocalStorage(root)
    started = time.perf_counter()
    overview = Catalog(storage, PROFILE).overview(datasets)
    html = page(storage.root_uri, PROFILE, overview)
    return {"cold_load_s": round(time.perf_counter() - started, 3), "html_bytes": len(html.encode())}


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the stack's processes are stopped too
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=1_000_000, help="rows generated, on-policy ones included")
    parser.add_argument("--shape", choices=["production", "short"], default="production")
    parser.add_argument("--on-policy-share", type=float, default=0.01)
    parser.add_argument("--endpoints", type=int, default=2)
    parser.add_argument("--answer-tokens", type=int, default=1000, help="mean answer length, reasoning included")
    parser.add_argument("--shard-size", type=int, default=2000)
    parser.add_argument("--shard-tasks", type=int, default=2, help="generate tasks at once (the pool's slots)")
    parser.add_argument(
        "--part-prompts", type=int, default=None, help="a dataset's prepare in parts of this many prompts (config's)"
    )
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--celery", action="store_true", help="CeleryExecutor, two workers on Redis")
    parser.add_argument("--kill-at", type=float, default=None, metavar="FRACTION")
    parser.add_argument(
        "--fault-rate",
        type=float,
        default=0.0,
        help="share of /generate calls each simulator fails, in four equal parts: 503 queue full, abort, connection "
        "reset, 500 (fleet health: flaky servers are kept)",
    )
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument(
        "--stack-name", default="bench_scale", help="names the stack's database: two benches at once need two names"
    )
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a temp one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="regen-bench-scale-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        report = bench(folder, args)
    print_report(report)
    save(args.report, report)
    ok = report["state"] == "success" and all(c.get("ok") for c in report["exactly_once"].values())
    return 0 if ok else 1


def bench(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    on_policy = folder / "on_policy.jsonl" if args.on_policy_share > 0 else None
    counts = generate(folder / "main.jsonl", args.prompts, args.shape, 0, on_policy, args.on_policy_share)
    files = {"main": folder / "main.jsonl", **({"on_policy": on_policy} if on_policy else {})}
    print(f"rows {counts} written in {time.perf_counter() - started:.1f}s", flush=True)
    os.environ["REGEN_CONFIG"] = str(write_config(folder, args, files))
    datasets = ["scale", *(["scale_on_policy"] if on_policy else [])]
    part = max(4, args.answer_tokens // 4)  # reasoning and answer, each uniform in [part, 3 part]
    simulator_args = ["--max-running", "1024", "--min-tokens", str(part), "--max-tokens", str(3 * part)]
    if args.fault_rate:
        for fault in ("http-503", "abort", "reset", "http-500"):
            simulator_args += [f"--{fault}-rate", str(args.fault_rate / 4)]
    stack = Stack(
        folder / "airflow",
        purpose=args.stack_name,
        simulators=args.endpoints,
        simulator_args=simulator_args,
        pool_slots=args.shard_tasks,
        executor="CeleryExecutor" if args.celery else "LocalExecutor",
    )
    with stack:
        result = run(stack, args, datasets, expected=args.prompts)
    floor = None
    if not args.no_floor:
        print("floor: bench_floor.py on the same rows", flush=True)
        floor = run_floor(list(files.values()), answer_tokens=args.answer_tokens, chunk=args.shard_size)
        print_floor(floor)
    table = stage_table(result, args.prompts, floor)
    return {
        "prompts": args.prompts,
        "rows": counts,
        "shape": args.shape,
        "endpoints": args.endpoints,
        "executor": stack.executor,
        "kill_at": args.kill_at,
        "fault_rate": args.fault_rate,
        **{k: result[k] for k in ("run_id", "state", "wall_s", "kill", "failures", "simulator_answers")},
        "prompts_per_s": round(args.prompts / result["wall_s"], 1),
        **table,
        "processes": processes(result, table["stages"]),
        "db_growth": result["db_growth"],
        "xcom": result["xcom"],
        **published(folder, datasets, args.prompts),
        "fleet_health": fleet_health(folder),
        "floor": floor,
        "task_usage": result["usage"],  # every task try's usage line
    }


if __name__ == "__main__":
    sys.exit(main())
