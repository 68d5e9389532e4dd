"""A run of eagle3_regen's graph, task by task as the scheduler runs it (regen.pipeline's functions), each try in a
process of its own (forked), retried on failure up to TASK_RETRIES as Airflow retries it (a FinalError fails at once,
as `final_errors_fail_now` makes it); and the fault-free run's trace, from which a crash point's run starts at its
own task."""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tools.crash_points.points import INJECTOR, Arm, CrashPoint, Operation

TASK_RETRIES = 2  # a fault in a task's second try (a second-try point) is met by a third, as Airflow's default 3 would


@dataclass
class TaskTry:
    ok: bool
    value: Any = None
    error: str = ""
    final: bool = False
    crashed: bool = False
    ops: list[Operation] = field(default_factory=list)
    fired: str | None = None  # the armed operation's fault, when it was met


def run_try(task: str, call: Callable[[], Any], arm: Arm | None) -> TaskTry:
    """One try of a task in a forked process, as a worker runs it; armed only for this try."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task's process
        os.close(read)
        INJECTOR.start(task, arm)
        try:
            result = TaskTry(True, call())
        except Exception as e:
            from regen.errors import FinalError

            result = TaskTry(False, error=f"{type(e).__name__}: {e}"[:2000], final=isinstance(e, FinalError))
        result.ops, result.fired = INJECTOR.ops, INJECTOR.fired
        with os.fdopen(write, "wb") as out:
            pickle.dump(result, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        body = answer.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):  # only an armed crash (or torn write) kills a try
        fired = str(arm) if arm is not None else None
        return TaskTry(False, error=f"killed by signal {os.WTERMSIG(status)}", crashed=True, fired=fired)
    return pickle.loads(body) if body else TaskTry(False, error=f"exit status {status}")


@dataclass
class RunResult:
    green: bool
    errors: dict[str, str]  # task -> its last try's error, for tasks that failed
    ops: dict[str, list[Operation]]  # task -> its first try's mutating operations
    missed: list[str] = field(default_factory=list)  # armed operations no try made: the harness's failures
    version: str = ""


@dataclass
class Trace:
    """The fault-free run, task by task: each one's call and value, how many answers it asked the simulator for,
    and the storage as it was just before it ran: a crash point's run starts at its own task (the tasks before it
    are the fault-free run's), which makes the enumeration about three times cheaper. A local root is saved and
    restored as hard links: its files are never written in place (each write renames a new file over the key), and a
    file's stamp (its inode and time, which publish compares with what verify read) stays what the fault-free run saw;
    an S3 prefix by server-side copies, which keep each object's ETag (its stamp) and metadata."""

    root: Path | None
    folder: Path
    order: list[str] = field(default_factory=list)
    calls: dict[str, Callable[[], Any]] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    asked: dict[str, int] = field(default_factory=dict)
    s3: tuple[Any, str, str] | None = None  # on S3: a client of the store itself, the bucket and the run's prefix

    def snapshot(self, name: str) -> None:
        from tools.crash_points.store import copy_objects

        self.order.append(name)
        saved = str(len(self.order))
        if self.s3 is not None:
            client, bucket, prefix = self.s3
            copy_objects(client, bucket, f"{prefix}/", f"snapshots/{saved}/")
        elif self.root is not None and self.root.exists():
            shutil.copytree(self.root, self.folder / saved, symlinks=True, copy_function=os.link)

    def restore(self, name: str) -> None:
        from tools.crash_points.store import restore_objects

        saved = str(self.order.index(name) + 1)
        if self.s3 is not None:  # a copy keeps an object's ETag (its stamp) and metadata
            client, bucket, prefix = self.s3
            restore_objects(client, bucket, f"snapshots/{saved}/", f"{prefix}/")
            return
        if self.root is None:
            return
        shutil.rmtree(self.root, ignore_errors=True)
        if (self.folder / saved).exists():
            shutil.copytree(self.folder / saved, self.root, symlinks=True, copy_function=os.link)

    def asked_from(self, name: str) -> int:
        return sum(self.asked[task] for task in self.order[self.order.index(name) :])


