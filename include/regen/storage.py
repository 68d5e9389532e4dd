"""The project's one I/O layer: a storage root, local directory or S3 prefix, addressed by relative keys. The
pipeline's output and the datasets' sources are both read through it (`Locator` finds the storage of any URI), with
one S3 client factory, so credentials, endpoint and retries are set in one place.

Writes are all-or-nothing: a local file appears by atomic rename, an S3 object by a single PUT or a completed
multipart upload. Every write returns the SHA-256 of what was written, which manifests record; S3 additionally checks
the upload with its own SHA-256 checksum.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import glob
import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple, Protocol
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field

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
    def get_bytes(self, key: str) -> bytes: ...
    def read_start(self, key: str, size: int) -> bytes: ...
    def put_file(self, key: str, path: Path) -> str: ...
    def get_file(self, key: str, path: Path) -> None: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def list_objects(self, prefix: str) -> list[StoredObject]: ...
    def delete(self, key: str) -> None: ...
    def size(self, key: str) -> int: ...
    def iter_chunks(self, key: str) -> Iterator[bytes]: ...
    def open(self, key: str) -> IO[bytes]: ...
    def content_id(self, key: str) -> str: ...
    def glob(self, pattern: str) -> list[str]: ...
    def folders(self, prefix: str) -> list[str]: ...


def _staged(target: Path, chunks: Iterable[bytes]) -> tuple[str, str]:
    """The chunks in a synced temporary file beside the target, with the mode a new file gets: its path, sha256."""
    fd, tmp = _temporary_beside(target)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp, digest.hexdigest()


def _temporary_beside(target: Path) -> tuple[int, str]:
    """A temporary file in the target's folder, made if needed (again, if a delete beside it just removed it empty)."""
    for attempt in range(3):
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            return tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _file_mode() -> int:
    """What a new file gets under the process's umask, as open() gives it (mkstemp would give 0600: only its owner
    could read a published version)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()


class KeyExists(Exception):
    """`create` found the key written already: another writer got there first."""


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
        tmp, digest = _staged(target, chunks)
        try:
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def put_bytes(self, key: str, data: bytes) -> str:
        return self._write_atomically(key, [data])

    def create(self, key: str, data: bytes) -> str:
        """Written only if the key is not there: the whole file linked into place in one step, which fails when a
        file of that name exists (two writers of one key: exactly one succeeds, the other gets KeyExists)."""
        target = self._path(key)
        tmp, digest = _staged(target, [data])
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise KeyExists(f"{target} exists already") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        return digest

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def read_start(self, key: str, size: int) -> bytes:
        """The file's first `size` bytes (all of it when it is shorter): a reader that caps what it takes asks
        for one byte more than its cap, and never holds more."""
        with self._path(key).open("rb") as f:
            return f.read(max(size, 0))

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

    def list_objects(self, prefix: str) -> list[StoredObject]:
        """Every file under `prefix` with its size and modification time, sorted by key: one walk of the folder,
        a stat per file from the directory scan (what an S3 listing gives with each key)."""
        base = self._path(prefix) if prefix else self.root
        found: list[StoredObject] = []
        folders = [base] if base.is_dir() else []
        while folders:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
                    elif entry.is_file() and not entry.name.startswith(".tmp-"):
                        stat = entry.stat()
                        key = Path(entry.path).relative_to(self.root).as_posix()
                        found.append(StoredObject(key, stat.st_size, stat.st_mtime))
        if base.is_file():
            stat = base.stat()
            found.append(StoredObject(prefix, stat.st_size, stat.st_mtime))
        return sorted(found)

    def delete(self, key: str) -> None:
        """The file, and the folders it leaves empty (a shard's checkpoints, once merged), up to the root."""
        path = self._path(key)
        path.unlink(missing_ok=True)
        for folder in path.parents:
            if folder == self.root or not folder.is_relative_to(self.root):
                break
            try:
                folder.rmdir()
            except OSError:  # not empty (or gone already): the folders above it are not empty either
                break

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def iter_chunks(self, key: str) -> Iterator[bytes]:
        with self._path(key).open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def open(self, key: str) -> IO[bytes]:
        return self._path(key).open("rb")

    def content_id(self, key: str) -> str:
        """The file's sha256."""
        return sha256_file(self._path(key))

    def folders(self, prefix: str) -> list[str]:
        """The names of the folders directly under `prefix` (a key ending in `/`), sorted."""
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        with os.scandir(base) as entries:  # the entry's type from the directory itself: no stat per folder
            return sorted(entry.name for entry in entries if entry.is_dir())

    def glob(self, pattern: str) -> list[str]:
        """Keys of the files matching a glob (`**` spans folders), sorted; walks only the folders it must."""
        matches = glob.glob(str(self.root / pattern), recursive=True)
        return sorted(str(Path(m).relative_to(self.root)) for m in matches if Path(m).is_file())


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
            if is_not_found(e):
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

    def create(self, key: str, data: bytes) -> str:
        """Written only if the key is not there (`If-None-Match: *`, which S3 and MinIO enforce): of two writers of
        one key exactly one succeeds, and the other gets KeyExists."""
        from botocore.exceptions import ClientError

        digest = hashlib.sha256(data)
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                ChecksumSHA256=base64.b64encode(digest.digest()).decode(),
                IfNoneMatch="*",
            )
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise KeyExists(f"{self.uri(key)} exists already") from None
            raise
        return digest.hexdigest()

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read())

    def read_start(self, key: str, size: int) -> bytes:
        """The object's first `size` bytes (all of it when it is shorter), with one ranged GET: a bigger object is
        never transferred whole."""
        from botocore.exceptions import ClientError

        if size <= 0:
            return b""
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key), Range=f"bytes=0-{size - 1}")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":  # S3's answer for an empty object
                return b""
            raise
        with contextlib.closing(answer["Body"]) as body:
            return bytes(body.read(size))

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

    def list_objects(self, prefix: str) -> list[StoredObject]:
        """Every object under `prefix` with its size and LastModified, sorted by key: the listing's own fields,
        one request per 1,000 objects, no HEAD per key."""
        paginator = self.client.get_paginator("list_objects_v2")
        strip = len(self.prefix) + 1 if self.prefix else 0
        return sorted(
            StoredObject(obj["Key"][strip:], int(obj["Size"]), obj["LastModified"].timestamp())
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))
            for obj in page.get("Contents", [])
        )

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

    def open(self, key: str) -> IO[bytes]:
        """The object as a buffered stream, fetched as it is read: never whole in memory."""
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        return io.BufferedReader(_BodyStream(body), READ_BUFFER)

    def content_id(self, key: str) -> str:
        """The object's ETag (S3 computes it from the content) and size."""
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return f"etag:{head['ETag'].strip(chr(34))}:{head['ContentLength']}"

    def folders(self, prefix: str) -> list[str]:
        """The names of the folders directly under `prefix` (a key ending in `/`), sorted: one listing with a
        delimiter, not every key below."""
        paginator = self.client.get_paginator("list_objects_v2")
        start = len(self._key(prefix))
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix), Delimiter="/")
        return sorted(p["Prefix"][start:].rstrip("/") for page in pages for p in page.get("CommonPrefixes", []))

    def glob(self, pattern: str) -> list[str]:
        """Keys matching a glob, sorted: `*` stays within a `/`-separated segment, `**` spans any number of them.
        Lists from the longest prefix without a wildcard."""
        prefix = pattern[: min(pattern.find(c) for c in "*?[" if c in pattern)] if glob.has_magic(pattern) else pattern
        wanted = pattern.split("/")
        return [k for k in self.list_keys(prefix) if _segments_match(wanted, k.split("/"))]


