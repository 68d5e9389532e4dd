"""The S3 side of the harness: a run's prefix saved and restored by server-side copies (which keep each object's
ETag, its stamp, and metadata)."""

from __future__ import annotations

from typing import Any


def etags(client: Any, bucket: str, prefix: str) -> dict[str, str]:
    """Every object under `prefix`, by its key below it, with its ETag."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {item["Key"][len(prefix) :]: item["ETag"] for page in pages for item in page.get("Contents", [])}


def copy_objects(client: Any, bucket: str, source: str, target: str, only: set[str] | None = None) -> None:
    for key in etags(client, bucket, source) if only is None else only:
        client.copy_object(Bucket=bucket, Key=target + key, CopySource={"Bucket": bucket, "Key": source + key})


def restore_objects(client: Any, bucket: str, saved: str, prefix: str) -> None:
    """`prefix` made what `saved` holds: objects it lacks or holds otherwise copied back, others deleted (the points
    of one task follow each other, so little differs)."""
    want, have = etags(client, bucket, saved), etags(client, bucket, prefix)
    stale = [key for key, etag in have.items() if want.get(key) != etag]
    for start in range(0, len(stale), 1000):  # one request a thousand keys
        batch = [{"Key": prefix + key} for key in stale[start : start + 1000]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
    copy_objects(client, bucket, saved, prefix, {key for key, etag in want.items() if have.get(key) != etag})
