"""Crash points: every mutating storage operation of a small but complete run, failed in turn, and the data checked
after each (SQLite's I/O-error testing, for a storage root).

A run here is the DAG's: its tasks are the pipeline's functions (regen.pipeline) called as the DAG's tasks call them,
in its order and with its trigger rules, each try in a process of its own (forked), retried on failure up to
`task_retries` as Airflow retries it (a FinalError fails at once, as `final_errors_fail_now` makes it). The run:
three datasets (one with tools at two temperatures, one on-policy, one prepared in parts with a gap in its shard
numbers), shards of three samples, groups of two shards, on the local root or on S3 (moto) through the fault proxy.

A crash point is one mutating operation (put, conditional create or replace, delete, conditional delete, file upload)
of one task's first try, k-th in the order that try makes them, and one fault:
- before: the operation raises and nothing lands;
- lost_reply: it lands and its reply is lost: on S3 the proxy drops the HTTP reply and botocore retries as it would;
  locally it lands, then raises as a dropped connection does;
- crash: it lands, then the task's process is SIGKILLed at once (no `finally`, no atexit).
Then the run goes on as Airflow runs it, and when it ends red, a Resume of its version runs. After it: every
published version passes `regen verify`'s verifier, its records are the fault-free run's (ids and input_ids), each
once, none both published and rejected; latest.json names the run's version and verifies; the run ends green, or red
with errors, and the Resume green; and no answer was asked twice unless the fault hit a generate task (then at most
its requests in flight and its unflushed answers).

    .venv/bin/python -m tools.crash_points --root local --sample 20 --seed 7    # a sample (bench_crashpoints: all)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import random
import shutil
import signal
import tempfile
import threading
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

FAULTS = ("before", "lost_reply", "crash")
MUTATING = {"put_bytes": "PUT", "create": "PUT", "replace": "PUT", "put_file": "PUT", "delete": "DELETE"}
MUTATING["delete_if"] = "DELETE"
TASK_RETRIES = 1
IN_FLIGHT, CHECKPOINT_EVERY = 2, 2
DATA = Path(__file__).resolve().parents[1] / "data" / "samples"


@dataclass(frozen=True)
class CrashPoint:
    task: str  # a task instance's label: "generate_shard[tools/shard-00002 +1]"
    op: int  # the op's place among that task's first try's mutating operations, from 1
    fault: str

    def __str__(self) -> str:
        return f"{self.task}#{self.op}:{self.fault}"


class Injector:
    """A task try's mutating operations, counted in the order they are made (threads too), and the fault for one."""

    def __init__(self) -> None:
        self.point: CrashPoint | None = None
        self.task = ""
        self.ops: list[str] = []
        self.fired: str | None = None
        self.lock = threading.Lock()
        self.proxy: str | None = None  # the S3 fault proxy's URL, to lose a reply

    def next(self, method: str, key: str) -> str | None:
        with self.lock:
            self.ops.append(f"{method} {key}")
            point = self.point
            if point is None or point.task != self.task or point.op != len(self.ops) or self.fired:
                return None
            self.fired = f"{point.fault} at {method} {key}"
            return point.fault


INJECTOR = Injector()


