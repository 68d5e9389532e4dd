from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from regen.chat import ChatRenderer, get_profile
from regen.config import load_config
from regen.datasets.prepare import run_prepare
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset, ShardManifest
from regen.records import ShardPrompts, read_raw
from regen.storage import LocalStorage, Storage, read_table
from tools.devstack import Simulator, free_port, start_simulator

ROOT = Path(__file__).resolve().parents[1]


def raw_answers(storage: Storage, key: str | None) -> list[dict[str, Any]]:
    """A shard's raw answers as dicts, read back through the project's own reader."""
    assert key is not None
    with tempfile.TemporaryDirectory() as tmp:
        return [msgspec.structs.asdict(a) for a in read_raw(storage, key, Path(tmp))]


def shard_prompt_ids(storage: Storage, shard: ShardManifest) -> dict[str, list[int]]:
    prompts = ShardPrompts(read_table(storage, shard.prompts_key))
    return {sample_id: prompts.prompt_ids(sample_id).tolist() for sample_id in prompts.ids}


def prepare_sample(
    root: Path, renderer: ChatRenderer, dataset: str, shard_size: int, limit: int | None = None
) -> tuple[PreparedDataset, LocalStorage]:
    """One of the bundled sample datasets, prepared into a local storage root as version v1."""
    config = load_config()
    storage = LocalStorage(root)
    location = DatasetLocation(storage.root_uri, renderer.profile.name, dataset, "v1")
    prepared = run_prepare(
        config.dataset(dataset), location, storage, renderer, shard_size, limit, config.resolve, workers=1
    )
    return prepared, storage


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    return ChatRenderer(get_profile("kimi-k2.5-mini"))


@pytest.fixture(scope="session")
def simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    sim = start_simulator(tmp_path_factory.mktemp("sim"), "--omit-think-end-rate", "0")
    yield sim
    sim.process.terminate()
    sim.process.wait(10)


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
def s3_client(s3_endpoint: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
