"""S3 as it really fails: every stage writes and reads through a proxy that answers a quarter of the requests with
500 InternalError, 503 SlowDown or a dropped connection (tools/s3_fault_proxy.py, in front of a moto server). With
botocore's retries the version lands exactly once and verifies clean. A user's S3 mistakes are named at once."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.config import load_config
from regen.layout import DatasetLocation
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.stages.publish.publish import run_publish
from regen.storage import Changed, KeyExists, S3Storage, check_writable, s3_client_config
from regen.verify import verify_version
from tests.conftest import Simulator, finish_shards
from tools.devstack import free_port, wait_until
from tools.s3_fault_proxy import FaultProxy, run_in_thread

# Files a version holds besides those its manifest lists: bookkeeping that makes stages idempotent.
BOOKKEEPING = re.compile(
    r"(manifest\.json|prompts/prepare\.json|raw/shard-\d+\.generation\.json|reports/shard-\d+(\.generate|\.validate)?\.json)$"
)


def client(endpoint: str, access_key: str = "testing", attempts: int = 10) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key="testing",
        config=s3_client_config("standard", attempts),
    )


@pytest.fixture(scope="module")
def proxied(s3_endpoint: str) -> Iterator[tuple[FaultProxy, str]]:
    port = free_port()
    proxy, stop = run_in_thread(s3_endpoint, port, fault_rate=0.25, seed=7)
    yield proxy, f"http://127.0.0.1:{port}"
    stop()


def test_a_version_published_through_s3_faults_lands_exactly_once_and_verifies_clean(
    tmp_path: Path,
    renderer: ChatRenderer,
    simulator: Simulator,
    s3_endpoint: str,
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, url = proxied
    client(s3_endpoint).create_bucket(Bucket="faults")
    storage = S3Storage("faults", "runs", client(url))
    config = load_config()
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "B1_glaive", "v1")
    dataset = config.dataset("B1_glaive")
    prepared = run_prepare(
        dataset,
        location,
        storage,
        renderer,
        PrepareSettings(shard_size=20, limit=None, resolve_path=config.resolve, workers=1),
    )
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    proxy.drop_replies.append(("PUT", f"/{location.manifest}"))  # the manifest lands, its writer never hears it
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (9 * 4096 + 7))  # a multipart upload through the faults too
    assert storage.put_file("extra/big.bin", big) == S3Storage("faults", "runs", client(s3_endpoint)).put_file(
        "extra/big-direct.bin", big
    )
    published = run_publish(prepared, storage, fleet=[])

    result = verify_version(published["manifest"], client(url))
    manifest = result.manifest
    assert result.problems == []
    assert result.records_checked == manifest["splits"]["train"] + manifest["splits"]["truncated"] == 36
    direct = S3Storage("faults", "runs", client(s3_endpoint))
    held = direct.list_keys(location.prefix)
    assert set(manifest["files"]) <= set(held)
    assert [key for key in held if key not in manifest["files"] and not BOOKKEEPING.search(key)] == []  # no strays
    assert proxy.injected["500"] > 0 and proxy.injected["503"] > 0 and proxy.injected["reset"] > 0, proxy.injected
    assert proxy.drop_replies == []  # the manifest's create was hit


@pytest.fixture(scope="module")
def exact(s3_endpoint: str) -> Iterator[tuple[FaultProxy, str]]:
    """The proxy with no random faults: only the replies a test chooses are dropped."""
    port = free_port()
    proxy, stop = run_in_thread(s3_endpoint, port, fault_rate=0.0)
    yield proxy, f"http://127.0.0.1:{port}"
    stop()


def test_a_conditional_write_whose_reply_is_lost_is_known_by_its_writer(
    s3_endpoint: str, exact: tuple[FaultProxy, str]
) -> None:
    """A conditional PUT lands, its reply is lost, botocore retries and is refused (412) by the object it wrote
    itself: its writer must be told it succeeded, and every other writer still refused."""
    proxy, url = exact
    client(s3_endpoint).create_bucket(Bucket="lost-replies")
    storage = S3Storage("lost-replies", "x", client(url))
    proxy.drop_replies.append(("PUT", "/v/manifest.json"))
    assert storage.create("v/manifest.json", b"mine") == hashlib.sha256(b"mine").hexdigest()
    assert proxy.drop_replies == [] and proxy.injected["reset"] == 1
    with pytest.raises(KeyExists):
        storage.create("v/manifest.json", b"theirs")
    _, tag = storage.get_tagged("v/manifest.json")
    proxy.drop_replies.append(("PUT", "/v/manifest.json"))
    storage.replace("v/manifest.json", b"mine again", tag)  # If-Match: the retry finds the ETag it made
    assert proxy.drop_replies == [] and storage.get_bytes("v/manifest.json") == b"mine again"
    with pytest.raises(Changed):
        storage.replace("v/manifest.json", b"stale", tag)
    assert storage.get_bytes("v/manifest.json") == b"mine again"


def test_an_outage_darkens_s3_for_the_seconds_asked_then_lifts(s3_endpoint: str, exact: tuple[FaultProxy, str]) -> None:
    """What the chaos bench plants (`POST /__outage?seconds=S`): every request answered 503 for S seconds."""
    import requests

    proxy, url = exact
    client(s3_endpoint).create_bucket(Bucket="outage")
    requests.post(f"{url}/__outage", params={"seconds": 1.0}, timeout=5).raise_for_status()
    dark = requests.get(f"{url}/outage", timeout=5)
    assert dark.status_code == 503 and b"SlowDown" in dark.content and proxy.injected["outage"] == 1
    time.sleep(1.5)
    assert requests.get(f"{url}/outage", timeout=5).status_code == 200 and not proxy.down


def test_a_missing_bucket_is_named(s3_endpoint: str) -> None:
    with pytest.raises(PermissionError, match=r"s3://no-such-bucket/x: the bucket does not exist; create it"):
        check_writable(S3Storage("no-such-bucket", "x", client(s3_endpoint)), "probe")


@pytest.fixture(scope="module")
def authenticating_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto server that checks credentials as S3 does (no access key is known to it)."""
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    env = {"INITIAL_NO_AUTH_ACTION_COUNT": "0", "PATH": str(Path(sys.executable).parent)}
    log = (tmp_path_factory.mktemp("moto-auth") / "moto.log").open("w")
    process = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import requests

        wait_until("moto with authentication", lambda: requests.get(endpoint, timeout=2).status_code > 0, 60)
        yield endpoint
    finally:
        process.terminate()
        process.wait(10)


