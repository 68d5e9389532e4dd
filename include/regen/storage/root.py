"""A storage root as one parsed value: what the allowlist checks is exactly what storage opens. Parsing is strict and
says what to write instead: an S3 root is `s3://bucket/prefix` (the scheme in any case, as URI schemes are), a local
one a directory or a `file://` URI of one, resolved once (`..` and links followed) against the config's folder.
Anything else (`s3:/x`, `file:relative`, another host in a file URI, another scheme, `.`, `..` or `//` in an S3
prefix) is refused rather than read as a local path."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import PlainSerializer, PlainValidator, WithJsonSchema

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)  # RFC 3986: a letter, then these
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's rule for a bucket's name


@dataclass(frozen=True)
class StorageRoot:
    """`kind` s3: `bucket` and the prefix's folders; kind local: `path`, absolute and resolved."""

    kind: Literal["local", "s3"]
    path: str = ""
    bucket: str = ""
    prefix: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, base: Path | None = None) -> StorageRoot:
        """The root `text` names; a relative local path is against `base` (the working directory by default).
        ValueError saying what to write, for anything that is not plainly a root."""
        match = SCHEME.match(text)
        if match is None:
            return cls._local(Path(text), base)
        scheme, rest = match.group(1).lower(), match.group(2)
        if scheme == "s3":
            return cls._s3(text, rest)
        if scheme == "file":
            return cls._local(_file_path(text, rest), base)
        raise ValueError(
            f"storage root {text!r}: only s3://bucket/prefix and local directories (or file:///absolute/path) are "
            "storage roots; a local folder whose name has ':' in it: write it as ./name"
        )

    @classmethod
    def _local(cls, path: Path, base: Path | None) -> StorageRoot:
        if "\0" in str(path) or not str(path):
            raise ValueError(f"storage root {str(path)!r}: not a directory's path")
        return cls("local", path=str(((base or Path.cwd()) / path).resolve()))

    @classmethod
    def _s3(cls, text: str, rest: str) -> StorageRoot:
        if not rest.startswith("//"):
            raise ValueError(f"storage root {text!r}: write s3://bucket/prefix")
        bucket, _, prefix = rest[2:].partition("/")
        if not BUCKET.match(bucket):
            raise ValueError(
                f"storage root {text!r}: {bucket!r} is not an S3 bucket's name (3 to 63 lowercase letters, digits, "
                "'.' and '-'); write s3://bucket/prefix"
            )
        folders = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
        if any(folder in ("", ".", "..") for folder in folders):
            raise ValueError(
                f"storage root {text!r}: '.', '..' and empty folders ('//') are not folders on S3; write the prefix out"
            )
        return cls("s3", bucket=bucket, prefix=tuple(folders))

    def __str__(self) -> str:
        if self.kind == "local":
            return self.path
        return "/".join([f"s3://{self.bucket}", *self.prefix])

    def within(self, allowed: StorageRoot) -> bool:
        """Whether this root is `allowed` or below it, folder by folder (`s3://b/data2` is not within `s3://b/data`);
        a local root and an S3 one never are."""
        if self.kind != allowed.kind:
            return False
        if self.kind == "s3":
            return self.bucket == allowed.bucket and self.prefix[: len(allowed.prefix)] == allowed.prefix
        return Path(self.path).is_relative_to(allowed.path)


def _file_path(text: str, rest: str) -> Path:
    """The absolute path of a file URI: file:///path, file://localhost/path or file:/path."""
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host.lower() not in ("", "localhost"):
            raise ValueError(f"storage root {text!r}: a file URI names this machine's files: write file:///path")
        rest = slash + path
    if not rest.startswith("/"):
        raise ValueError(f"storage root {text!r}: a file URI names an absolute path: write file:///path")
    return Path(rest)


def _coerce(value: Any) -> StorageRoot:
    if isinstance(value, StorageRoot):
        return value
    if not isinstance(value, str):
        raise ValueError("a storage root is a string: s3://bucket/prefix or a local directory")
    return StorageRoot.parse(value)


# A model's field holding a root: given as a string (parsed), stored as its canonical string (an absolute path, or
# s3://bucket/prefix), which parses back to the same root.
StorageRootField = Annotated[
    StorageRoot,
    PlainValidator(_coerce),
    PlainSerializer(str, return_type=str),
    WithJsonSchema({"type": "string"}),
]
