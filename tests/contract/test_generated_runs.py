"""Generated runs checked against the contract (tests/contract/contract.py): a Hypothesis state machine that draws
datasets of every shape, then a sequence of triggers with drawn parameters, runs stopped part-way and the page's
Resume of them, nightlies, config defaults changed between runs, versions left by the previous release and one
storage operation of a run failed (the task's retry meets what its first try left), on a fleet drawn per run
(sound, answering with defects, or flaky). After every step each published version must be what
the docs promise, pass `regen verify`, and agree with every other version; a run that should deliver is green, a red
one names what failed and its Resume delivers; a skipped nightly's version is what a fresh run would publish.

Budget: CI runs GENERATED_EXAMPLES (a fixed seed) here; bench/bench_generated_runs.py runs thousands. A failure
prints the shrunk sequence of steps as Hypothesis's reproduction (`state = GeneratedRuns()` ...)."""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.contract import contract
from tests.contract.runs import RunOutcome, run_dag
from tests.contract.shapes import dataset

pytestmark = pytest.mark.generated

FLEETS = {  # simulator flags of each fleet a run may be sent to
    "sound": ("--omit-think-end-rate", "0", "--enable-priority-scheduling"),  # chain priority takes effect there
    # Answers validation rejects; not count mismatches, which are the fleet's losses (a red run past the allowance:
    # the losing fleet's part)
    "defects": ("--omit-think-end-rate", "0", "--defect-rate", "0.15", "--defect-count-mismatch-rate", "0"),
    "flaky": ("--omit-think-end-rate", "0", "--http-503-rate", "0.1", "--abort-rate", "0.1", "--fault-seed", "3"),
    "losing": ("--omit-think-end-rate", "0", "--abort-prompt-rate", "0.05"),  # some prompts aborted on every attempt
}
SHARES = (None, 0.0, 0.02, 0.3, 0.5, 1.0)  # None: the config's default
DEFAULTS = {"validation_share": 0.3, "temperature": 1.0, "review_text": False, "longest_first": True}
# Every other setting of the config's defaults a deployment may change between nightlies, with a value beside its
# default: a nightly after the change either regenerates the dataset or skips it, and a skip is checked by a fresh run
# (check_skip). NOT_DRAWN says why each remaining field is not (test_every_setting_is_drawn_or_said_why).
SETTINGS: dict[str, tuple[Any, ...]] = {
    "prepare_part_prompts": (5, 12),  # a dataset tokenized in parts, of several sizes
    "in_flight": (1, 4),  # a task asks one or a few at a time: the send order and the length fit decide what is next
    "shard_tasks": (1, 8),  # (each task's concurrency is in_flight / shard_tasks)
    "tokenize_workers": (2,),
    "shard_task_limit": (1, 2),  # several shards a task
    "sampling.max_new_tokens": (40, 300),  # answers cut (the truncated/ split) or not
    "sampling.top_p": (0.5,),
    "sampling.top_k": (20,),
    "sampling.min_p": (0.05,),
    "export.jsonl": (True,),
    "validation.render_check_fraction": (1.0,),
    "validation.retokenize_fraction": (1.0,),
    "max_attempts": (2,),
    "endpoint_affinity": (False,),
    "chain_priority": (True,),  # on the sound fleet, which schedules by priority: turns sent by turns left
    "checkpoint_every": (3,),
    "max_server_rejected_share": (0.0, 0.3),
}
NOT_DRAWN = {
    "profile": "one profile: another writes under another folder, a separate history",
    "endpoints": "drawn per run (the fleets)",
    "storage_root": "one root per deployment",
    "shard_size": "drawn at deploy and per trigger",
    "validation_share": "DEFAULTS",
    "longest_first": "DEFAULTS",
    "sampling.temperature": "DEFAULTS",
    "export.review_text": "DEFAULTS",
    "validation.render_check_minimum": "as its fraction",
    "validation.retokenize_minimum": "as its fraction",
    "fleet_pool_slots": "Airflow's pool",
    "request_timeout_s": "no answer of these fleets comes near it",
    "priority": "sent to SGLang, which the simulator ignores",
    "sample_timeouts": "no answer of these fleets times out",
    "fleet_wait_s": "these fleets never go down whole",
    "checkpoint_s": "checkpoint_every draws the same path",
    "s3": "local storage",
    "cost": "the run report's prices, no data",
    "schedule": "Airflow's scheduler",
    "task_retries": "runs.RETRIES",
    "retry_delay_s": "Airflow's scheduler",
    "verify_poll_s": "Airflow's triggerer",
    "sglang_conn_id": "Airflow's connections",
}
_fleet: dict[str, Any] = {}
# With REGEN_GENERATED_COLLECT set (bench/bench_generated_runs.py), problems are collected with the steps that led to
# them instead of failing the example, and what the runs covered is counted.
COLLECT = bool(os.environ.get("REGEN_GENERATED_COLLECT"))
FOUND: list[dict[str, Any]] = []
COVERED: Counter[str] = Counter()


