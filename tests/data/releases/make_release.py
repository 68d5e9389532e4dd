"""Files an older release left, kept for tests/unit/test_older_releases.py: run with the library of that release and
this checkout's simulator, writes a deployment whose version v1 was published and whose version v2 was stopped after
its first shard group (red, to be resumed by whatever release comes next).

    git worktree add /tmp/old <commit>
    PYTHONPATH=/tmp/old/include:. REGEN_RELEASE=<commit> .venv/bin/python tests/data/releases/make_release.py \
        tests/data/releases/<commit>

The storage is a bucket (moto's S3 server), as a deployment's is: its URIs name the bucket and not a machine's path,
and so do its datasets', so the test loads the objects into a bucket of the same name and runs this release on them.
Kept: bucket/ (every object, by key: the datasets under data/, the storage under storage/) and release.json."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parents[3]

SINGLE = [
    {"messages": [{"role": "user", "content": f"question {i}: name {i + 2} rivers"}]} | ({"tools": []} if i % 3 else {})
    for i in range(10)
] + [
    {
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "what is a shard?"},
            {"role": "assistant", "content": "A part of a dataset. " * 12},
        ]
    }
]
CHATS = [
    {
        "messages": [
            message
            for turn in range(1 + i % 3)
            for message in (
                {"role": "user", "content": f"chat {i} turn {turn}: and then?"},
                {"role": "assistant", "content": "then more " * (3 + 5 * turn + i)},
            )
        ]
    }
    for i in range(6)
]


BUCKET = "regen-release"
# v2: settings of its own, which its Resume must keep (the page's Resume sends datasets and version only)
STOPPED = {"version": "v2", "skip_unchanged": False, "temperature": 0.7, "validation_share": 0.5}


def config(endpoint: str) -> dict:
    """The deployment: its datasets and its storage in the bucket."""
    return {
        "defaults": {
            "storage_root": f"s3://{BUCKET}/storage",
            "endpoints": [endpoint],
            "shard_size": 4,
            "tokenize_workers": 1,
            "validation_share": 0.3,
            "longest_first": True,
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"]},
        "datasets": {
            "single": {"format": "openai_messages", "turns": "final", "paths": [f"s3://{BUCKET}/data/single.jsonl"]},
            "chats": {"format": "openai_messages", "turns": "on_policy", "paths": [f"s3://{BUCKET}/data/chats.jsonl"]},
        },
    }


def main() -> None:
    from tests.contract.runs import run_dag
    from tools.devstack import start_simulator

    out = Path(sys.argv[1]).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    from moto.server import ThreadedMotoServer

    from tools.devstack import free_port, moto_client

    port = free_port()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    s3.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ |= {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = moto_client(endpoint)
    client.create_bucket(Bucket=BUCKET)
    for name, rows in (("single", SINGLE), ("chats", CHATS)):
        body = "".join(json.dumps(row) + "\n" for row in rows).encode()
        client.put_object(Bucket=BUCKET, Key=f"data/{name}.jsonl", Body=body)
    here = {**os.environ, "PYTHONPATH": str(HERE / "include")}  # this checkout's simulator
    simulator = start_simulator(Path(tempfile.mkdtemp()), "--omit-think-end-rate", "0", env=here)
    try:
        settings = Path(tempfile.mkdtemp(prefix="regen-release-")) / "regen.yaml"  # not kept: the test writes its own
        settings.write_text(yaml.safe_dump(config(simulator.url)))
        os.environ["REGEN_CONFIG"] = str(settings)
        published = run_dag({"version": "v1"}, "release-v1", datetime(2026, 1, 1, tzinfo=UTC))
        stopped = run_dag(STOPPED, "release-v2", datetime(2026, 1, 2, tzinfo=UTC), stop_after=1)
        assert published.green and not stopped.green, (published.errors, stopped.errors)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for entry in page.get("Contents", []):
                path = out / "bucket" / entry["Key"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(client.get_object(Bucket=BUCKET, Key=entry["Key"])["Body"].read())
    finally:
        simulator.stop()
        s3.stop()
    made = {"release": os.environ.get("REGEN_RELEASE", "unknown"), "published": "v1", "stopped": STOPPED}
    (out / "release.json").write_text(json.dumps(made) + "\n")
    files = [p for p in out.rglob("*") if p.is_file()]
    print(f"{out}: {len(files)} files, {sum(p.stat().st_size for p in files):,} bytes")


if __name__ == "__main__":
    main()
