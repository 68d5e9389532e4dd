"""Stream a dataset's rows, one at a time, from wherever it lives, so memory never grows with the dataset.

Files: JSON Lines, JSON arrays, Parquet; plain, gzip or zstd; local paths, globs and `s3://` URIs. Hugging Face
datasets: a hub id (streamed) or a dataset saved to disk. A line or item that is not valid UTF-8 or not valid JSON
becomes a `BadRow`, counted and rejected downstream, never an exception that stops the dataset.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from regen.config.datasets import DatasetConfig, HubDataset
from regen.errors import FinalError
from regen.reasons import Reason
from regen.storage import READ_BUFFER, LocalStorage, Locator, S3ClientFactory, is_transient, sha256_file

log = logging.getLogger(__name__)

READ_CHUNK = READ_BUFFER
# Bounds that no chat row comes near and that keep a hostile row from exhausting the stack or memory.
MAX_DEPTH = 64
MAX_ROW_BYTES = 32 * 1024 * 1024
PARQUET_BATCH = 1024
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
FILE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}


class CorruptSource(FinalError, ValueError):
    pass


class MissingSource(FinalError, FileNotFoundError):
    pass


@dataclass(frozen=True)
class SourceRow:
    index: int  # position in the dataset's stream, over all its files
    source: str  # file and line (or item, or row), for people tracing a rejection
    value: Any


@dataclass(frozen=True)
class BadRow:
    index: int
    source: str
    reason: Reason
    detail: str


@dataclass(frozen=True)
class SourceFile:
    uri: str  # a local path or s3://bucket/key
    kind: str  # jsonl, json or parquet
    compression: str | None

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1]


def file_kind(uri: str) -> tuple[str, str | None]:
    """What a file holds, from its name: `.jsonl`, `.json`, `.parquet`, optionally compressed `.gz` or `.zst`."""
    name = uri.rsplit("/", 1)[-1].lower()
    compression = next((c for suffix, c in COMPRESSIONS.items() if name.endswith(suffix)), None)
    if compression is not None:
        name = name.rsplit(".", 1)[0]
    kind = next((k for suffix, k in FILE_KINDS.items() if name.endswith(suffix)), None)
    if kind is None:
        raise ValueError(f"{uri}: unknown file type; name files .jsonl, .json or .parquet, optionally .gz or .zst")
    if kind == "parquet" and compression is not None:
        raise ValueError(f"{uri}: Parquet compresses its own pages; store it uncompressed")
    return kind, compression


def expand_files(patterns: list[str], locate: Locator | None = None) -> list[SourceFile]:
    """Every file of a dataset, in a stable order, each checked for a known type before any is read."""
    locate = locate or Locator()
    files: list[SourceFile] = []
    for pattern in patterns:
        matches = locate.expand(pattern)
        if not matches:
            raise MissingSource(f"dataset source {pattern!r} matches no file")
        files.extend(SourceFile(m, *file_kind(m)) for m in matches)
    return files


class _ZstdFrames(io.RawIOBase):
    """zstd decompression read as a raw stream, frame after frame. A stream that ends inside a frame raises
    `EOFError` (zstandard's own `stream_reader` returns a short read there, which would lose the rest of the file
    silently)."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        import zstandard

        self._raw, self._new_frame = raw, zstandard.ZstdDecompressor().decompressobj
        self._frame, self._in_frame = self._new_frame(), False
        self._pending, self._offset = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._offset >= len(self._pending):
            compressed = self._raw.read(READ_CHUNK)
            if not compressed:
                if self._in_frame:
                    raise EOFError("the zstd stream ends inside a frame")
                return 0
            self._pending, self._offset = self._decompress(compressed), 0
        data = self._pending[self._offset : self._offset + len(buffer)]
        buffer[: len(data)] = data
        self._offset += len(data)
        return len(data)

    def _decompress(self, compressed: bytes) -> bytes:
        out = []
        while compressed:
            self._in_frame = True
            out.append(self._frame.decompress(compressed))
            if not self._frame.eof:
                break
            self._in_frame, compressed = False, self._frame.unused_data
            self._frame = self._new_frame()
        return b"".join(out)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


@contextmanager
def _open_bytes(file: SourceFile, locate: Locator) -> Iterator[IO[bytes]]:
    """A buffered, decompressed byte stream: read as it goes, never whole."""
    storage, key = locate(file.uri)
    raw = storage.open(key)
    import zstandard

    try:
        if file.compression == "gzip":
            yield io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), READ_CHUNK)
        elif file.compression == "zstd":
            yield io.BufferedReader(_ZstdFrames(raw), READ_CHUNK)
        else:
            yield raw
    except (EOFError, gzip.BadGzipFile, zstandard.ZstdError) as e:
        # Not a bad row: the file itself is damaged, and skipping the rest of it silently would lose data.
        raise CorruptSource(f"{file.uri}: the {file.compression} stream is damaged ({e}); replace the file") from e
    finally:
        raw.close()


