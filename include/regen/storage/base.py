"""What every storage backend is (the `Storage` protocol) and what works on any of them."""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol

CHUNK = 8 * 1024 * 1024
READ_BUFFER = 1024 * 1024  # what a stream opened for reading fetches at a time
S3ClientFactory = Callable[[], Any]  # makes the boto3 client: from an Airflow connection, or boto3's defaults


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class StoredObject(NamedTuple):
    """One file of a listing: its key, size in bytes and when it was last written (seconds since the epoch)."""

    key: str
    size: int
    mtime: float


class Storage(Protocol):
    root_uri: str

    def uri(self, key: str) -> str: ...
    def exists(self, key: str) -> bool: ...
    def put_bytes(self, key: str, data: bytes) -> str: ...
    def create(self, key: str, data: bytes) -> str: ...
    def get_tagged(self, key: str) -> tuple[bytes, str]: ...
    def replace(self, key: str, data: bytes, tag: str) -> str: ...
    def delete_if(self, key: str, tag: str) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def read_start(self, key: str, size: int) -> bytes: ...
    def put_file(self, key: str, path: Path) -> str: ...
    def get_file(self, key: str, path: Path) -> None: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def list_objects(self, prefix: str) -> list[StoredObject]: ...
    def delete(self, key: str) -> None: ...
    def remove_stale_temporaries(self, prefix: str, recursive: bool = True) -> list[str]: ...
    def size(self, key: str) -> int: ...
    def iter_chunks(self, key: str) -> Iterator[bytes]: ...
    def open(self, key: str) -> IO[bytes]: ...
    def content_id(self, key: str) -> str: ...
    def stamp(self, key: str) -> tuple[int, str]: ...
    def glob(self, pattern: str) -> list[str]: ...
    def folders(self, prefix: str) -> list[str]: ...


class KeyExists(Exception):
    """`create` found the key written already: another writer got there first."""


class Changed(Exception):
    """`replace` or `delete_if` found the object changed (or gone) since it was read: another writer got there first.
    Read it again and decide again."""


def is_not_found(error: Exception) -> bool:
    """A key that is not there, on either backend: a missing local file, or S3's 404 (HEAD) and NoSuchKey (GET)."""
    if isinstance(error, FileNotFoundError):
        return True
    response = getattr(error, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


# A local root's errors of the moment: an I/O error or a stale handle of a network file system (NFS, Lustre), an
# interrupted or busy call. A folder not there, not writable, read-only or full is the user's to mend.
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT, errno.ESTALE})


def is_transient(error: Exception) -> bool:
    """A fault of the moment, which the same request may not meet again: a connection dropped or timed out, S3's 5xx
    and throttling, a local root's TRANSIENT_ERRNOS. Not a user's error (a bucket that is not there, credentials
    refused, a folder not writable), so a task meeting it fails to be retried, never with a message to fix its
    settings."""
    from botocore.exceptions import ClientError, HTTPClientError

    if isinstance(error, ConnectionError | TimeoutError | HTTPClientError):  # HTTPClientError: closed, read timeout
        return True
    if isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS:
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or error.response.get("Error", {}).get("Code") in ("SlowDown", "RequestTimeout")
    return False


def segments_match(pattern: list[str], key: list[str]) -> bool:
    """Glob semantics on `/`-separated keys: `*` stays within a segment, `**` spans any number of them."""
    if not pattern:
        return not key
    if pattern[0] == "**":
        return any(segments_match(pattern[1:], key[i:]) for i in range(len(key) + 1))
    return bool(key) and fnmatch.fnmatchcase(key[0], pattern[0]) and segments_match(pattern[1:], key[1:])


def get_json(storage: Storage, key: str) -> Any:
    """A JSON document in storage (a manifest, a record, an index), parsed."""
    return json.loads(storage.get_bytes(key))


def read_table(storage: Storage, key: str, columns: list[str] | None = None, optional: tuple[str, ...] = ()) -> Any:
    """A stored Parquet file as an Arrow table, through a local copy (Parquet needs random access). `optional`:
    columns read too where the file has them (files written before they existed do not)."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="regen-read-") as tmp:
        path = Path(tmp) / "table.parquet"
        storage.get_file(key, path)
        if columns is not None and optional:
            present = pq.read_schema(path).names
            columns = [*columns, *(c for c in optional if c in present and c not in columns)]
        return pq.read_table(path, columns=columns)


def write_table(storage: Storage, key: str, table: Any, **options: Any) -> str:
    """An Arrow table stored as zstd Parquet (`options` go to pyarrow's writer); returns its sha256. An empty table is
    written with no row group, not one of no rows: Hugging Face `datasets` reads past the first and fails on the other
    (an empty validation/ shard would stop `load_dataset`)."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="regen-write-") as tmp:
        path = Path(tmp) / "table.parquet"
        if table.num_rows:
            pq.write_table(table, path, compression="zstd", **options)
        else:
            pq.ParquetWriter(path, table.schema, compression="zstd", **options).close()
        return storage.put_file(key, path)