def test_wrong_credentials_are_named(authenticating_s3: str) -> None:
    refused = r"the S3 credentials were refused \(InvalidAccessKeyId\); fix the access key"
    with pytest.raises(PermissionError, match=refused):
        check_writable(S3Storage("bucket", "x", client(authenticating_s3, access_key="AKIAWRONGKEY")), "probe")


def test_outside_airflow_the_client_takes_botocores_retry_variables_or_the_config_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`regen verify` from a shell: AWS_MAX_ATTEMPTS and AWS_RETRY_MODE mean what botocore documents, though the
    client is made with a config of its own; without them, `defaults.s3`'s retries."""
    from regen.storage.s3 import default_s3_client

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    assert default_s3_client().meta.config.retries == {"mode": "standard", "total_max_attempts": 10}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    assert default_s3_client().meta.config.retries == {"mode": "adaptive", "total_max_attempts": 2}
    monkeypatch.setenv("AWS_RETRY_MODE", "legacy")
    with pytest.raises(ValueError, match=r"AWS_RETRY_MODE / AWS_MAX_ATTEMPTS: retry_mode: .*standard or adaptive"):
        default_s3_client()


def test_a_store_that_ignores_conditional_headers_is_named_in_seconds(
    s3_endpoint: str, exact: tuple[FaultProxy, str]
) -> None:
    """An S3-compatible store that ignores If-None-Match or If-Match would turn claims and the manifest's create into
    overwrites: plan's probe of the root names the store and what it lacks, and leaves nothing behind."""
    import time

    proxy, url = exact
    client(s3_endpoint).create_bucket(Bucket="unconditional")
    storage = S3Storage("unconditional", "x", client(url))
    check_writable(storage, "probe")  # a store that honours both
    for header in ("If-None-Match", "If-Match"):
        proxy.strip_headers = {header.lower()}
        started = time.monotonic()
        with pytest.raises(PermissionError, match=rf"^storage root s3://unconditional/x: .* ignores {header}\)"):
            check_writable(storage, "probe")
        assert time.monotonic() - started < 5
    proxy.strip_headers = set()
    assert storage.list_keys("") == []
