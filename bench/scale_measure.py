"""What bench_scale.py reads after (and around) a run: the metadata DB, the task logs' usage lines, the Airflow and
simulator processes' CPU, the published storage. Only public surfaces: PostgreSQL tables, log files, the storage
layout (latest.json -> manifest.json), the `regen verify` CLI."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
from scale_once import SourcePrompts, count_once

from regen_airflow.usage import parse_usage_line

# Task ids -> the stage they belong to (by the last part of the id, so a regrouped DAG still maps).
STAGES = ("prepare", "generate", "validate", "export", "verify", "publish")


def stage_of(task_id: str) -> str:
    """The stage a task works in (prepare_dataset: prepare), or, for the run's own tasks (plan, check_server,
    report, ...), the task's name."""
    name = task_id.rsplit(".", 1)[-1]
    return next((s for s in STAGES if name.startswith(s)), name)


def db(database: str) -> Any:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=database)
    conn.autocommit = True
    return conn


def db_tables(database: str) -> dict[str, dict[str, int]]:
    """Every table's exact row count and total size (table, indexes, TOAST) in bytes."""
    conn = db(database)
    with conn.cursor() as cur:
        cur.execute("SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables")
        sizes = dict(cur.fetchall())
        tables = {}
        for name, size in sizes.items():
            cur.execute(f'SELECT count(*) FROM "{name}"')
            tables[name] = {"rows": int(cur.fetchone()[0]), "bytes": int(size)}
    conn.close()
    return tables


def db_growth(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, Any]:
    grown = {
        name: {
            "rows": t["rows"] - before.get(name, {}).get("rows", 0),
            "mb": round((t["bytes"] - before.get(name, {}).get("bytes", 0)) / 2**20, 3),
        }
        for name, t in after.items()
    }
    grown = {k: v for k, v in sorted(grown.items(), key=lambda kv: -kv[1]["mb"]) if v["rows"] or v["mb"]}
    return {
        "total_mb": round(sum(v["mb"] for v in grown.values()), 2),
        "total_rows": sum(v["rows"] for v in grown.values()),
        "tables": grown,
    }


def xcom_bytes(database: str, run_id: str) -> dict[str, dict[str, int]]:
    conn = db(database)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT task_id, count(*), coalesce(sum(octet_length(value::text)), 0), "
            "coalesce(max(octet_length(value::text)), 0) FROM xcom WHERE run_id = %s GROUP BY task_id",
            (run_id,),
        )
        rows = cur.fetchall()
    conn.close()
    return {t: {"entries": n, "bytes": int(total), "max_bytes": int(top)} for t, n, total, top in sorted(rows)}


def task_tries(database: str, run_id: str) -> list[dict[str, Any]]:
    """Every try of every task instance of the run: the current ones and those in the history table."""
    conn = db(database)
    tries = []
    with conn.cursor() as cur:
        for table in ("task_instance", "task_instance_history"):
            cur.execute(
                f"SELECT task_id, map_index, try_number, state, start_date, end_date FROM {table} WHERE run_id = %s",
                (run_id,),
            )
            for task_id, map_index, try_number, state, start, end in cur.fetchall():
                tries.append(
                    {
                        "task": task_id,
                        "map_index": map_index,
                        "try": try_number,
                        "state": state,
                        "start": start,
                        "end": end,
                    }
                )
    conn.close()
    return tries


def stage_times(tries: list[dict[str, Any]], prompts: int) -> dict[str, dict[str, Any]]:
    """Per stage: its window (first start to last end), task-seconds summed, tries, prompts/s over the window."""
    by_stage: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in tries:
        if t["start"] is not None and t["end"] is not None:
            by_stage[stage_of(t["task"])].append(t)
    stages = {}
    for stage, items in by_stage.items():
        window = (max(t["end"] for t in items) - min(t["start"] for t in items)).total_seconds()
        stages[stage] = {
            "tries": len(items),
            "window_s": round(window, 1),
            "task_s": round(sum((t["end"] - t["start"]).total_seconds() for t in items), 1),
            "prompts_per_s": round(prompts / window, 1) if window > 0 and stage in STAGES else None,
        }
    return stages


def usage_lines(logs: Path, run_id: str) -> list[dict[str, Any]]:
    """The usage line of every task try's log file of the run (regen_airflow.usage)."""
    found = []
    for path in sorted(logs.glob(f"dag_id=*/run_id={run_id}/**/*.log")):
        parsed = parse_usage_line(path.read_text(errors="replace"))
        if parsed is not None:
            found.append(parsed)
    return found


