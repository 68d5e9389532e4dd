from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import settings
from hypothesis.internal.conjecture import providers as hypothesis_providers

from regen.chat import ChatRenderer
from regen.config import load_config
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset, ShardManifest
from regen.profiles import lookup
from regen.records import ShardPrompts, read_raw
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.storage import LocalStorage, Storage, read_table
from tests import durations
from tests.durations import REAL_SERVER_MODULES, work_unit
from tools.devstack import Simulator, free_port, moto_client, start_simulator

pytest_plugins = ["tests.real_sglang"]  # the real SGLang server fixtures

ROOT = Path(__file__).resolve().parents[1]

# Property tests draw the same cases on every run and machine: a red CI run is reproduced by running it again, and a
# green one is not luck.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")
# Hypothesis also draws from the string and number constants of the local modules imported so far
# (providers._get_local_constants), so which cases a derandomized test sees would depend on which tests ran before it
# in the process: a case that failed in the whole suite might not be drawn when that test runs alone. Its pool of
# local constants is kept empty, so every test draws the same cases however it is run.
hypothesis_providers._get_local_constants = lambda: hypothesis_providers._local_constants


# Under pytest-xdist (make test runs `-n 2`), a module's tests stay on one worker, so its module-scoped fixtures
# (an Airflow stack, a finished run) are built once; the modules that use the session's real SGLang server share one
# worker, which starts it once. Parity tests, each minutes of SGLang's own code, go wherever a worker is free. (xdist's
# own --dist loadgroup cannot do this under pytest 9: it renames items through a private field pytest 9 dropped.)
REAL_SERVER_FIXTURES = {"real_sglang", "real_sglang_qwen"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # units go out in collection order: the longest first (below)
    return ByWorkUnit(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Work units in the order the workers take them: the longest first, by their seconds in a recent whole run
    (tests/durations.py), so that no worker starts a unit of minutes while the other runs out of work."""
    unit_sizes = Counter(work_unit(item.nodeid) for item in items)
    seconds = durations.recorded()

    def longest_first(item: pytest.Item) -> tuple[float, str]:
        unit = work_unit(item.nodeid)
        return -durations.estimate(unit, unit_sizes[unit], seconds), unit

    items.sort(key=longest_first)  # stable: a module's own order is kept
    strays = {i.nodeid for i in items if REAL_SERVER_FIXTURES & set(getattr(i, "fixturenames", ()))}
    strays = {n for n in strays if n.split("::", 1)[0] not in REAL_SERVER_MODULES}
    if strays:  # it would start another real server on another worker
        raise pytest.UsageError(f"add the modules of {sorted(strays)} to REAL_SERVER_MODULES (tests/durations.py)")


def local_or_s3(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Storage:
    """For a fixture with params ["local", "s3"]: a storage root on local disk, or under `prefix` in a bucket of this
    test's own on S3 (boto3 over HTTP to moto's server)."""
    from regen.storage import S3Storage

    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    client: Any = request.getfixturevalue("s3_client")
    bucket = f"t-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    client.create_bucket(Bucket=bucket)
    return S3Storage(bucket, prefix, client)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of the real server's modules on this worker, its shared servers stop (their session
    fixtures' teardown, at the session's end, finds them stopped)."""
    shared = "real SGLang server"
    if work_unit(item.nodeid) == shared and (nextitem is None or work_unit(nextitem.nodeid) != shared):
        from tests.real_sglang import stop_shared

        stop_shared()


def raw_answers(storage: Storage, key: str | None) -> list[dict[str, Any]]:
    """A shard's raw answers as dicts, read back through the project's own reader."""
    assert key is not None
    with tempfile.TemporaryDirectory() as tmp:
        return [msgspec.structs.asdict(a) for a in read_raw(storage, key, Path(tmp))]


def shard_prompt_ids(storage: Storage, shard: ShardManifest) -> dict[str, list[int]]:
    prompts = ShardPrompts(read_table(storage, shard.prompts_key))
    return {sample_id: prompts.prompt_ids(sample_id).tolist() for sample_id in prompts.ids}


def prepare_sample(
    root: Path,
    renderer: ChatRenderer,
    dataset: str,
    shard_size: int,
    limit: int | None = None,
    version: str = "v1",
    by_length: bool = False,
) -> tuple[PreparedDataset, LocalStorage]:
    """One of the bundled sample datasets, prepared into a local storage root as `version`; `by_length`: longest
    first (references counted)."""
    config = load_config()
    storage = LocalStorage(root)
    location = DatasetLocation(storage.root_uri, renderer.profile.name, dataset, version)
    prepared = run_prepare(
        config.dataset(dataset),
        location,
        storage,
        renderer,
        PrepareSettings(
            shard_size=shard_size, limit=limit, resolve_path=config.resolve, workers=1, by_length=by_length
        ),
    )
    return prepared, storage


def project_config_in(folder: Path, **governance: list[str]) -> Path:
    """The project's config/regen.yaml written into `folder` with its relative paths made absolute, and `governance`
    over its own: for tests whose runs write to a temporary root."""
    import yaml

    source = ROOT / "config" / "regen.yaml"
    config = load_config(source)
    raw = yaml.safe_load(source.read_text())
    raw["defaults"]["storage_root"] = config.resolve(raw["defaults"]["storage_root"])
    for name, dataset in raw["datasets"].items():
        if "paths" in dataset:
            dataset["paths"] = [config.resolve(path) for path in config.datasets[name].paths or []]
    raw["governance"] = {
        "allowed_endpoints": governance.get("allowed_endpoints", config.allowed_endpoints),
        "allowed_storage_roots": [
            *map(str, config.allowed_storage_roots),
            *governance.get("allowed_storage_roots", []),
        ],
    }
    path = folder / "regen.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def tmp_roots_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project's config, whose runs may also write under this test's tmp_path."""
    folder = tmp_path / "deployment"
    folder.mkdir()
    monkeypatch.setenv("REGEN_CONFIG", str(project_config_in(folder, allowed_storage_roots=[str(tmp_path)])))
    return tmp_path


class CountingStorage:
    """A storage passing every call on, and noting each (method, arguments): what a reader asked for."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return attribute(*args, **kwargs)

        return counted

    def asked(self, method: str) -> list[Any]:
        """The first argument (the key, the prefix) of every call of `method`."""
        return [args[0] for name, args in self.calls if name == method]

    def arguments(self, method: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == method]


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    return ChatRenderer(lookup("kimi-k2.5-mini"))


@pytest.fixture(scope="session")
def simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    with start_simulator(tmp_path_factory.mktemp("sim"), "--omit-think-end-rate", "0") as sim:
        yield sim


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 HTTP API on loopback (moto server); boto3 talks to it over HTTP."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_client(s3_endpoint: str) -> Any:
    return moto_client(s3_endpoint)


def finish_shards(
    shards: list[ShardManifest], storage: Storage, renderer: ChatRenderer, url: str
) -> list[ShardManifest]:
    """Each shard through generate, validate and export against the server at `url`, as the DAG runs them."""
    from regen.config import Sampling
    from regen.stages.export import run_export
    from regen.stages.generate.generate import GenerateSettings, run_generate
    from regen.stages.validate import run_validate

    settings = GenerateSettings([url], Sampling().as_params(), concurrency=8)
    generated = [run_generate(s, storage, settings, renderer) for s in shards]
    return [run_export(run_validate(s, storage, renderer), storage) for s in generated]


KILLABLE_GENERATE = """
import json, sys
from regen.chat import ChatRenderer
from regen.profiles import lookup
from regen.config import Sampling
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.manifest import ShardManifest
from regen.storage import LocalStorage
shard = ShardManifest.from_dict(json.loads(sys.argv[1]))
settings = GenerateSettings([sys.argv[3]], Sampling().as_params(), concurrency=4, checkpoint_every=4, checkpoint_s=0.2)
renderer = ChatRenderer(lookup(sys.argv[4])) if len(sys.argv) > 4 else None  # for on-policy conversations
run_generate(shard, LocalStorage(__import__("pathlib").Path(sys.argv[2])), settings, renderer)
"""


def _publish_sample(root: Path, renderer: ChatRenderer, simulator: Simulator, version: str, limit: int) -> None:
    from regen.stages.publish.publish import run_publish

    prepared, storage = prepare_sample(root, renderer, "B1_glaive", 10, limit, version=version)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    run_publish(prepared, storage, fleet=[], run_id=f"manual__{version}")


@pytest.fixture(scope="session")
def drafter_root(tmp_path_factory: pytest.TempPathFactory, renderer: ChatRenderer, simulator: Simulator) -> Path:
    """A storage root as the "Drafter data" page finds it: B1_glaive published twice (12, then 20 prompts) and a
    third version whose first shard is finished and whose second was being generated when its task was SIGKILLed;
    B2_opencodeinstruct prepared and never generated."""
    import signal
    import subprocess

    path = tmp_path_factory.mktemp("drafter")
    _publish_sample(path, renderer, simulator, "night-1", 12)
    _publish_sample(path, renderer, simulator, "night-2", 20)
    prepared, storage = prepare_sample(path, renderer, "B1_glaive", 10, 20, version="night-3")
    first, second = prepared.shards
    finish_shards([first], storage, renderer, simulator.url)
    slow = start_simulator(path, "--decode-ms-per-token", "4")
    try:
        worker = subprocess.Popen(
            [sys.executable, "-c", KILLABLE_GENERATE, json.dumps(second.to_dict()), str(path), slow.url]
        )
        deadline = time.monotonic() + 60
        while not storage.exists(second.keys.progress) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a few more checkpoints
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        slow.process.terminate()
        slow.process.wait(10)
    prepare_sample(path, renderer, "B2_opencodeinstruct", 10, 10, version="night-3")
    return path


def kept_keys(shard: dict[str, Any]) -> list[str]:
    """A manifest shard's files of kept answers: train/, and validation/ where its prompts are held out."""
    return [shard["train"], *([shard["validation"]] if shard.get("validation") else [])]


def kept_records(manifest: dict[str, Any]) -> int:
    """A published version's kept answers: trained on, or held out for validation."""
    return int(manifest["records"]) + int(manifest.get("splits", {}).get("validation", 0))


def each_shard(run: Any, prepared: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every shard manifest of the prepared datasets, as the DAG's generate tasks get them: groups, then each group's
    shards from prepare's record. `run`: a regen.run_params.RunSpec."""
    from regen import pipeline

    for group in pipeline.run_groups(run, prepared):
        yield from pipeline.group_shards(run, group)