class _BodyStream(io.RawIOBase):
    """A boto3 streaming body as a raw stream, for `io.BufferedReader`: botocore's body has `read(n)` but no
    `readinto`."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._body.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


def is_not_found(error: Exception) -> bool:
    """A key that is not there, on either backend: a missing local file, or S3's 404 (HEAD) and NoSuchKey (GET)."""
    if isinstance(error, FileNotFoundError):
        return True
    response = getattr(error, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


class S3Config(BaseModel):
    """How boto3 rides out S3's transient faults (500, 503 SlowDown, dropped connections): botocore's own retries."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    retry_mode: Literal["standard", "adaptive"] = Field(
        "standard", description="botocore retry mode; adaptive also slows down on throttling"
    )
    max_attempts: int = Field(10, ge=1, le=50, description="attempts per S3 request, the first included")


def s3_client_config(retry_mode: str, max_attempts: int) -> Any:
    """botocore's client config for S3: its retries (the config's `defaults.s3`), for every client the project makes."""
    from botocore.config import Config

    return Config(retries={"mode": retry_mode, "total_max_attempts": max_attempts})


def default_s3_client() -> Any:
    """A boto3 S3 client from the environment's credentials (AWS_* variables, profiles), with the default retries of
    `defaults.s3` (outside Airflow no deployment config is read)."""
    import boto3

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


def _segments_match(pattern: list[str], key: list[str]) -> bool:
    """Glob semantics on `/`-separated keys: `*` stays within a segment, `**` spans any number of them."""
    if not pattern:
        return not key
    if pattern[0] == "**":
        return any(_segments_match(pattern[1:], key[i:]) for i in range(len(key) + 1))
    return bool(key) and fnmatch.fnmatchcase(key[0], pattern[0]) and _segments_match(pattern[1:], key[1:])


def check_writable(storage: Storage, key: str) -> None:
    """Write and delete a small object: a storage root that cannot take the run's output fails now, not after the
    GPUs did the work."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        storage.put_bytes(key, b"write check\n")
        storage.delete(key)
    except (OSError, ValueError, BotoCoreError, ClientError) as e:
        raise PermissionError(explain_s3_error(storage.root_uri, e)) from e


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
    """An Arrow table stored as zstd Parquet (`options` go to pyarrow's writer); returns its sha256."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="regen-write-") as tmp:
        path = Path(tmp) / "table.parquet"
        pq.write_table(table, path, compression="zstd", **options)
        return storage.put_file(key, path)