STORAGE_WRITES = ("put_bytes", "create", "replace", "delete_if", "put_file", "delete")  # a root's mutating operations


@contextlib.contextmanager
def one_storage_fault(nth: int, fault: str) -> Iterator[list[str]]:
    """The local root fails the run's `nth` mutating operation once (any task's, any thread's): `before` it lands,
    or `lost_reply`, an error once it landed. Yields what it failed ("" unless the run got that far)."""
    from regen.storage import LocalStorage

    count, fired = itertools.count(), []
    originals = {name: getattr(LocalStorage, name) for name in STORAGE_WRITES}

    def failing(name: str, original: Any) -> Any:
        def operation(self: Any, key: str, *args: Any, **kwargs: Any) -> Any:
            if next(count) != nth:
                return original(self, key, *args, **kwargs)
            fired.append(f"{name} {key}")
            if fault == "before":
                raise OSError(errno.EIO, f"planted: {name} {key} failed")
            original(self, key, *args, **kwargs)
            raise OSError(errno.EIO, f"planted: {name} {key} landed, its reply lost")

        return operation

    for name, original in originals.items():
        setattr(LocalStorage, name, failing(name, original))
    try:
        yield fired
    finally:
        for name, original in originals.items():
            setattr(LocalStorage, name, original)


def fleet(name: str) -> Any:
    """The process's simulator of that kind, started once (stopped at exit)."""
    if name not in _fleet:
        from tools.devstack import start_simulator

        # This checkout's simulator, even where PYTHONPATH points the library at an older one (bench_generated_runs)
        here = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "include")}
        _fleet[name] = start_simulator(Path(tempfile.mkdtemp(prefix=f"regen-fleet-{name}-")), *FLEETS[name], env=here)
        atexit.register(_fleet[name].stop)
    return _fleet[name]


