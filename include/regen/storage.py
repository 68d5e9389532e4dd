"""One storage root, local directory or S3 prefix, addressed by relative keys.

Writes are all-or-nothing: a local file appears by atomic rename, an S3 object by a single PUT or a completed
multipart upload. Every write returns the SHA-256 of what was written, which manifests record; S3 additionally checks
the upload with its own SHA-256 checksum.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Storage(Protocol):
    root_uri: str

    def uri(self, key: str) -> str: ...
    def exists(self, key: str) -> bool: ...
    def put_bytes(self, key: str, data: bytes) -> str: ...
    def get_bytes(self, key: str) -> bytes: ...
    def put_file(self, key: str, path: Path) -> str: ...
    def get_file(self, key: str, path: Path) -> None: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def size(self, key: str) -> int: ...
    def iter_chunks(self, key: str) -> Iterator[bytes]: ...


class LocalStorage:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root_uri = str(self.root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"key {key!r} escapes the storage root")
        return path

    def uri(self, key: str) -> str:
        return str(self._path(key))

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _write_atomically(self, key: str, chunks: Iterable[bytes]) -> str:
        """Written to a temporary file beside the target, synced, then renamed: readers see all or nothing."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest.hexdigest()

    def put_bytes(self, key: str, data: bytes) -> str:
        return self._write_atomically(key, [data])

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def put_file(self, key: str, path: Path) -> str:
        with path.open("rb") as src:
            return self._write_atomically(key, iter(lambda: src.read(CHUNK), b""))

    def get_file(self, key: str, path: Path) -> None:
        shutil.copyfile(self._path(key), path)  # streamed: a shard's file need not fit in memory

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def iter_chunks(self, key: str) -> Iterator[bytes]:
        with self._path(key).open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk


class S3Storage:
    """boto3 against S3 or any S3 HTTP API (MinIO, moto); the client comes from the caller's credentials."""

    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client
        self.root_uri = f"s3://{bucket}/{self.prefix}".rstrip("/")

    def _key(self, key: str) -> str:
        if ".." in key.split("/"):
            raise ValueError(f"key {key!r} escapes the storage root")
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def put_bytes(self, key: str, data: bytes) -> str:
        digest = hashlib.sha256(data)
        self.client.put_object(
            Bucket=self.bucket,
            Key=self._key(key),
            Body=data,
            ChecksumSHA256=base64.b64encode(digest.digest()).decode(),
        )
        return digest.hexdigest()

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read())

    def put_file(self, key: str, path: Path) -> str:
        # upload_file switches to a multipart upload for large files; every part carries its own checksum.
        self.client.upload_file(str(path), self.bucket, self._key(key), ExtraArgs={"ChecksumAlgorithm": "SHA256"})
        return sha256_file(path)

    def get_file(self, key: str, path: Path) -> None:
        self.client.download_file(self.bucket, self._key(key), str(path))

    def list_keys(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def size(self, key: str) -> int:
        return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])

    def iter_chunks(self, key: str) -> Iterator[bytes]:
        """The object streamed, a chunk at a time: read whole it need not fit in memory."""
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()


def s3_client_config(retry_mode: str, max_attempts: int) -> Any:
    """botocore's client config for S3: its retries (the config's `defaults.s3`), for every client the project makes."""
    from botocore.config import Config

    return Config(retries={"mode": retry_mode, "total_max_attempts": max_attempts})


def default_s3_client() -> Any:
    """A boto3 S3 client from the environment's credentials (AWS_* variables, profiles), with the default retries of
    `defaults.s3` (outside Airflow no deployment config is read)."""
    import boto3

    from regen.config import S3Config

    settings = S3Config()
    return boto3.client("s3", config=s3_client_config(settings.retry_mode, settings.max_attempts))


def explain_s3_error(root_uri: str, error: Exception) -> str:
    """What to fix, for the S3 errors a user causes: a bucket that is not there, credentials refused, no access."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(error, NoCredentialsError):
        return f"{root_uri}: no S3 credentials were found; set them in the Airflow connection aws_default"
    if isinstance(error, EndpointConnectionError):
        return f"{root_uri}: the S3 endpoint cannot be reached ({error}); check endpoint_url in connection aws_default"
    code = error.response.get("Error", {}).get("Code", "") if isinstance(error, ClientError) else ""
    if code == "NoSuchBucket":
        return f"{root_uri}: the bucket does not exist; create it, or point storage_root at one that does"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
        return (
            f"{root_uri}: the S3 credentials were refused ({code}); fix the access key and secret of the Airflow "
            "connection aws_default"
        )
    if code in ("AccessDenied", "AllAccessDisabled", "403"):
        return f"{root_uri}: access denied; the credentials of connection aws_default may not write there"
    return f"storage root {root_uri} does not take writes: {error}"


def open_storage(root_uri: str, s3_client: Any = None) -> Storage:
    """`s3://bucket/prefix` or a local directory. S3 needs a boto3 client (from an Airflow connection, say)."""
    parsed = urlparse(root_uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"storage root {root_uri!r}: write s3://bucket/prefix")
        return S3Storage(parsed.netloc, parsed.path, s3_client or default_s3_client())
    if parsed.scheme not in ("", "file"):
        raise ValueError(f"storage root {root_uri!r}: only s3:// URIs and local directories are supported")
    return LocalStorage(Path(parsed.path if parsed.scheme == "file" else root_uri))


def check_writable(storage: Storage, key: str) -> None:
    """Write and delete a small object: a storage root that cannot take the run's output fails now, not after the
    GPUs did the work."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        storage.put_bytes(key, b"write check\n")
        storage.delete(key)
    except (OSError, ValueError, BotoCoreError, ClientError) as e:
        raise PermissionError(explain_s3_error(storage.root_uri, e)) from e


def read_table(storage: Storage, key: str, columns: list[str] | None = None) -> Any:
    """A stored Parquet file as an Arrow table, through a local copy (Parquet needs random access)."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="regen-read-") as tmp:
        path = Path(tmp) / "table.parquet"
        storage.get_file(key, path)
        return pq.read_table(path, columns=columns)


def write_table(storage: Storage, key: str, table: Any, **options: Any) -> str:
    """An Arrow table stored as zstd Parquet (`options` go to pyarrow's writer); returns its sha256."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="regen-write-") as tmp:
        path = Path(tmp) / "table.parquet"
        pq.write_table(table, path, compression="zstd", **options)
        return storage.put_file(key, path)