class FaultyStorage:
    """A task's storage (regen.pipeline.run_storage: where a task gets it, once), its mutating operations counted and
    the chosen one failed; everything else passes through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in MUTATING:
            return attribute
        return lambda key, *args, **kwargs: self._mutate(name, key, lambda: attribute(key, *args, **kwargs))

    def _mutate(self, method: str, key: str, call: Callable[[], Any]) -> Any:
        fault = INJECTOR.next(method, key)
        if fault is None:
            return call()
        if fault == "before":
            raise self._dropped_connection(key)
        if fault == "crash":
            call()
            os.kill(os.getpid(), signal.SIGKILL)
        if INJECTOR.proxy is not None and hasattr(self.inner, "bucket"):  # S3: the proxy loses the reply
            query = urllib.parse.urlencode({"method": MUTATING[method], "path": self.inner._key(key)})
            urllib.request.urlopen(urllib.request.Request(f"{INJECTOR.proxy}/__drop_reply?{query}", method="POST"))
            return call()  # botocore retries it, as it would
        call()
        raise self._dropped_connection(key)

    def _dropped_connection(self, key: str) -> Exception:
        if hasattr(self.inner, "bucket"):
            from botocore.exceptions import ConnectionClosedError  # what botocore raises once its retries are spent

            return ConnectionClosedError(endpoint_url=f"{self.inner.uri(key)} (crash point)")
        return ConnectionResetError(errno.ECONNRESET, f"crash point: {key}")


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Every task's storage opened through FaultyStorage (the seam: regen.pipeline.run_storage.open_storage), until
    the harness closes: the process it ran in (a test worker) opens plain storage again."""
    from regen.pipeline import run_storage

    opened = run_storage.open_storage
    run_storage.open_storage = lambda *args, **kwargs: FaultyStorage(opened(*args, **kwargs))
    try:
        yield
    finally:
        run_storage.open_storage = opened


@dataclass
class TaskTry:
    ok: bool
    value: Any = None
    error: str = ""
    final: bool = False
    crashed: bool = False
    ops: list[str] = field(default_factory=list)
    fired: str | None = None


def run_try(task: str, call: Callable[[], Any], armed: CrashPoint | None) -> TaskTry:
    """One try of a task in a forked process, as a worker runs it; the point armed only for this try."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task's process
        os.close(read)
        INJECTOR.point, INJECTOR.task, INJECTOR.ops, INJECTOR.fired = armed, task, [], None
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
    if os.WIFSIGNALED(status):
        return TaskTry(False, error=f"killed by signal {os.WTERMSIG(status)}", crashed=True, fired=str(armed))
    return pickle.loads(body) if body else TaskTry(False, error=f"exit status {status}")


@dataclass
class RunResult:
    green: bool
    errors: dict[str, str]  # task -> its last try's error, for tasks that failed
    ops: dict[str, list[str]]  # task -> its first try's mutating operations
    fired: str | None = None
    version: str = ""


@dataclass
class Trace:
    """The fault-free run, task by task: each one's value, how many answers it asked the simulator for, and, on a
    local root, the storage as it was just before it ran: a crash point's run starts at its own task (the tasks before
    it are the fault-free run's), which makes the enumeration about three times cheaper. A local root is saved and
    restored as hard links: its files are never written in place (each write renames a new file over the key), and a
    file's stamp (its inode and time, which publish compares with what verify read) stays what the fault-free run saw;
    an S3 prefix by server-side copies, which keep each object's ETag (its stamp) and metadata."""

    root: Path | None
    folder: Path
    order: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    asked: dict[str, int] = field(default_factory=dict)

    s3: tuple[Any, str, str] | None = None  # on S3: a client of the store itself, the bucket and the run's prefix

    def snapshot(self, name: str) -> None:
        self.order.append(name)
        saved = str(len(self.order))
        if self.s3 is not None:
            client, bucket, prefix = self.s3
            _copy_objects(client, bucket, f"{prefix}/", f"snapshots/{saved}/")
        elif self.root is not None and self.root.exists():
            shutil.copytree(self.root, self.folder / saved, symlinks=True, copy_function=os.link)

    def restore(self, name: str) -> None:
        saved = str(self.order.index(name) + 1)
        if self.s3 is not None:  # a copy keeps an object's ETag (its stamp) and metadata
            client, bucket, prefix = self.s3
            _restore_objects(client, bucket, f"snapshots/{saved}/", f"{prefix}/")
            return
        if self.root is None:
            return
        shutil.rmtree(self.root, ignore_errors=True)
        if (self.folder / saved).exists():
            shutil.copytree(self.folder / saved, self.root, symlinks=True, copy_function=os.link)

    def asked_from(self, name: str) -> int:
        return sum(self.asked[task] for task in self.order[self.order.index(name) :])