class GeneratedRuns(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="regen-generated-"))
        self.saved_config = os.environ.get("REGEN_CONFIG")
        self.datasets: dict[str, dict[str, Any]] = {}
        self.defaults = dict(DEFAULTS)
        self.settings: dict[str, Any] = {}  # SETTINGS changed from their defaults
        self.runs: list[RunOutcome] = []
        self.versions: dict[str, dict[str, Any]] = {}  # "dataset/version" -> what made it, and its manifest
        self.clock = datetime(2026, 1, 1, tzinfo=UTC)
        self.red: list[RunOutcome] = []  # red runs with a version to resume
        self.shard_size = 6
        self.problems: list[str] = []
        self.steps: list[str] = []
        self.compared: set[tuple[str, str]] = set()
        self.planted = False  # a storage fault planted in the run under way: its task's retry is expected

    # -- the deployment ---------------------------------------------------------------------------------------
    @initialize(
        entries=st.lists(st.integers(0, 2**16), min_size=1, max_size=3, unique=True),
        shard_size=st.sampled_from((6, 24)),
        data=st.data(),
    )
    def deploy(self, entries: list[int], shard_size: int, data: st.DataObject) -> None:
        """The deployment's datasets and its default shard size (24: a shard that fits its answer lengths)."""
        self.shard_size = shard_size
        for i in entries:
            name = f"d{i}"
            entry = data.draw(dataset(name), label=name)
            path = self.folder / f"{name}.jsonl"
            path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in entry["rows"]))
            self.datasets[name] = {**{k: v for k, v in entry.items() if k != "rows"}, "paths": [str(path)]}
            self.datasets[name]["_rows"] = entry["rows"]
            COVERED.update(shape_of(entry))
        self.write_config()

    def write_config(self) -> None:
        d = self.defaults
        config = {
            "defaults": {
                "storage_root": str(self.folder / "storage"),
                "endpoints": [fleet("sound").url],
                "shard_size": self.shard_size,
                "tokenize_workers": 1,
                "validation_share": d["validation_share"],
                "sampling": {"temperature": d["temperature"]},
                "export": {"review_text": d["review_text"]},
                "longest_first": d["longest_first"],
            },
            "governance": {"allowed_endpoints": ["127.0.0.1"]},
            "datasets": {n: {k: v for k, v in e.items() if k != "_rows"} for n, e in self.datasets.items()},
        }
        for path, value in self.settings.items():
            *within, name = path.split(".")
            section = config["defaults"]
            for key in within:
                section = section.setdefault(key, {})
            section[name] = value
        (self.folder / "regen.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
        os.environ["REGEN_CONFIG"] = str(self.folder / "regen.yaml")

    def teardown(self) -> None:
        if self.saved_config is None:
            os.environ.pop("REGEN_CONFIG", None)
        else:
            os.environ["REGEN_CONFIG"] = self.saved_config
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- the rules: what people do ------------------------------------------------------------------------------
    @rule(
        data=st.data(),
        share=st.sampled_from(SHARES),
        temperature=st.sampled_from((None, 0.0, 0.7)),
        export=st.sampled_from((None, {"review_text": True}, {"jsonl": True})),
        on=st.sampled_from(("sound", "sound", "defects", "flaky", "losing")),
        stop_after=st.sampled_from((None, None, None, 0, 1)),
        shard_size=st.sampled_from((None, 4, 24, 96)),
        in_flight=st.sampled_from((None, 1, 4)),
    )
    def trigger(
        self,
        data: st.DataObject,
        share: float | None,
        temperature: float | None,
        export: dict[str, bool] | None,
        on: str,
        stop_after: int | None,
        shard_size: int | None,
        in_flight: int | None = None,
    ) -> None:
        """A run triggered with the form's parameters. A shard of 96 asked one or a few at a time (`in_flight`; None:
        the config's): its length fit is made after 16, 32 and 64 answers with the shard's shorter answers pending,
        and again by the task's retry (shapes.CAPPED_LONG)."""
        names = data.draw(st.lists(st.sampled_from(sorted(self.datasets)), min_size=1, unique=True), label="datasets")
        params: dict[str, Any] = {"datasets": names, "skip_unchanged": False, "endpoints": [fleet(on).url]}
        given = {"validation_share": share, "temperature": temperature, "export": export}
        given |= {"shard_size": shard_size, "in_flight": in_flight}
        params |= {k: v for k, v in given.items() if v is not None}
        self.run(params, on, stop_after)

    @rule(
        data=st.data(),
        share=st.sampled_from(SHARES[1:-1]),
        temperature=st.sampled_from((None, 0.0, 0.7)),
        export=st.sampled_from((None, {"review_text": True})),
        stop_after=st.sampled_from((0, 1)),
        new_defaults=st.booleans(),
        upgrade=st.booleans(),
    )
    def stopped_then_resumed(
        self,
        data: st.DataObject,
        share: float,
        temperature: float | None,
        export: dict[str, bool] | None,
        stop_after: int,
        new_defaults: bool,
        upgrade: bool,
    ) -> None:
        """The sequence a red night makes: a run stopped part-way, maybe the config's defaults changed or the
        pipeline upgraded before anyone looks, then the page's Resume."""
        self.trigger(data, share, temperature, export, "sound", stop_after, None)
        if not self.red or self.red[-1] is not self.runs[-1]:
            return  # it had nothing left to stop, or was refused at plan
        if new_defaults:
            self.change_defaults(
                data.draw(st.sampled_from((0.0, 0.02, 0.3, 0.5)), label="default share"),
                data.draw(st.sampled_from((0.7, 1.0)), label="default temperature"),
                data.draw(st.booleans(), label="default review_text"),
                data.draw(st.booleans(), label="default longest_first"),
            )
        if upgrade:
            self.upgrade_mid_version()
        self.resume(len(self.red) - 1)

    @rule(data=st.data(), fault=st.sampled_from(("before", "lost_reply")), nth=st.integers(0, 250))
    def storage_fault(self, data: st.DataObject, fault: str, nth: int) -> None:
        """A trigger on the sound fleet whose storage fails one operation: the task's retry absorbs it, and the run
        ends green with the data a run without the fault publishes (docs/guarantees.md: a transient fault is retried,
        finished work survives)."""
        names = data.draw(st.lists(st.sampled_from(sorted(self.datasets)), min_size=1, unique=True), label="datasets")
        self.planted = True
        with one_storage_fault(nth, fault) as fired:
            self.run({"datasets": names, "skip_unchanged": False, "endpoints": [fleet("sound").url]}, "sound", None)
        self.planted = False
        self.steps[-1] += f"; storage fault {fault} at operation {nth}: {fired[0] if fired else 'not reached'}"
        COVERED.update([f"storage_fault:{fault}" if fired else "storage_fault:not_reached"])

    @precondition(lambda self: bool(self.red))
    @rule(pick=st.integers(0, 10))
    def resume(self, pick: int) -> None:
        """The Drafter data page's Resume: the red run's datasets and version, nothing else (today's defaults)."""
        red = self.red.pop(pick % len(self.red))
        self.run({"datasets": red.params["datasets"], "version": red.version}, "sound", None, resuming=red)

    @rule()
    def nightly(self) -> None:
        self.run({}, "sound", None)

    @rule(
        share=st.sampled_from((0.0, 0.02, 0.3, 0.5)),
        temperature=st.sampled_from((0.7, 1.0)),
        review_text=st.booleans(),
        longest_first=st.booleans(),
    )
    def change_defaults(self, share: float, temperature: float, review_text: bool, longest_first: bool) -> None:
        self.steps.append(f"change_defaults {share=} {temperature=} {review_text=} {longest_first=}")
        self.defaults = {
            "validation_share": share,
            "temperature": temperature,
            "review_text": review_text,
            "longest_first": longest_first,
        }
        self.write_config()

    @rule(
        data=st.data(),
        paths=st.lists(st.sampled_from(sorted(SETTINGS)), min_size=1, max_size=4, unique=True),
        back=st.booleans(),
    )
    def change_settings(self, data: st.DataObject, paths: list[str], back: bool) -> None:
        """Other defaults of the config changed (or set back), as a deployment does between nightlies."""
        for path in paths:
            if back:
                self.settings.pop(path, None)
            else:
                self.settings[path] = data.draw(st.sampled_from(SETTINGS[path]), label=path)
            self.steps.append(f"change_setting {path}={self.settings.get(path, 'default')}")
            COVERED.update([f"setting:{path}"])
        self.write_config()

    @precondition(lambda self: bool(self.red))
    @rule()
    def upgrade_mid_version(self) -> None:
        """The red run's version was prepared by the release before source keys: its prompts hold a null
        source_key column (what a part tokenized then and finished by this release leaves)."""
        red = self.red[-1]
        self.steps.append(f"upgrade_mid_version {red.version}")
        root = self.folder / "storage" / "kimi-k2.5-mini"
        for name in red.params.get("datasets") or sorted(self.datasets):
            prepared = root / name / str(red.version) / "prompts" / "prepare.json"
            if not prepared.exists() or (prepared.parent.parent / "manifest.json").exists():
                continue  # not prepared, or published whole: an upgrade changes no published file
            record = json.loads(prepared.read_text())
            for shard in record["shards"]:
                path = prepared.parent / f"shard-{shard['shard']:05d}.parquet"
                table = pq.read_table(path)
                column = table.schema.get_field_index("source_key")
                nulls = pa.nulls(table.num_rows, pa.string())
                pq.write_table(table.set_column(column, "source_key", nulls), path)
                shard["prompts_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            prepared.write_text(json.dumps(record))

    # -- running and recording ------------------------------------------------------------------------------------
    def run(self, params: dict[str, Any], on: str, stop_after: int | None, resuming: RunOutcome | None = None) -> None:
        self.clock += timedelta(days=1)
        run_id = f"run-{len(self.runs)}"
        asked = {name: len(sim.records()) for name, sim in _fleet.items()}
        outcome = run_dag({**params}, run_id, self.clock, stop_after)
        self.runs.append(outcome)
        kind = "resume" if resuming else "nightly" if not params else "trigger"
        self.steps.append(
            f"{kind} {run_id} {params} on={on} stop_after={stop_after}: {'green' if outcome.green else 'red'}"
        )
        COVERED.update([f"run:{kind}", f"fleet:{on}", "green" if outcome.green else "red", "runs"])
        sent = {name: sim.records()[asked.get(name, 0) :] for name, sim in _fleet.items()}
        names = params.get("datasets") or sorted(self.datasets)
        if params.get("validation_share", 0) > 0.5:  # docs/config-reference.md: at most half held out
            if outcome.green or "validation_share" not in outcome.errors.get("plan", ""):
                self.problems.append(f"{run_id}: validation_share {params['validation_share']} not refused at plan")
            return
        should_deliver = stop_after is None and on in ("sound", "defects")
        if should_deliver and not outcome.green:
            self.problems.append(f"{run_id} {params}: red, though nothing stopped it: {outcome.errors}")
        if on in ("sound", "defects") and not self.planted and outcome.retried:  # a retry may hide what failed
            self.problems.append(f"{run_id} {params}: a task failed with no fault planted: {outcome.retried}")
        if not outcome.green and not outcome.errors:
            self.problems.append(f"{run_id}: red without naming a failed task")
        if not outcome.green and outcome.version:
            self.red.append(outcome)
        if resuming is not None and not outcome.green:
            self.problems.append(f"{run_id}: the Resume of {resuming.run_id} is red: {outcome.errors}")
        for name in names:
            self.record_version(outcome, name, on, sent, resuming)

    def record_version(
        self,
        outcome: RunOutcome,
        name: str,
        on: str,
        sent: dict[str, list[dict[str, Any]]],
        resuming: RunOutcome | None,
    ) -> None:
        key = f"{name}/{outcome.version}"
        made = self.versions.setdefault(key, {"by": None, "fleets": set()})
        if made["by"] is None and resuming is None:  # the run that prepared it: its settings are the version's
            p, export = outcome.params, outcome.params.get("export")
            made["by"] = {
                "share": p.get("validation_share", self.defaults["validation_share"]),
                "temperature": p.get("temperature", self.defaults["temperature"]),
                "review_text": self.defaults["review_text"] if export is None else bool(export.get("review_text")),
            }
        made["fleets"].add(on)
        summary = outcome.published.get(name)
        if summary is None:
            return
        if summary.get("unchanged"):
            self.check_skip(name, summary)
            return
        made["manifest"] = summary["manifest"]
        self.check_version(key, made, sent)

    # -- the contract ---------------------------------------------------------------------------------------------
    def check_version(self, key: str, made: dict[str, Any], sent: dict[str, list[dict[str, Any]]]) -> None:
        from regen.verify import verify_version

        name = key.split("/")[0]
        version = contract.Version.read(made["manifest"])
        entry = self.datasets[name]
        expected = contract.expected_prompts(entry["_rows"], entry["turns"])
        samples = len(entry.get("temperatures") or [None])
        found = contract.version_problems(version, expected, samples)
        found += contract.held_out_share_problems(version)
        found += contract.fleet_loss_problems(version, self.settings.get("max_server_rejected_share", 0.02))
        by = made["by"]
        if by is not None:
            if version.share != by["share"]:
                found.append(f"manifest validation_share {version.share}, the version was prepared at {by['share']}")
            sampled = version.manifest.get("sampling_params", {}).get("temperature")
            if not entry.get("temperatures") and sampled != by["temperature"]:
                found.append(f"manifest temperature {sampled}, the version was prepared at {by['temperature']}")
            ids = set(version.prompts)
            temperatures = {
                r["sampling"]["temperature"]
                for rs in sent.values()
                for r in rs
                if r["rid"].split(contract.TURN)[0].split("-")[0] in ids
            }
            if not entry.get("temperatures") and temperatures - {by["temperature"]}:
                found.append(f"requests sent at {temperatures}, the version's temperature is {by['temperature']}")
            texts = {("text" in r) for split in contract.SPLITS for r in version.rows[split]}
            if texts and texts != {by["review_text"]}:
                found.append(f"review text columns {texts}, the version's review_text is {by['review_text']}")
        problems = verify_version(made["manifest"]).problems
        found += [f"regen verify: {p}" for p in problems[:3]]
        self.problems += [f"{key}: {p}" for p in found]

    def check_skip(self, name: str, summary: dict[str, Any]) -> None:
        """A skipped nightly claims that nothing would change: the same run made afresh publishes the skipped
        version's data."""
        skipped = next((v for k, v in self.versions.items() if k == f"{name}/{summary['version']}"), None)
        if skipped is None or "manifest" not in skipped or skipped["fleets"] != {"sound"}:
            return
        self.clock += timedelta(hours=1)
        fresh = run_dag({"datasets": [name], "skip_unchanged": False}, f"fresh-{len(self.runs)}", self.clock)
        COVERED.update(["runs", "run:fresh_after_skip"])
        if name not in fresh.published:
            self.problems.append(f"{name}: the fresh run of a skipped dataset is red: {fresh.errors}")
            return
        was = contract.data_of(contract.Version.read(skipped["manifest"]))
        now = contract.data_of(contract.Version.read(fresh.published[name]["manifest"]))
        if was != now:
            self.problems.append(f"{name}: skipped as unchanged since {summary['version']}, yet a fresh run differs")

    @invariant()
    def versions_agree(self) -> None:
        """Every pair of versions, once: sides agree across shares, and the same inputs on a sound (deterministic)
        fleet make the same data, whatever hints, shard sizes or Resumes made them."""
        read = {k: contract.Version.read(v["manifest"]) for k, v in self.versions.items() if "manifest" in v}
        for a in sorted(read):
            for b in sorted(read):
                if a >= b or (a, b) in self.compared:
                    continue
                self.compared.add((a, b))
                self.problems += [f"{a} ~ {b}: {p}" for p in contract.between_versions_problems(read[a], read[b])]
                digests = {read[k].manifest.get("inputs", {}).get("digest") for k in (a, b)}
                sound = self.versions[a]["fleets"] == self.versions[b]["fleets"] == {"sound"}
                alike = len(digests) == 1 and sound and a.split("/")[0] == b.split("/")[0]
                if alike and contract.data_of(read[a]) != contract.data_of(read[b]):
                    self.problems.append(f"{a} ~ {b}: the same inputs on a sound fleet, different data")

    @invariant()
    def no_problem(self) -> None:
        if COLLECT and self.problems:
            FOUND.append({"problems": self.problems, "steps": list(self.steps)})
            self.problems = []
        assert not self.problems, "\n".join(self.problems[:10])


def shape_of(entry: dict[str, Any]) -> list[str]:
    """What a drawn dataset covers: its turn mode and its rows' shapes."""
    shapes = [f"turns:{entry['turns']}", "temperatures" if entry.get("temperatures") else "one sample"]
    for row in entry["rows"]:
        roles = [m["role"] for m in row["messages"]]
        shapes.append("row")
        shapes += ["row:assistant_first"] if roles[0] == "assistant" or roles[:2] == ["system", "assistant"] else []
        shapes += ["row:no_user"] if "user" not in roles else []
        shapes += ["row:waits"] if roles[-1] == "user" else []
        shapes += ["row:tools"] if row.get("tools") else []
        shapes += ["row:empty_turn"] if any(contract.blank(m) for m in row["messages"]) else []
    return shapes


GENERATED_EXAMPLES = int(os.environ.get("REGEN_GENERATED_EXAMPLES", "15"))
TestGeneratedRuns = GeneratedRuns.TestCase
TestGeneratedRuns.settings = settings(
    max_examples=GENERATED_EXAMPLES,
    stateful_step_count=6,
    deadline=None,
    derandomize=os.environ.get("REGEN_GENERATED_SEED") is None,
    phases=[p for p in Phase if p is not Phase.shrink or not os.environ.get("REGEN_GENERATED_NO_SHRINK")],
    suppress_health_check=list(HealthCheck),
)


def test_every_setting_is_drawn_or_said_why() -> None:
    """A default added to the config is drawn between nightlies or named in NOT_DRAWN with why: a setting the
    generator never changes is one whose skipped nightly nobody checks."""
    from pydantic import BaseModel

    from regen.config.defaults import Defaults

    def paths(model: type[BaseModel], prefix: str = "") -> set[str]:
        found = set()
        for name, info in model.model_fields.items():
            nested = info.annotation if isinstance(info.annotation, type) else None
            if nested is not None and issubclass(nested, BaseModel) and name not in ("s3", "cost"):
                found |= paths(nested, f"{prefix}{name}.")
            else:
                found.add(prefix + name)
        return found

    drawn = set(SETTINGS) | set(NOT_DRAWN)
    assert paths(Defaults) - drawn == set(), "draw these in SETTINGS, or say in NOT_DRAWN why not"
    assert drawn - paths(Defaults) == set(), "no such setting"
