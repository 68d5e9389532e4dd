"""Does a published dataset version hold what its manifest says? Every file it names is there with the sha256 it
recorded, and every training shard has the number of records the manifest counts. What a consumer (drafter training,
the hand-off DAG) runs before it trusts a version.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from regen.errors import FinalError
from regen.storage import open_storage, sha256_file

log = logging.getLogger(__name__)


class VerificationFailed(FinalError):
    """A published version does not match its manifest: do not train on it."""


def verify_published(manifest_uri: str, s3_client: Any = None) -> dict[str, Any]:
    """Raises VerificationFailed naming every mismatch; returns the version's identity and counts when all match."""
    import pyarrow.parquet as pq

    folder, name = manifest_uri.rsplit("/", 1)
    manifest = json.loads(open_storage(folder, s3_client).get_bytes(name))
    storage = open_storage(manifest["root"], s3_client)
    records_of = {s["train"]: s["records"] for s in manifest["shards"]}  # train/ key -> records it must hold
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="regen-verify-") as tmp:
        for key, expected in sorted(manifest["files"].items()):
            local = Path(tmp) / "file"
            if not storage.exists(key):
                problems.append(f"{key}: missing")
                continue
            storage.get_file(key, local)
            if (actual := sha256_file(local)) != expected:
                problems.append(f"{key}: sha256 {actual}, manifest says {expected}")
            elif key in records_of and (rows := pq.read_metadata(local).num_rows) != records_of[key]:
                problems.append(f"{key}: {rows} records, manifest says {records_of[key]}")
    if (held := sum(records_of.values())) != manifest["records"]:
        problems.append(f"shards hold {held} records, manifest says {manifest['records']}")
    if problems:
        raise VerificationFailed(f"{manifest_uri}: " + "; ".join(problems))
    verified = {
        "manifest": manifest_uri,
        "dataset": manifest["dataset"],
        "version": manifest["version"],
        "records": manifest["records"],
        "files": len(manifest["files"]),
    }
    log.info(
        "verified %s %s: %d files, %d records",
        manifest["dataset"],
        manifest["version"],
        len(manifest["files"]),
        manifest["records"],
    )
    return verified