class _Unreadable(ValueError):
    """A value the reader refuses, with the reason it is rejected for."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _refuse_constant(name: str) -> Any:
    raise _Unreadable(Reason.NON_FINITE_NUMBER, f"{name} is not a JSON number (metadata must stay strict JSON)")


def _value_problem(value: Any) -> _Unreadable | None:
    """Nesting deeper than MAX_DEPTH, found without recursion (a hostile row must not exhaust the stack), or a NaN or
    infinity (Parquet and hub rows hold them natively; they are not JSON, and metadata stays strict JSON)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                return _Unreadable(Reason.TOO_DEEP, f"nested deeper than {MAX_DEPTH} levels")
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
        elif isinstance(node, float) and not math.isfinite(node):
            return _Unreadable(
                Reason.NON_FINITE_NUMBER, f"{node} is not a JSON number (metadata must stay strict JSON)"
            )
    return None


def _decode_line(line: bytes) -> Any:
    text = line.decode("utf-8").removeprefix("\ufeff")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise _Unreadable(Reason.TOO_DEEP, f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # an integer literal past Python's digit limit
        if isinstance(e, _Unreadable):
            raise
        raise _Unreadable(Reason.NUMBER_TOO_LONG, str(e)[:200]) from None
    if problem := _value_problem(value):
        raise problem
    return value


def _lines(stream: IO[bytes]) -> Iterator[bytes | None]:
    """Lines of at most MAX_ROW_BYTES; a longer one is read past in chunks (memory stays bounded) and given as None."""
    while line := stream.readline(MAX_ROW_BYTES + 1):
        if len(line) <= MAX_ROW_BYTES or line.endswith(b"\n"):
            yield line if len(line) <= MAX_ROW_BYTES else None
            continue
        while (rest := stream.readline(READ_CHUNK)) and not rest.endswith(b"\n"):
            pass
        yield None


def _jsonl_values(stream: IO[bytes], name: str) -> Iterator[tuple[str, Any] | BadRow]:
    """Every line is accounted for: a value, or a rejection with its reason (a blank line included)."""
    for line_number, line in enumerate(_lines(stream), start=1):
        where = f"{name}:{line_number}"
        if line is None:
            yield BadRow(-1, where, Reason.ROW_TOO_LARGE, f"a line over {MAX_ROW_BYTES} bytes")
            continue
        if not line.strip():
            yield BadRow(-1, where, Reason.BLANK_LINE, "an empty line")
            continue
        try:
            yield where, _decode_line(line)
        except UnicodeDecodeError as e:
            yield BadRow(-1, where, Reason.INVALID_UTF8, str(e))
        except json.JSONDecodeError as e:
            yield BadRow(-1, where, Reason.MALFORMED_JSON, str(e))
        except _Unreadable as e:
            yield BadRow(-1, where, e.reason, str(e))


def _build_item(event: str, value: Any, events: Iterator[tuple[str, Any]]) -> Any:
    """One array item from ijson's flat events, built without recursion; deeper than MAX_DEPTH, it is read past
    (counting depth only, so memory stays flat) and returned as an _Unreadable."""
    if event not in ("start_map", "start_array"):
        return value
    root: Any = {} if event == "start_map" else []
    stack, keys, depth, too_deep = [root], [None], 1, False
    for event, value in events:
        if event in ("start_map", "start_array"):
            depth += 1
            too_deep = too_deep or depth > MAX_DEPTH
            if not too_deep:
                child: Any = {} if event == "start_map" else []
                _add(stack[-1], keys[-1], child)
                stack.append(child)
                keys.append(None)
        elif event in ("end_map", "end_array"):
            depth -= 1
            if depth == 0:
                return _Unreadable(Reason.TOO_DEEP, f"nested deeper than {MAX_DEPTH} levels") if too_deep else root
            if not too_deep:
                stack.pop()
                keys.pop()
        elif event == "map_key":
            keys[-1] = value
        elif not too_deep:
            _add(stack[-1], keys[-1], value)
    raise ValueError("the JSON array ended inside an item")


def _add(container: Any, key: Any, value: Any) -> None:
    if isinstance(container, dict):
        container[key] = value
    else:
        container.append(value)


def _json_array_values(stream: IO[bytes], name: str) -> Iterator[tuple[str, Any] | BadRow]:
    """Items of a top-level JSON array, parsed as a stream. A syntax error ends the file: the array is one document
    and no later item boundary can be trusted, so the rest of the file becomes that one rejected row."""
    import ijson

    reading = 1  # the item being read, for the message when the file breaks off
    events = ijson.basic_parse(stream, use_float=True)
    try:
        next(events)  # the array's start, seen when the file was peeked
        for item, (event, value) in enumerate(events, start=1):
            if event == "end_array":
                return
            built = _build_item(event, value, events)
            if isinstance(built, _Unreadable):
                yield BadRow(-1, f"{name}[{item}]", built.reason, str(built))
            else:
                yield f"{name}[{item}]", built
            reading = item + 1
    except ijson.JSONError as e:
        detail = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        reason = Reason.INVALID_UTF8 if "UTF8" in detail or "utf-8" in detail else Reason.MALFORMED_JSON
        yield BadRow(-1, f"{name}[{reading}]", reason, f"{detail.strip()[:300]} (rest of the file skipped)")
    except ValueError as e:  # a number past Python's digit limit, from ijson's Python backends (yajl says overflow)
        yield BadRow(-1, f"{name}[{reading}]", Reason.NUMBER_TOO_LONG, f"{str(e)[:200]} (rest of the file skipped)")


def _text_values(file: SourceFile, locate: Locator) -> Iterator[tuple[str, Any] | BadRow]:
    with _open_bytes(file, locate) as stream:
        peeked = stream.peek(READ_CHUNK) if isinstance(stream, io.BufferedReader) else b""
        is_array = file.kind == "json" and peeked.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"["
        yield from (_json_array_values if is_array else _jsonl_values)(stream, file.name)


def _parquet_values(file: SourceFile, locate: Locator) -> Iterator[tuple[str, Any] | BadRow]:
    """Record batch by record batch. Parquet needs random access, so an S3 object is first copied to local disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    storage, key = locate(file.uri)
    with tempfile.TemporaryDirectory(prefix="regen-source-") as tmp:
        path = Path(storage.uri(key)) if isinstance(storage, LocalStorage) else Path(tmp) / "source.parquet"
        if not isinstance(storage, LocalStorage):
            storage.get_file(key, path)
        row = 0
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH):
                for value in batch.to_pylist():
                    row += 1
                    yield f"{file.name}:row {row}", value
        except (pa.ArrowException, OSError) as e:  # a damaged file reads the same on a retry: name it
            if is_transient(e):  # (a network file system's I/O error: the retry reads it again)
                raise
            raise CorruptSource(f"{file.uri}: not a readable Parquet file after row {row} ({e}); replace it") from e


def _hub_rows(hf: HubDataset, resolve_path: Callable[[str], str]) -> Iterator[tuple[str, Any]]:
    import datasets

    datasets.disable_progress_bars()  # bars in task logs are noise; prepare logs its own progress
    if hf.path is not None:
        saved = resolve_path(hf.path)
        if not Path(saved).exists():
            raise MissingSource(f"hf.path {hf.path}: no dataset is saved at {saved}")
        loaded = datasets.load_from_disk(saved)
        if isinstance(loaded, datasets.DatasetDict):
            if hf.split not in loaded:
                raise ValueError(f"hf.path {hf.path}: no split {hf.split!r}; it has {', '.join(loaded)}")
            loaded = loaded[hf.split]
        name = f"{Path(hf.path).name}[{hf.split}]"
    else:
        loaded = datasets.load_dataset(hf.id, name=hf.subset, split=hf.split, revision=hf.revision, streaming=True)
        name = f"{hf.id}[{hf.split}]"
    for row, value in enumerate(loaded, start=1):
        yield f"{name}:row {row}", value


def iter_rows(
    config: DatasetConfig, resolve_path: Callable[[str], str] = str, s3_client: S3ClientFactory | None = None
) -> Iterator[SourceRow | BadRow]:
    """Every row of a dataset in a stable order, numbered from 0 across all its files."""
    if config.hf is not None:
        values: Iterator[tuple[str, Any] | BadRow] = _hub_rows(config.hf, resolve_path)
    else:
        locate = Locator(s3_client)
        files = expand_files([resolve_path(p) for p in config.paths or []], locate)
        log.info("reading %d file(s): %s", len(files), ", ".join(f.uri for f in files[:5]))
        values = (
            value
            for file in files
            for value in (_parquet_values if file.kind == "parquet" else _text_values)(file, locate)
        )
    for index, value in enumerate(values):
        if isinstance(value, BadRow):
            yield BadRow(index, value.source, value.reason, value.detail)
        elif problem := _value_problem(value[1]):  # Parquet and hub rows are checked here; text rows when read
            yield BadRow(index, value[0], problem.reason, str(problem))
        else:
            yield SourceRow(index, *value)


def source_digests(
    config: DatasetConfig, resolve_path: Callable[[str], str], s3_client: S3ClientFactory | None = None
) -> dict[str, str] | None:
    """Each source file's content identity: sha256 of a local file, the ETag of an S3 object (S3 computes it from the
    content), every file of a `save_to_disk` folder. None when it cannot be known (a hub dataset at no pinned
    revision): such a dataset is never taken as unchanged."""
    if config.hf is not None:
        if config.hf.path is not None:
            folder = Path(resolve_path(config.hf.path))
            if not folder.is_dir():
                return None  # prepare says it is missing, with its own message
            return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}
        return {f"hf://{config.hf.id}": config.hf.revision} if config.hf.revision else None
    locate = Locator(s3_client)
    digests: dict[str, str] = {}
    for file in expand_files([resolve_path(p) for p in config.paths or []], locate):
        storage, key = locate(file.uri)
        digests[file.uri] = storage.content_id(key)
    return digests
