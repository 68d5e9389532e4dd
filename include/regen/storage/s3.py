"""A storage root on S3 (or MinIO, or any S3 API): every object written in one PUT or one completed multipart upload
with its SHA-256 checksum, which S3 verifies; and the clients, retries and error messages of the project's S3 use."""

from __future__ import annotations

import base64
import contextlib
import glob
import hashlib
import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from regen.storage.base import (
    CHUNK,
    READ_BUFFER,
    Changed,
    KeyExists,
    StoredObject,
    is_not_found,
    segments_match,
    sha256_file,
)


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
    `defaults.s3` (outside Airflow no deployment config is read), or botocore's own AWS_RETRY_MODE and
    AWS_MAX_ATTEMPTS where they are set: a client config given explicitly would otherwise override them."""
    import boto3

    given = {"retry_mode": os.environ.get("AWS_RETRY_MODE"), "max_attempts": os.environ.get("AWS_MAX_ATTEMPTS")}
    try:
        settings = S3Config.model_validate({name: value for name, value in given.items() if value})
    except ValidationError as e:
        problems = "; ".join(f"{error['loc'][0]}: {error['msg']}" for error in e.errors())
        raise ValueError(
            f"AWS_RETRY_MODE / AWS_MAX_ATTEMPTS: {problems} (this project's S3 clients take the modes standard or "
            "adaptive and 1 to 50 attempts)"
        ) from None
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


CONDITION_FAILED = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
WRITER = "regen-writer"  # metadata of a conditionally written object: the one write that made it


def _condition_failed(error: Exception) -> bool:
    response = getattr(error, "response", None) or {}
    return response.get("Error", {}).get("Code") in CONDITION_FAILED


@contextlib.contextmanager
def _changed_on_precondition(uri: str) -> Iterator[None]:
    """S3's answers to a conditional request whose object changed or went (412, 409 on a concurrent write, 404) as
    Changed."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in CONDITION_FAILED or is_not_found(e):
            raise Changed(f"{uri} changed since it was read") from None
        raise


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

        try:
            return self._put_conditionally(key, data, IfNoneMatch="*")
        except ClientError as e:
            if _condition_failed(e):
                raise KeyExists(f"{self.uri(key)} exists already") from None
            raise

    def _put_conditionally(self, key: str, data: bytes, **condition: str) -> str:
        """A PUT under `condition`, its object marked with a writer id of this call's own. A PUT that lands but whose
        reply is lost (a dropped connection) is retried by botocore, and the retry is refused by the very object it
        wrote: a refusal is this write's success when the object there is its own."""
        from botocore.exceptions import ClientError

        digest = hashlib.sha256(data)
        writer = uuid.uuid4().hex
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                ChecksumSHA256=base64.b64encode(digest.digest()).decode(),
                Metadata={WRITER: writer},
                **condition,
            )
        except ClientError as e:
            if not (_condition_failed(e) and self._written_by(key, writer)):
                raise
        return digest.hexdigest()

    def _written_by(self, key: str, writer: str) -> bool:
        """Whether the object at the key was made by the write `writer`."""
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if is_not_found(e):
                return False
            raise
        return bool(head.get("Metadata", {}).get(WRITER) == writer)

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read())

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        """The object and its ETag, for a `replace` or `delete_if` of exactly this version of it."""
        answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        with contextlib.closing(answer["Body"]) as body:
            return bytes(body.read()), str(answer["ETag"])

    def replace(self, key: str, data: bytes, tag: str) -> str:
        """Written only if the object still has the ETag read (`If-Match`), else Changed: of two writers that read
        one object, exactly one replaces it."""
        with _changed_on_precondition(self.uri(key)):
            return self._put_conditionally(key, data, IfMatch=tag)

    def delete_if(self, key: str, tag: str) -> None:
        """Deleted only if the object still has the ETag read (`If-Match` on DELETE), else Changed."""
        with _changed_on_precondition(self.uri(key)):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=tag)

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

    def remove_stale_temporaries(self, prefix: str, recursive: bool = True) -> list[str]:
        """None to remove: an object lands whole or not at all (the parts of an unfinished multipart upload are no
        object, and a bucket's AbortIncompleteMultipartUpload rule drops them)."""
        return []

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
        return io.BufferedReader(body, READ_BUFFER)  # botocore's body is a readable raw stream

    def content_id(self, key: str) -> str:
        """The object's ETag (S3 computes it from the content) and size."""
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return f"etag:{head['ETag'].strip(chr(34))}:{head['ContentLength']}"

    def stamp(self, key: str) -> tuple[int, str]:
        """The object's size, and its ETag: what changes whenever it is written with other bytes, read without
        reading them (one HEAD)."""
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return int(head["ContentLength"]), str(head["ETag"])

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
        return [k for k in self.list_keys(prefix) if segments_match(wanted, k.split("/"))]
