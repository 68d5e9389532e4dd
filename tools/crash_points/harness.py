"""The harness: the simulator (it answers a prompt the same way every time), and S3 (moto) behind the fault proxy
when asked; the fault-free run, traced, then each task's second tries recorded (its first killed halfway, or once its
result landed); then a run per crash point from its task on, in the same root restored, checked after."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from regen.sglang.client import answer_id_of
from tools.crash_points.checks import (
    CHECKPOINT_EVERY,
    DATASETS,
    IN_FLIGHT,
    PROFILE,
    Delivered,
    both_sides,
    delivered,
    differences,
    left_temporaries,
    write_deployment,
)
from tools.crash_points.dag import Dag, Trace, run_try
from tools.crash_points.fleet import FLEETS, check_first_run
from tools.crash_points.memo import memoised
from tools.crash_points.points import (
    FAULTS,
    INJECTOR,
    RENEW,
    STAGED,
    TORN,
    Arm,
    CrashPoint,
    Operation,
    installed,
)

RID = re.compile(rb'{"rid": "([^"]+)"')  # a record line's first field (regen.simulator.server)
S3_ATTEMPTS = 5  # botocore's, of every client of the harness
MEET_TRIES = 3  # runs of a point whose operation was not made before it fails (a harness that drifted: see summary)


@dataclass
class Outcome:
    point: CrashPoint | None
    green: bool
    resumed: bool
    violations: list[str]
    errors: dict[str, str]
    missed: list[str] = field(default_factory=list)  # its operation never met: the harness failed, not the data
    extra_generations: int = 0
    reruns: int = 0


class Harness:
    def __init__(self, folder: Path, backend: str, fleet: str = "sound") -> None:
        self.folder, self.backend, self.count, self.fleet = folder, backend, 0, FLEETS[fleet]
        self.version: str | None = None  # a losing fleet's: its first run's, red, which every run after it resumes
        self.stack = contextlib.ExitStack()
        try:
            self._start()
        except BaseException:
            self.stack.close()  # the simulator, S3, the environment: as they were
            raise

    def _start(self) -> None:
        from tools.devstack import start_simulator

        self.simulator = self.stack.enter_context(start_simulator(self.folder, *self.fleet.args))
        self.stack.enter_context(memoised(self.folder))
        self.s3_client: Callable[[], Any] | None = None
        self.store: tuple[Any, str, str] | None = None  # S3: the store without the proxy, where snapshots are kept
        if self.backend == "s3":
            self._start_s3()
        self.trace: Trace | None = None
        self._reference_ops: dict[str, list[Operation]] = {}
        self._retries: dict[str, list[tuple[Operation, list[Operation]]]] = {}
        self._reference_asked = 0
        self._reference_data: dict[str, Delivered] = {}
        self.stack.enter_context(installed())
        self.stack.callback(_restore_environment, os.environ.get("REGEN_CONFIG"))  # each run points it at its own
        os.environ["REGEN_CONFIG"] = str(write_deployment(self.folder / "deploy-0", str(self.folder / "root-0")))
        from regen import pipeline

        pipeline.preload()  # the renderer built once, here: every task forked after it inherits it (as on a worker)
        _import_what_tasks_import()
        if self.fleet.lossy is not None:
            self._lose_answers()
        self.reference = self.run(None)
        if not self.reference.green or self.reference.violations:
            raise RuntimeError(f"the fault-free run is not green: {self.reference}")
        if empty := both_sides(self._reference_data):
            raise RuntimeError(f"the fault-free run leaves a split unchecked: {empty} (see VALIDATION_SHARE)")
        self._points: list[CrashPoint] | None = None

    def _start_s3(self) -> None:
        from moto.server import ThreadedMotoServer

        from tools.devstack import free_port, moto_client
        from tools.s3_fault_proxy import run_in_thread

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port())
        moto.start()
        self.stack.callback(moto.stop)
        upstream = f"http://127.0.0.1:{moto._port}"
        proxy_port = free_port()
        _, stop = run_in_thread(upstream, proxy_port, 0.0)
        self.stack.callback(stop)
        INJECTOR.proxy = f"http://127.0.0.1:{proxy_port}"
        self.s3_client = lambda: moto_client(INJECTOR.proxy or "", S3_ATTEMPTS)
        direct = moto_client(upstream, S3_ATTEMPTS)
        direct.create_bucket(Bucket="crashpoints")
        self.store = (direct, "crashpoints", "run")

    def _lose_answers(self) -> None:
        """A losing fleet's first run, on a fleet of its own, neither traced nor faulted: red past the allowance
        (tools/crash_points/fleet.py); the traced run is its Resume, and every crash point's run resumes it too."""
        from regen.layout import DatasetLocation
        from regen.storage import open_storage
        from tools.devstack import start_simulator

        assert self.fleet.lossy is not None
        self.count += 1
        uri = self._root()[1]
        os.environ["REGEN_CONFIG"] = str(write_deployment(self.folder / "deploy-lost", uri, self.fleet.defaults))
        with start_simulator(self.folder, *self.fleet.lossy) as lossy:
            first = Dag(None, self.s3_client, self._asked).run({"endpoints": [lossy.url]}, f"cp-{self.count}")
        storage = open_storage(uri, self.s3_client() if self.s3_client else None)
        where = {d: DatasetLocation(uri, PROFILE, d, first.version).fleet_losses for d in DATASETS}
        check_first_run(first.errors, {d: storage.exists(key) for d, key in where.items()})
        self.version = first.version

    def _root(self) -> tuple[Path | None, str]:
        """The run's root: a local folder (None on S3), and its URI."""
        root = self.folder / "root" if self.backend == "local" else None
        return root, str(root) if root is not None else "s3://crashpoints/run"

    def close(self) -> None:
        INJECTOR.proxy = None
        self.stack.close()

    def points(self) -> list[CrashPoint]:
        """Every operation of every task's first try, and of its second after its first was killed (`first_try_kills`),
        times every fault: the first tries' points, then the second tries' (recorded at the first call)."""
        if self._points is None:
            self._retries = self._record_retries()
            self._points = self._enumerate()
        return self._points

    def _enumerate(self) -> list[CrashPoint]:
        first = [CrashPoint(task, op, f) for task, made in self._reference_ops.items() for op, f in self._faulted(made)]
        second = [
            CrashPoint(task, op, fault, after)
            for task, retries in self._retries.items()
            for after, made in retries
            for op, fault in self._faulted(made)
        ]
        return first + second

    def _faulted(self, made: list[Operation]) -> list[tuple[Operation, str]]:
        """A try's operations (its claims' timed renewals as one, the first: their number follows the clock) with
        the faults each can meet; on a local root, a write can also be killed before its rename."""
        ops = [op for op in made if op.method != RENEW]
        claimed = {op.key for op in ops if op.key.endswith("/writer.json") and op.method in ("create", "replace")}
        for key in sorted(claimed):
            folder = key.rsplit("/", 1)[0] + "/"
            if any(op.held and op.key.startswith(folder) and op.key != key for op in ops):  # it writes holding it
                ops.append(Operation(RENEW, key))
        torn = (TORN,) if self.backend == "local" else ()
        return [(op, fault) for op in ops for fault in FAULTS + (torn if op.method in STAGED else ())]

    def _record_retries(self) -> dict[str, list[tuple[Operation, list[Operation]]]]:
        """Each task's second tries, from its restored storage: its first try killed right after one of its
        operations (`first_try_kills`), then the retry's operations. A kill its first try does not meet (its
        operation follows the clock) in MEET_TRIES runs gives no second-try points."""
        assert self.trace is not None
        found: dict[str, list[tuple[Operation, list[Operation]]]] = {}
        for name in self.trace.order:
            for after in first_try_kills([op for op in self._reference_ops.get(name, []) if op.method != RENEW]):
                for _ in range(MEET_TRIES):
                    self.trace.restore(name)
                    if run_try(name, self.trace.calls[name], Arm(after, "crash")).crashed:
                        found.setdefault(name, []).append((after, run_try(name, self.trace.calls[name], None).ops))
                        break
        return found

    def run(self, point: CrashPoint | None) -> Outcome:
        """The fault-free run (no point), traced; or a crash point's run and, when it ends red, a Resume; checked.
        A point whose operation no try made is run again, up to MEET_TRIES times in all."""
        outcome = self._run(point)
        while point is not None and outcome.missed and outcome.reruns + 1 < MEET_TRIES:
            reruns = outcome.reruns + 1
            outcome = self._run(point)
            outcome.reruns = reruns
        return outcome

    def _run(self, point: CrashPoint | None) -> Outcome:
        self.count += 1
        n, (root, uri) = self.count, self._root()
        if point is None and self.version is None:  # a crash point's run (a Resume's too) keeps the root and config
            os.environ["REGEN_CONFIG"] = str(write_deployment(self.folder / f"deploy-{n}", uri, self.fleet.defaults))
        params: dict[str, Any] = {"endpoints": [self.simulator.url]}
        params |= {"version": self.version} if self.version is not None else {}
        asked_before = self._asked()
        trace = Trace(root, self.folder / "trace", s3=self.store) if point is None else None
        replay = self.trace if point is not None else None
        dag = Dag(
            point, self.s3_client, self._asked, recording=trace, replaying=replay, landed=partial(self._landed, uri)
        )
        result = dag.run(params, f"cp-{n}")
        outcome = Outcome(point, result.green, False, [], dict(result.errors), list(result.missed))
        if not result.green:
            if not result.errors:
                outcome.violations.append("red with no failed task naming why")
            again = {**params, "version": result.version} if result.version else params  # plan failed: a new run
            resume = Dag(None, self.s3_client, self._asked).run(again, f"cp-{n}-resume")
            outcome.resumed = True
            if not resume.green:
                outcome.violations.append(f"the Resume is red: {resume.errors}")
            result.version = result.version or resume.version
        asked = self._asked() - asked_before
        if root is not None:
            outcome.violations += left_temporaries(root)
        if trace is not None:
            self.trace, self._reference_ops, self._reference_asked = trace, result.ops, asked
            self._reference_data = self._delivered(uri)
            outcome.violations += [f"{d}: {p}" for d, got in self._reference_data.items() for p in got.problems]
            return outcome
        assert point is not None and replay is not None
        for dataset, got in self._delivered(uri).items():
            outcome.violations += differences(dataset, got, self._reference_data[dataset], result.version)
        outcome.extra_generations = asked - replay.asked_from(point.task)
        outcome.violations += self._asked_again(dag.retried_after)
        if any(arm.op.method == RENEW for arm in point.arms()):
            # Its try's writes into the version waited for the renewal (Injector): what it got meanwhile is unwritten
            # however many, so only _asked_again bounds what is asked again.
            return outcome
        bound = len(point.arms()) * (2 * IN_FLIGHT + CHECKPOINT_EVERY) if point.task.startswith("generate_") else 0
        if outcome.extra_generations > bound:
            outcome.violations.append(f"{outcome.extra_generations} answers generated again (at most {bound})")
        return outcome

    def _asked_again(self, retried_after: list[tuple[int, set[str]]]) -> list[str]:
        """A retry never asks again an answer a try before it checkpointed: only what no checkpoint held."""
        asked = self._asked_ids()
        found = []
        for start, landed in retried_after:
            if again := sorted(landed.intersection(asked[start:])):
                found.append(f"{len(again)} checkpointed answers asked again by a later try, e.g. {again[:2]}")
        return found

    def _asked(self) -> int:
        """Answers the simulator has sent for samples (its record: a line an answer), the fleet check's probes aside."""
        with self.simulator.record.open("rb") as record:  # counted at every task of a run: no line parsed
            return sum(1 for line in record if b'"rid": "regen-probe-' not in line)

    def _asked_ids(self) -> list[str]:
        """The answer of each line of the simulator's record (an answer sent), in order, the fleet check's probes
        aside: a request's rid is its answer's id, the client's nonce and the attempt (regen.sglang.client)."""
        with self.simulator.record.open("rb") as record:  # the rid alone: a line holds its prompt's and answer's ids
            rids = [RID.match(line) for line in record if b'"rid": "regen-probe-' not in line]
        if not all(rids):  # each line answers an index of _asked's count: none may be skipped
            raise RuntimeError(f"{self.simulator.record}: a line that does not open with its rid")
        return [answer_id_of(rid.group(1).decode()) for rid in rids if rid]

    def _landed(self, root: str) -> set[str]:
        """The answers the shards' checkpoint parts hold now (rejections aside: a retry may ask those again)."""
        from regen.storage import open_storage

        storage = open_storage(root, self.s3_client() if self.s3_client else None)
        parts = [k for k in storage.list_keys("") if "/raw/shard-" in k and "/part-" in k and k.endswith(".jsonl")]
        lines = (json.loads(line) for key in parts for line in storage.get_bytes(key).splitlines())
        return {line["id"] for line in lines if "id" in line and "rejected" not in line}

    def _delivered(self, root: str) -> dict[str, Delivered]:
        client = self.s3_client() if self.s3_client else None
        return {d: delivered(root, PROFILE, d, client) for d in DATASETS}