class Dag:
    """One run of eagle3_regen's graph, task by task as the scheduler runs it (regen.pipeline's functions).
    `recording`: the fault-free run, traced; `replaying`: a crash point's run, from its task on (local root)."""

    def __init__(
        self,
        armed: CrashPoint | None,
        s3_client: Callable[[], Any] | None,
        asked: Callable[[], int],
        recording: Trace | None = None,
        replaying: Trace | None = None,
    ) -> None:
        self.armed, self.s3_client, self.asked = armed, s3_client, asked
        self.recording, self.replaying = recording, replaying
        self.errors: dict[str, str] = {}
        self.ops: dict[str, list[str]] = {}
        self.fired: str | None = None

    def task(self, name: str, call: Callable[[], Any]) -> Any:
        """The task's value, or None when it failed after its retries."""
        if self.replaying is not None:
            if self.armed is None or name != self.armed.task:
                return self.replaying.values[name]
            self.replaying.restore(name)
            self.replaying = None  # from here on, every task runs
        if self.recording is not None:
            self.recording.snapshot(name)
        asked = self.asked()
        value = self._tries(name, call)
        if self.recording is not None:
            self.recording.values[name], self.recording.asked[name] = value, self.asked() - asked
        return value

    def _tries(self, name: str, call: Callable[[], Any]) -> Any:
        for attempt in range(1 + TASK_RETRIES):
            tried = run_try(name, call, self.armed if attempt == 0 else None)
            if attempt == 0:
                self.ops[name] = tried.ops
            self.fired = self.fired or tried.fired
            if tried.ok:
                self.errors.pop(name, None)
                return tried.value
            self.errors[name] = tried.error
            if tried.final:
                return None
        return None

    def run(self, params: dict[str, Any], run_id: str) -> RunResult:
        from regen import pipeline
        from regen.run_params import RunSpec
        from regen_airflow.shard_states import group_label

        s3 = self.s3_client
        planned = self.task("plan", lambda: pipeline.plan(params, run_id, s3))
        if planned is None:
            return RunResult(False, self.errors, self.ops, self.fired)
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
        groups: list[dict[str, Any]] = []
        if fleet is not None:
            listed = self.task(
                "list_shards",
                lambda: pipeline.shard_groups(pipeline.finish_prepared(run, ready, s3), run.shard_task_limit),
            )
            groups = listed or []
        for group in groups:
            label = group_label(group)
            for stage in (pipeline.generate_group, pipeline.validate_group, pipeline.export_group):
                if self.task(f"{stage.__name__}[{label}]", partial(stage, run, group, s3)) is None:
                    break
        published = []
        for summary in ready:
            name = summary["dataset"]
            verified = self.task(f"verify_dataset[{name}]", partial(pipeline.verify_dataset, run, summary, s3))
            publish = partial(pipeline.publish_dataset, run, summary, fleet or [], verified, s3)
            done = self.task(f"publish_dataset[{name}]", publish)
            if done is not None:
                published.append(done)
        reported = self.task("report", lambda: pipeline.report(run, published, fleet or [], s3))
        return RunResult(reported is not None, self.errors, self.ops, self.fired, run.version)


