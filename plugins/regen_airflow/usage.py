"""What each task cost the machine, in its own log: one line when it ends (success or failure), from the task
process itself (the task runner; never from a scheduler or API server that sets a task's state).

    eagle3-regen task usage: task=process_shard.generate_shard map_index=3 try=1 state=success cpu_s=12.345
        peak_rss_mb=412.5 children_cpu_s=0.000 children_peak_rss_mb=0.0 start_rss_mb=265.1

`cpu_s` and `peak_rss_mb` are the task runner's (`getrusage(RUSAGE_SELF)`: user + system seconds since it was
forked, and its high-water resident set); `children_*` are the processes it started and waited for (prepare's
tokenizer workers): their CPU summed, the largest one's peak. `start_rss_mb` is the resident set as the task began:
a forked process starts with what its supervisor holds, which is the supervisor's, not the task's, so the task's own
growth is `peak_rss_mb - start_rss_mb`. bench/bench_scale.py reads these lines back per task kind;
`parse_usage_line` is the one reader.
"""

from __future__ import annotations

import logging
import re
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

PREFIX = "eagle3-regen task usage: "
DAG_IDS = frozenset({"eagle3_regen", "eagle3_training_handoff"})
# ru_maxrss is KiB on Linux, bytes on macOS.
RSS_UNIT = 1 if sys.platform == "darwin" else 1024


@dataclass(frozen=True)
class Usage:
    cpu_s: float
    peak_rss_mb: float

    @classmethod
    def of(cls, who: int) -> Usage:
        usage = resource.getrusage(who)
        return cls(usage.ru_utime + usage.ru_stime, usage.ru_maxrss * RSS_UNIT / 2**20)


def resident_mb() -> float:
    """This process's resident set now (Linux's /proc; elsewhere its high-water mark, the nearest there is)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return Usage.of(resource.RUSAGE_SELF).peak_rss_mb
    return resident_pages * resource.getpagesize() / 2**20


def usage_line(
    task_id: str, map_index: int, try_number: int, state: str, own: Usage, children: Usage, start_rss_mb: float
) -> str:
    return (
        f"{PREFIX}task={task_id} map_index={map_index} try={try_number} state={state} "
        f"cpu_s={own.cpu_s:.3f} peak_rss_mb={own.peak_rss_mb:.1f} "
        f"children_cpu_s={children.cpu_s:.3f} children_peak_rss_mb={children.peak_rss_mb:.1f} "
        f"start_rss_mb={start_rss_mb:.1f}"
    )


LINE = re.compile(
    re.escape(PREFIX) + r"task=(?P<task>\S+) map_index=(?P<map_index>-?\d+) try=(?P<try>\d+) state=(?P<state>\w+) "
    r"cpu_s=(?P<cpu_s>[\d.]+) peak_rss_mb=(?P<peak_rss_mb>[\d.]+) "
    r"children_cpu_s=(?P<children_cpu_s>[\d.]+) children_peak_rss_mb=(?P<children_peak_rss_mb>[\d.]+) "
    r"start_rss_mb=(?P<start_rss_mb>[\d.]+)"
)


def parse_usage_line(text: str) -> dict[str, Any] | None:
    """The first usage line in `text` (a log line, or a whole log), its numbers as numbers; None when there is none."""
    found = LINE.search(text)
    if found is None:
        return None
    fields: dict[str, Any] = found.groupdict()
    for name in ("map_index", "try"):
        fields[name] = int(fields[name])
    for name in ("cpu_s", "peak_rss_mb", "children_cpu_s", "children_peak_rss_mb", "start_rss_mb"):
        fields[name] = float(fields[name])
    return fields


# Set as a task begins, in its own process: Airflow calls the running hook only in the task runner, while the
# success and failed hooks also fire in the scheduler (a task that died or timed out) and the API server (a state set
# by hand), whose own usage is no task's. A line is logged only for the task that began in this process.
_started: tuple[tuple[Any, ...], float] | None = None  # (the task try, the resident set as it began)


def _try_of(task_instance: Any) -> tuple[Any, ...]:
    fields = ("dag_id", "run_id", "task_id", "map_index", "try_number")
    return tuple(getattr(task_instance, name, None) for name in fields)


def log_usage(task_instance: Any, state: str) -> None:
    if task_instance.dag_id not in DAG_IDS or _started is None or _started[0] != _try_of(task_instance):
        return
    own, children = Usage.of(resource.RUSAGE_SELF), Usage.of(resource.RUSAGE_CHILDREN)
    map_index = getattr(task_instance, "map_index", -1)
    try_number = getattr(task_instance, "try_number", 0) or 0
    log.info("%s", usage_line(task_instance.task_id, map_index, try_number, state, own, children, _started[1]))


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    global _started
    _started = (_try_of(task_instance), resident_mb())


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    log_usage(task_instance, "success")


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    log_usage(task_instance, "failed")
