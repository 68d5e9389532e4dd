from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from regen.chat import ChatRenderer, get_profile

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    return ChatRenderer(get_profile("kimi-k2.5-mini"))


class Simulator:
    def __init__(self, url: str, record: Path, process: subprocess.Popen[bytes]) -> None:
        self.url, self.record, self.process = url, record, process

    def records(self) -> list[dict]:
        import json

        return [json.loads(line) for line in self.record.read_text().splitlines()]


def start_simulator(tmp: Path, *args: str, port: int | None = None) -> Simulator:
    port = port or free_port()
    record = tmp / f"record-{port}.jsonl"
    record.touch()
    process = subprocess.Popen(
        [sys.executable, "-m", "regen.simulator", "--port", str(port), "--record", str(record), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/model_info", timeout=1).ok:
                return Simulator(url, record, process)
        except requests.ConnectionError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("the simulator did not start")


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