def write_deployment(folder: Path, storage_root: str) -> Path:
    """The run's config and sources: tools at two temperatures, on-policy conversations, and a dataset in parts whose
    first part loses most of its prompts at tokenize (too long), so its shard numbers have a gap."""
    from importlib.resources import files

    folder.mkdir(parents=True, exist_ok=True)
    tools = [json.loads(line) for line in (DATA / "B1_glaive.jsonl").read_text().splitlines()[:4]]
    chats = [json.loads(line) for line in (DATA / "C1_multiturn.jsonl").read_text().splitlines()[:3]]
    short = [json.loads(line) for line in (DATA / "B2_opencodeinstruct.jsonl").read_text().splitlines()[:8]]
    long = [{**row, "id": f"long-{i}", "input": f"(long {i}) " + "word " * 1500} for i, row in enumerate(short[:4])]
    for name, rows in (("tools", tools), ("chats", chats), ("parts", [*long, *short])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    builtin = yaml.safe_load(files("regen").joinpath("builtin_profiles.yaml").read_text())
    profile = {**builtin["kimi-k2.5-mini"], "max_prompt_tokens": 1024}
    config = {
        "defaults": {
            "profile": "crashpoint-mini",
            "storage_root": storage_root,
            "shard_size": 3,
            "in_flight": IN_FLIGHT,
            "checkpoint_every": CHECKPOINT_EVERY,
            "checkpoint_s": 0.2,
            "tokenize_workers": 1,
            "prepare_part_prompts": 6,
            "shard_task_limit": 5,
            "task_retries": TASK_RETRIES,
            "fleet_wait_s": 5,
            "sampling": {"max_new_tokens": 160},
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"], "allowed_storage_roots": [storage_root]},
        "profiles": {"crashpoint-mini": profile},
        "datasets": {
            "tools": {"format": "openai_messages", "paths": [str(folder / "tools.jsonl")], "temperatures": [0.6, 1.0]},
            "chats": {"format": "auto", "turns": "on_policy", "paths": [str(folder / "chats.jsonl")]},
            "parts": {"format": "input_output", "paths": [str(folder / "parts.jsonl")]},
        },
    }
    path = folder / "regen.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Delivered:
    """What a run left for one dataset, as a trainer would find it: through latest.json."""

    version: str | None = None
    records: dict[str, tuple[int, ...]] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)  # the manifest's, by name


def delivered(root: str, profile: str, dataset: str, s3_client: Any) -> Delivered:
    from regen.storage import open_storage
    from regen.verify import manifest_uri_of, read_training_data, verify_version

    found = Delivered()
    try:
        uri, sha256 = manifest_uri_of(dataset, root, profile, s3_client)
    except ValueError as e:
        found.problems.append(f"nothing published: {e}")
        return found
    result = verify_version(uri, s3_client, manifest_sha256=sha256)  # regen verify's verifier
    found.problems += result.problems
    found.version = result.manifest.get("version")
    found.shards = [shard["shard"] for shard in result.manifest.get("shards", [])]
    for split in ("train", "validation", "truncated"):
        for batch in read_training_data(uri, s3_client, split, ["id", "input_ids"], sha256):
            for sample_id, input_ids in zip(
                batch.column("id").to_pylist(), batch.column("input_ids").to_pylist(), strict=True
            ):
                if sample_id in found.records:
                    found.problems.append(f"{sample_id} published twice")
                found.records[sample_id] = tuple(input_ids)
    storage = open_storage(root, s3_client)
    for key in result.manifest.get("files", {}):
        if "/rejected/" in key:
            lines = storage.get_bytes(key).splitlines()
            found.rejected |= {json.loads(line)["id"] for line in lines if json.loads(line).get("id")}
    if both := found.rejected & found.records.keys():
        found.problems.append(f"{len(both)} samples both published and rejected, e.g. {sorted(both)[:2]}")
    return found


@dataclass
class Outcome:
    point: CrashPoint | None
    green: bool
    resumed: bool
    fired: str | None
    violations: list[str]
    errors: dict[str, str]
    extra_generations: int = 0


class Harness:
    """The simulator (answers a prompt the same way every time), and S3 (moto) behind the fault proxy when asked;
    the fault-free run, traced, then a run per crash point from its task on, in the same root restored."""

    def __init__(self, folder: Path, backend: str) -> None:
        self.folder, self.backend, self.count = folder, backend, 0
        self.stack = contextlib.ExitStack()
        try:
            self._start()
        except BaseException:
            self.stack.close()  # the simulator, S3, the environment: as they were
            raise

    def _start(self) -> None:
        from tools.devstack import free_port, start_simulator

        folder, backend = self.folder, self.backend
        self.simulator = self.stack.enter_context(start_simulator(folder, "--omit-think-end-rate", "0"))
        self.s3_client: Callable[[], Any] | None = None
        self.store: tuple[Any, str, str] | None = None  # S3: the store without the proxy, where snapshots are kept
        if backend == "s3":
            from moto.server import ThreadedMotoServer

            from tools.s3_fault_proxy import run_in_thread

            moto = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port())
            moto.start()
            self.stack.callback(moto.stop)
            upstream = f"http://127.0.0.1:{moto._port}"
            proxy_port = free_port()
            _, stop = run_in_thread(upstream, proxy_port, 0.0)
            self.stack.callback(stop)
            INJECTOR.proxy = f"http://127.0.0.1:{proxy_port}"
            self.s3_client = lambda: _client(INJECTOR.proxy or "")
            direct = _client(upstream)
            direct.create_bucket(Bucket="crashpoints")
            self.store = (direct, "crashpoints", "run")
        self.trace: Trace | None = None
        self._reference_ops: dict[str, list[str]] = {}
        self._reference_asked = 0
        self._reference_data: dict[str, Delivered] = {}
        self.stack.enter_context(installed())
        self.stack.callback(_restore_environment, os.environ.get("REGEN_CONFIG"))  # each run points it at its own
        os.environ["REGEN_CONFIG"] = str(write_deployment(folder / "deploy-0", str(folder / "root-0")))
        from regen import pipeline

        pipeline.preload()  # the renderer built once, here: every task forked after it inherits it (as on a worker)
        _import_what_tasks_import()
        self.reference = self.run(None)
        if not self.reference.green or self.reference.violations:
            raise RuntimeError(f"the fault-free run is not green: {self.reference}")

    def close(self) -> None:
        INJECTOR.proxy = None
        self.stack.close()

    def points(self) -> list[CrashPoint]:
        """Every mutating operation of every task of the fault-free run, times every fault."""
        ops = self._reference_ops
        return [
            CrashPoint(task, k, fault)
            for task, made in ops.items()
            for k in range(1, len(made) + 1)
            for fault in FAULTS
        ]

    def run(self, point: CrashPoint | None) -> Outcome:
        """The fault-free run (no point), traced; or a crash point's run and, when it ends red, a Resume; checked."""
        self.count += 1
        n, local = self.count, self.backend == "local"
        root = self.folder / "root" if local else None
        uri = str(root) if root is not None else "s3://crashpoints/run"
        if point is None:  # a crash point's run replays the traced run's root and config
            os.environ["REGEN_CONFIG"] = str(write_deployment(self.folder / f"deploy-{n}", uri))
        params = {"endpoints": [self.simulator.url]}
        asked_before = self._asked()
        trace = Trace(root, self.folder / "trace", s3=self.store) if point is None else None
        replay = self.trace if point is not None else None
        dag = Dag(point, self.s3_client, self._asked, recording=trace, replaying=replay)
        result = dag.run(params, f"cp-{n}")
        outcome = Outcome(point, result.green, False, result.fired, [], dict(result.errors))
        resume = result
        if not result.green:
            if not result.errors:
                outcome.violations.append("red with no failed task naming why")
            again = {**params, "version": result.version} if result.version else params  # plan failed: a new run
            resume = Dag(None, self.s3_client, self._asked).run(again, f"cp-{n}-resume")
            outcome.resumed = True
            if not resume.green:
                outcome.violations.append(f"the Resume is red: {resume.errors}")
        asked = self._asked() - asked_before
        if trace is not None:
            self.trace, self._reference_ops, self._reference_asked = trace, result.ops, asked
            self._reference_data = self._delivered(uri)
            outcome.violations += [f"{d}: {p}" for d, got in self._reference_data.items() for p in got.problems]
            return outcome
        assert point is not None
        outcome.violations += self._compare(uri, result.version or resume.version)
        expected = replay.asked_from(point.task) if replay is not None else self._reference_asked
        outcome.extra_generations = asked - expected
        bound = 2 * IN_FLIGHT + CHECKPOINT_EVERY if point.task.startswith("generate_group") else 0
        if outcome.extra_generations > bound:
            outcome.violations.append(f"{outcome.extra_generations} answers generated again (at most {bound})")
        return outcome

    def _asked(self) -> int:
        """Answers the simulator has sent for samples (its record: a line an answer), the fleet check's probes aside."""
        with self.simulator.record.open("rb") as record:
            return sum(1 for line in record if b'"rid": "regen-probe-' not in line)

    def _delivered(self, root: str) -> dict[str, Delivered]:
        client = self.s3_client() if self.s3_client else None
        return {d: delivered(root, "crashpoint-mini", d, client) for d in ("tools", "chats", "parts")}

    def _compare(self, root: str, version: str) -> list[str]:
        violations = []
        for dataset, got in self._delivered(root).items():
            want = self._reference_data[dataset]
            violations += [f"{dataset}: {p}" for p in got.problems]
            if got.version != version:
                violations.append(f"{dataset}: latest.json names version {got.version}, not {version}")
            if got.records != want.records:
                missing, extra = want.records.keys() - got.records.keys(), got.records.keys() - want.records.keys()
                changed = [i for i in want.records.keys() & got.records.keys() if want.records[i] != got.records[i]]
                violations.append(
                    f"{dataset}: records differ: {len(missing)} missing, {len(extra)} extra, {len(changed)} changed"
                )
            if got.rejected != want.rejected:
                violations.append(f"{dataset}: rejections differ: {sorted(got.rejected ^ want.rejected)[:3]}")
        return violations