def first_try_kills(made: list[Operation]) -> list[Operation]:
    """Where a task's first try is killed for its second-try points: right after the operation halfway through it
    (half its work in storage), and right after its last write before it deletes (its result in storage, its
    leftovers not yet removed: a shard's checkpoints, a prepare's parts), when that is another."""
    kills = [made[(len(made) - 1) // 2]] if made else []
    deleting = ("delete", "delete_if")
    committed = [a for a, b in itertools.pairwise(made) if a.method not in deleting and b.method in deleting]
    return [*kills, committed[-1]] if committed and committed[-1] not in kills else kills


def _restore_environment(config: str | None) -> None:
    if config is None:
        os.environ.pop("REGEN_CONFIG", None)
    else:
        os.environ["REGEN_CONFIG"] = config


def _import_what_tasks_import() -> None:
    """What the tasks import as they run, imported once before they fork (a warm worker has them too)."""
    import importlib

    for module in ("aiohttp", "boto3", "matplotlib.pyplot", "regen.stages.publish.dataset_report", "regen.verify"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


@contextlib.contextmanager
def harness(backend: str, fleet: str = "sound") -> Iterator[Harness]:
    with tempfile.TemporaryDirectory(prefix=f"crashpoints-{backend}-{fleet}-") as tmp:
        made = Harness(Path(tmp), backend, fleet)
        try:
            yield made
        finally:
            made.close()


def sample(points: list[CrashPoint], count: int | None, seed: int) -> list[CrashPoint]:
    """`count` points drawn by `seed` (every point when None), in the run's order."""
    if count is None or count >= len(points):
        return points
    chosen = set(random.Random(seed).sample(range(len(points)), count))
    return [p for i, p in enumerate(points) if i in chosen]


def summary(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """Per fault kind: crash points run (of them, in a second try), faults that met their operation, points whose
    operation no run made (the harness's failures) and those met only on a rerun, runs that ended red and were
    resumed, and points with violations."""
    table: dict[str, Counter[str]] = {}
    for outcome in outcomes:
        assert outcome.point is not None
        row = table.setdefault(outcome.point.fault, Counter())
        row["points"] += 1
        row["second_try"] += outcome.point.after is not None
        row["fired"] += not outcome.missed
        row["missed"] += bool(outcome.missed)
        row["rerun"] += outcome.reruns > 0
        row["resumed"] += outcome.resumed
        row["violations"] += bool(outcome.violations)
    return {fault: dict(row) for fault, row in table.items()}


def outcome_lines(backend: str, outcome: Outcome, fleet: str = "sound") -> list[str]:
    """What a point's run has to say, if anything: its operation missed, its violations (with the run's errors), or
    its run ended red and its Resume green; a failure's line ends with the command that runs the point again."""
    point = outcome.point
    losing = f" --fleet {fleet}" if fleet != "sound" else ""
    again = f".venv/bin/python -m tools.crash_points --root {backend}{losing} --point '{point}'"
    lines = [f"MISSED {point}: {outcome.missed} ({again})"] if outcome.missed else []
    if outcome.violations:
        lines.append(f"VIOLATION {point}: {outcome.violations} (errors: {outcome.errors}) ({again})")
    elif outcome.resumed:
        lines.append(f"red, then resumed green: {point}: {outcome.errors}")
    return lines


def result_line(backend: str, outcomes: list[Outcome]) -> str:
    """The run's verdict: red when any point found a violation or missed its operation."""
    violations, missed = sum(bool(o.violations) for o in outcomes), sum(bool(o.missed) for o in outcomes)
    verdict = "green" if not violations and not missed else "red"  # a violation: the pipeline's; a miss: the harness's
    return f"{backend}: {verdict}: {len(outcomes)} points, {violations} with violations, {missed} missed their op"