def usage_by_stage(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    stages: dict[str, dict[str, Any]] = {}
    for u in lines:
        s = stages.setdefault(
            stage_of(u["task"]),
            {
                "tasks": 0,
                "cpu_s": 0.0,
                "children_cpu_s": 0.0,
                "peak_rss_mb": 0.0,
                "start_rss_mb": 0.0,
                "own_rss_mb": 0.0,
                "children_peak_rss_mb": 0.0,
            },
        )
        s["tasks"] += 1
        s["cpu_s"] += u["cpu_s"]
        s["children_cpu_s"] += u["children_cpu_s"]
        s["peak_rss_mb"] = max(s["peak_rss_mb"], u["peak_rss_mb"])
        # What the task began with is its supervisor's; what it grew by, its own (regen_airflow.usage).
        s["start_rss_mb"] = max(s["start_rss_mb"], u["start_rss_mb"])
        s["own_rss_mb"] = round(max(s["own_rss_mb"], u["peak_rss_mb"] - u["start_rss_mb"], 0.0), 1)
        s["children_peak_rss_mb"] = max(s["children_peak_rss_mb"], u["children_peak_rss_mb"])
    for s in stages.values():
        s["cpu_s"], s["children_cpu_s"] = round(s["cpu_s"], 2), round(s["children_cpu_s"], 2)
    return stages


def tree_cpu(pid: int) -> dict[str, float]:
    """A process's own CPU, and its whole tree's: live descendants' own plus what every live process has reaped."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {"own": 0.0, "tree": 0.0}
    own, tree = 0.0, 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        tree += t.user + t.system + t.children_user + t.children_system
        if p.pid == pid:
            own = t.user + t.system
    return {"own": round(own, 2), "tree": round(tree, 2)}


def processes_cpu(stack: Any) -> dict[str, dict[str, float]]:
    cpu = {name: tree_cpu(p.pid) for name, p in stack.processes.items()}
    for n, sim in enumerate(stack.fleet):
        cpu[f"simulator-{n}"] = tree_cpu(sim.process.pid)
    return cpu


def storage_usage(version_dirs: list[Path], prompts: int) -> dict[str, Any]:
    """Objects and bytes per top folder of each published version (prompts/, raw/, train/, ...), per 1k prompts."""
    objects: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for version in version_dirs:
        for path in version.rglob("*"):
            if path.is_file():
                parts = path.relative_to(version).parts
                folder = parts[0] + "/" if len(parts) > 1 else "(top)"
                objects[folder] += 1
                size[folder] += path.stat().st_size
    per_k = 1000 / max(1, prompts)
    return {
        "objects": sum(objects.values()),
        "mb": round(sum(size.values()) / 2**20, 2),
        "folders": {
            f: {
                "objects": objects[f],
                "mb": round(size[f] / 2**20, 2),
                "objects_per_1k": round(objects[f] * per_k, 2),
                "kb_per_1k": round(size[f] / 1024 * per_k, 1),
            }
            for f in sorted(objects)
        },
    }


def published(root: Path, profile: str, dataset: str) -> tuple[Path, dict[str, Any]]:
    """The version latest.json names and its manifest."""
    latest = json.loads((root / profile / dataset / "latest.json").read_text())
    manifest_path = Path(latest["manifest"].removeprefix("file://"))
    return manifest_path.parent, json.loads(manifest_path.read_text())


def exactly_once(version: Path, manifest: dict[str, Any], rows: Iterable[SourcePrompts]) -> dict[str, Any]:
    """Every source row published once or rejected once, by id, counted from the data (scale_once.py); then the
    manifest's counts checked against those read back."""
    counted = count_once(version, rows)
    splits = manifest["splits"]
    checks = {
        "each_row_once_from_the_data": counted["ok"],
        "manifest_splits_are_the_records": counted["published"] == sum(splits.values()),
    }
    return {**counted, "checks": checks, "ok": all(checks.values())}


def time_verify(dataset: str, root: Path) -> dict[str, Any]:
    """`regen verify DATASET --root ROOT`, its latest version read back whole: wall and CPU seconds."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "regen"), "verify", dataset, "--root", str(root)],
        capture_output=True,
        text=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "exit": done.returncode,
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(cpu, 2),
        "problems": done.stderr.strip()[-2000:] if done.returncode else "",
    }