def _etags(client: Any, bucket: str, prefix: str) -> dict[str, str]:
    """Every object under `prefix`, by its key below it, with its ETag."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {item["Key"][len(prefix) :]: item["ETag"] for page in pages for item in page.get("Contents", [])}


def _copy_objects(client: Any, bucket: str, source: str, target: str, only: set[str] | None = None) -> None:
    for key in _etags(client, bucket, source) if only is None else only:
        client.copy_object(Bucket=bucket, Key=target + key, CopySource={"Bucket": bucket, "Key": source + key})


def _restore_objects(client: Any, bucket: str, saved: str, prefix: str) -> None:
    """`prefix` made what `saved` holds: objects it lacks or holds otherwise copied back, others deleted (the points
    of one task follow each other, so little differs)."""
    want, have = _etags(client, bucket, saved), _etags(client, bucket, prefix)
    stale = [key for key, etag in have.items() if want.get(key) != etag]
    for start in range(0, len(stale), 1000):  # one request a thousand keys
        batch = [{"Key": prefix + key} for key in stale[start : start + 1000]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
    _copy_objects(client, bucket, saved, prefix, {key for key, etag in want.items() if have.get(key) != etag})


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


def _client(endpoint: str) -> Any:
    import boto3

    from regen.storage import s3_client_config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=s3_client_config("standard", 5),
    )


@contextlib.contextmanager
def harness(backend: str) -> Iterator[Harness]:
    with tempfile.TemporaryDirectory(prefix=f"crashpoints-{backend}-") as tmp:
        made = Harness(Path(tmp), backend)
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
    """Per fault kind: crash points run, faults that fired (a task whose operations vary between runs may make
    fewer than the fault-free run's), runs that ended red and were resumed, and violations."""
    table: dict[str, dict[str, int]] = {}
    for outcome in outcomes:
        assert outcome.point is not None
        row = table.setdefault(outcome.point.fault, Counter())
        row["points"] += 1
        row["fired"] += outcome.fired is not None
        row["resumed"] += outcome.resumed
        row["violations"] += bool(outcome.violations)
    return {fault: dict(row) for fault, row in table.items()}


def parse_point(text: str) -> CrashPoint:
    """`task#k:fault`, as a failure prints it."""
    task, _, rest = text.rpartition("#")
    op, _, fault = rest.partition(":")
    return CrashPoint(task, int(op), fault)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import logging

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", choices=("local", "s3"), default="local")
    parser.add_argument("--sample", type=int, default=None, help="this many points, drawn by --seed (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--point", action="append", default=[], help="run only this point (task#k:fault)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    with harness(args.root) as running:
        points = [parse_point(p) for p in args.point] or sample(running.points(), args.sample, args.seed)
        print(f"{args.root}: {len(running.points())} crash points in all; running {len(points)} (seed {args.seed})")
        outcomes = []
        for point in points:
            outcomes.append(outcome := running.run(point))
            if outcome.violations:
                print(f"VIOLATION {point}: {outcome.violations} (errors: {outcome.errors})")
            elif outcome.resumed:
                print(f"red, then resumed green: {point}: {outcome.errors}")
        print(json.dumps(summary(outcomes)))
    return 1 if any(o.violations for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
