"""bench_scale.py's report as tables."""

from __future__ import annotations

from typing import Any


def _row(cells: list[Any], widths: list[int]) -> str:
    return "  " + " ".join(
        f"{'' if c is None else c!s:>{w}}" if i else f"{c!s:<{w}}"
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    widths = [max(len(str(r[i] if r[i] is not None else "")) for r in [header, *rows]) for i in range(len(header))]
    print(title)
    print(_row(header, widths))
    for r in rows:
        print(_row(r, widths))


def print_report(r: dict[str, Any]) -> None:
    print(
        f"\n== {r['prompts']} prompts ({r['rows']}), shape {r['shape']}, {r['endpoints']} simulators, {r['executor']}"
        f"{', kill at ' + str(r['kill_at']) if r['kill_at'] is not None else ''}: run {r['state']} in {r['wall_s']} s "
        f"({r['prompts_per_s']} prompts/s); the simulators gave {r['simulator_answers']} answers"
    )
    for failure in r["failures"]:
        print(f"  failed: {failure}")
    if r["kill"]:
        print(f"  kill: {r['kill']}")
    stage_rows = [
        [
            name,
            s.get("tries"),
            s.get("window_s"),
            s.get("task_s"),
            s.get("prompts_per_s"),
            s.get("cpu_s"),
            s.get("children_cpu_s"),
            s.get("peak_rss_mb"),
            s.get("start_rss_mb"),
            s.get("own_rss_mb"),
            s.get("children_peak_rss_mb"),
        ]
        for name, s in r["stages"].items()
    ]
    header = [
        "stage",
        "tries",
        "window_s",
        "task_s",
        "prompts/s",
        "cpu_s",
        "child_cpu_s",
        "peak_rss_mb",
        "start_rss_mb",
        "own_rss_mb",
        "child_rss_mb",
    ]
    table(
        "stages (every try; cpu and rss from the tasks' usage lines; start: the largest a task began with, its "
        "supervisor's; own: the most a task grew by):",
        header,
        stage_rows,
    )
    if r["floor_ratio"]:
        rows = [[g, v["pipeline_cpu_s"], v["floor_cpu_s"], v["ratio"]] for g, v in r["floor_ratio"].items()]
        table("pipeline task CPU vs the floor:", ["stage", "pipeline_cpu_s", "floor_cpu_s", "ratio"], rows)
    p = r["processes"]
    rows = [[k, v] for k, v in p.items() if k != "raw"]
    table("CPU seconds by process over the run:", ["who", "cpu_s"], rows)
    db = r["db_growth"]
    print(f"metadata DB grew {db['total_mb']} MB, {db['total_rows']} rows; largest tables:")
    for name, t in list(db["tables"].items())[:8]:
        print(f"  {name:<32} {t['rows']:>8} rows {t['mb']:>9.3f} MB")
    rows = [[t, x["entries"], x["bytes"], x["max_bytes"]] for t, x in r["xcom"].items()]
    table("XCom by task:", ["task", "entries", "bytes", "max_bytes"], rows)
    s = r["storage"]
    rows = [[f, x["objects"], x["mb"], x["objects_per_1k"], x["kb_per_1k"]] for f, x in s["folders"].items()]
    table(f"storage: {s['objects']} objects, {s['mb']} MB", ["folder", "objects", "mb", "obj/1k", "kb/1k"], rows)
    for dataset, v in r["verify"].items():
        print(f"regen verify {dataset}: exit {v['exit']}, {v['wall_s']} s wall, {v['cpu_s']} s CPU {v['problems']}")
    print(f"Drafter data page, cold load on the result: {r['page']['cold_load_s']} s, {r['page']['html_bytes']} bytes")
    health = r["fleet_health"]
    print(
        f"fleet health (fault rate {r['fault_rate']}): {health['requests']} requests, retries "
        f"{health['retries_by_cause']}, {health['ejections']} ejections"
    )
    for dataset, c in r["exactly_once"].items():
        print(f"exactly once, {dataset}: {c}")