class Dag:
    """One run of the graph. `recording`: the fault-free run, traced; `replaying`: a crash point's run, from its
    task on, each of the task's tries armed as the point says."""

    def __init__(
        self,
        point: CrashPoint | None,
        s3_client: Callable[[], Any] | None,
        asked: Callable[[], int],
        recording: Trace | None = None,
        replaying: Trace | None = None,
        landed: Callable[[], set[str]] | None = None,
    ) -> None:
        self.point, self.s3_client, self.asked, self.landed = point, s3_client, asked, landed
        self.recording, self.replaying = recording, replaying
        # After each failed try of the point's task: the answers asked so far, and those its checkpoints then held
        # (none of which a later try may ask again)
        self.retried_after: list[tuple[int, set[str]]] = []
        self.errors: dict[str, str] = {}
        self.ops: dict[str, list[Operation]] = {}
        self.missed: list[str] = []

    def task(self, name: str, call: Callable[[], Any]) -> Any:
        """The task's value, or None when it failed after its retries."""
        if self.replaying is not None:
            if self.point is None or name != self.point.task:
                return self.replaying.values[name]
            self.replaying.restore(name)
            self.replaying = None  # from here on, every task runs
        if self.recording is not None:
            self.recording.snapshot(name)
            self.recording.calls[name] = call
        asked = self.asked()
        value = self._tries(name, call)
        if self.recording is not None:
            self.recording.values[name], self.recording.asked[name] = value, self.asked() - asked
        return value

    def _tries(self, name: str, call: Callable[[], Any]) -> Any:
        arms = self.point.arms() if self.point is not None and name == self.point.task else ()
        for attempt in range(1 + TASK_RETRIES):
            arm = arms[attempt] if attempt < len(arms) else None
            tried = run_try(name, call, arm)
            if attempt == 0:
                self.ops[name] = tried.ops
            if arm is not None and tried.fired is None:
                self.missed.append(f"try {attempt + 1} never made {arm.op} (it made: {', '.join(map(str, tried.ops))})")
            if tried.ok:
                self.errors.pop(name, None)
                self.missed += [f"no try {n + 1} made {arm.op}: the task was done" for n, arm in _unused(arms, attempt)]
                return tried.value
            self.errors[name] = tried.error
            if tried.final:
                return None
            if arms and self.landed is not None:
                self.retried_after.append((self.asked(), self.landed()))
        return None

    def run(self, params: dict[str, Any], run_id: str) -> RunResult:
        from regen import pipeline
        from regen.run_params import RunSpec

        s3 = self.s3_client
        planned = self.task("plan", lambda: pipeline.plan(params, run_id, s3))
        if planned is None:
            return RunResult(False, self.errors, self.ops, self.missed)
        run = RunSpec.model_validate(planned)
        fleet = self.task("check_server", lambda: pipeline.check_server(run))
        prepared = []
        if fleet is not None:
            for name in run.datasets:
                prepared.append(self.task(f"prepare_dataset[{name}]", partial(pipeline.prepare_dataset, run, name, s3)))
        ready = [p for p in prepared if p]
        for part in pipeline.dataset_parts(run, ready):
            self.task(
                f"prepare_part[{pipeline.part_name(run, part)}]", partial(pipeline.prepare_dataset_part, run, part, s3)
            )
        if fleet is not None:
            self._shards(run, ready)
        published = self._deliver(run, ready, fleet)
        reported = self.task("report", lambda: pipeline.report(run, published, fleet or [], s3))
        return RunResult(reported is not None, self.errors, self.ops, self.missed, run.version)

    def _shards(self, run: Any, ready: list[dict[str, Any]]) -> None:
        from regen import pipeline
        from regen_airflow.shard_states import group_label

        s3 = self.s3_client
        listed = self.task(
            "list_shards", lambda: pipeline.run_groups(run, pipeline.finish_prepared(run, ready, s3), s3)
        )
        for group in listed or []:
            label = group_label(group)
            for stage in (pipeline.generate_group, pipeline.validate_group, pipeline.export_group):
                if self.task(f"{stage.__name__}[{label}]", partial(stage, run, group, s3)) is None:
                    break

    def _deliver(self, run: Any, ready: list[dict[str, Any]], fleet: Any) -> list[dict[str, Any]]:
        from regen import pipeline

        published, s3 = [], self.s3_client
        for summary in ready:
            name = summary["dataset"]
            verified = self.task(f"verify_dataset[{name}]", partial(pipeline.verify_dataset, run, summary, s3))
            publish = partial(pipeline.publish_dataset, run, summary, fleet or [], verified, s3)
            done = self.task(f"publish_dataset[{name}]", publish)
            if done is not None:
                published.append(done)
        return published


def _unused(arms: tuple[Arm, ...], attempt: int) -> list[tuple[int, Arm]]:
    return [(n, arm) for n, arm in enumerate(arms) if n > attempt]
