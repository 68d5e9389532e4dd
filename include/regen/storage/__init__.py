"""The project's one I/O layer: a storage root, local directory or S3 prefix, addressed by relative keys. The
pipeline's output and the datasets' sources are both read through it (`Locator` finds the storage of any URI), with
one S3 client factory, so credentials, endpoint and retries are set in one place.

Writes are all-or-nothing: a local file appears by atomic rename, an S3 object by a single PUT or a completed
multipart upload. Every write returns the SHA-256 of what was written, which manifests record; S3 additionally checks
the upload with its own SHA-256 checksum.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

from regen.storage.base import (
    CHUNK,
    READ_BUFFER,
    Changed,
    KeyExists,
    S3ClientFactory,
    Storage,
    StoredObject,
    get_json,
    is_not_found,
    is_transient,
    read_table,
    sha256_file,
    write_table,
)
from regen.storage.local import LocalStorage
from regen.storage.root import StorageRoot, StorageRootField
from regen.storage.s3 import S3Config, S3Storage, default_s3_client, explain_s3_error, s3_client_config

__all__ = [
    "CHUNK",
    "READ_BUFFER",
    "Changed",
    "KeyExists",
    "LocalStorage",
    "Locator",
    "S3ClientFactory",
    "S3Config",
    "S3Storage",
    "Storage",
    "StorageRoot",
    "StorageRootField",
    "StoredObject",
    "check_writable",
    "default_s3_client",
    "explain_s3_error",
    "get_json",
    "is_not_found",
    "is_transient",
    "open_storage",
    "read_table",
    "s3_client_config",
    "sha256_file",
    "write_table",
]


def open_storage(root: StorageRoot | str, s3_client: Any = None) -> Storage:
    """The storage of a root (regen.storage.root: the value the allowlist checked; a string is parsed the same way).
    S3 needs a boto3 client (from an Airflow connection, say). A local root that leads elsewhere now than when it
    was parsed (a link made since) is refused: it would write outside what was checked."""
    if isinstance(root, str):
        root = StorageRoot.parse(root)
    if root.kind == "s3":
        return S3Storage(root.bucket, "/".join(root.prefix), s3_client or default_s3_client())
    opened = LocalStorage(Path(root.path))
    if opened.root != Path(root.path):
        raise ValueError(
            f"storage root {root} now leads to {opened.root} (a link made since it was checked): refused, as it "
            "would write outside what the allowlist checked"
        )
    return opened


class Locator:
    """The storage that holds any URI (a local path, file:// or s3://bucket/key) and the URI's key there. Every
    s3:// URI is read with one client, made on first use by the caller's factory (an Airflow connection's, say) or
    from boto3's defaults."""

    def __init__(self, s3_client: S3ClientFactory | None = None) -> None:
        self._factory = s3_client
        self._client: Any = None

    def __call__(self, uri: str) -> tuple[Storage, str]:
        # Split by hand: urlparse would read a glob's `?` as the start of a query.
        scheme, _, rest = uri.partition("://") if "://" in uri else ("", "", uri)
        scheme = scheme.lower()  # URI schemes are case-insensitive: S3:// is s3://, as a storage root's parse reads it
        if scheme == "s3":
            bucket, _, key = rest.partition("/")
            if not bucket:
                raise ValueError(f"{uri!r}: write s3://bucket/key")
            if self._client is None:
                self._client = self._factory() if self._factory is not None else default_s3_client()
            return S3Storage(bucket, "", self._client), key.lstrip("/")
        if scheme not in ("", "file"):
            raise ValueError(f"{uri!r}: only local paths and s3:// URIs are supported")
        path = Path(rest).absolute()
        return LocalStorage(Path(path.anchor)), path.relative_to(path.anchor).as_posix()

    def expand(self, pattern: str) -> list[str]:
        """The URIs of the files a glob matches, sorted (`**` spans folders); a pattern without wildcards names one
        file, listed when it exists."""
        storage, key = self(pattern)
        if not glob.has_magic(key):
            return [storage.uri(key)] if storage.exists(key) else []
        return [storage.uri(k) for k in storage.glob(key)]


def check_writable(storage: Storage, key: str) -> None:
    """Write and delete a small object, then check the conditional writes claims and manifests rely on: a storage
    root that cannot take the run's output, or takes it unconditionally, fails now, not after the GPUs did the
    work."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        storage.put_bytes(key, b"write check\n")
        storage.delete(key)
    except (OSError, ValueError, BotoCoreError, ClientError) as e:
        if is_transient(e):
            raise  # a connection dropped, S3's 5xx: plan's retry tries again, and no setting is to blame
        raise PermissionError(explain_s3_error(storage.root_uri, e)) from e
    if lacking := _conditional_writes_lacking(storage, key):
        raise PermissionError(
            f"storage root {storage.root_uri}: {lacking}; one writer per version (claims) and the manifest's "
            "create need conditional writes: If-None-Match and If-Match on S3 (AWS S3, MinIO), hard links and "
            "flock on a local file system"
        )


def _conditional_writes_lacking(storage: Storage, key: str) -> str | None:
    """What the store lacks of a refused create over an existing key and a refused replace of a stale tag (a store
    that ignores the headers turns both into overwrites), or None."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        storage.create(key, b"first\n")
        try:
            try:
                storage.create(key, b"second\n")
                return "a create over an existing key replaced it (the store ignores If-None-Match)"
            except KeyExists:
                pass
            _, stale = storage.get_tagged(key)
            storage.replace(key, b"third\n", stale)
            try:
                storage.replace(key, b"fourth\n", stale)
                return "a replace of a stale tag replaced it (the store ignores If-Match)"
            except Changed:
                return None
        finally:
            storage.delete(key)
    except (OSError, BotoCoreError, ClientError) as e:  # a store that rejects the headers; no links or flock
        if is_transient(e):
            raise  # a connection dropped, S3's 5xx: not the store's lack, and plan's retry tries again
        return f"conditional writes fail ({e})"
