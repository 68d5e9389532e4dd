from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from regen.config import DatasetConfig, HubDataset
from regen.stages.prepare.sources import BadRow, CorruptSource, SourceRow, expand_files, file_kind, iter_rows
from regen.storage import Locator

ROWS = [{"input": f"task {i}", "domain": "generic"} for i in range(5)]


def jsonl(rows: list[Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def read(config: DatasetConfig, **kwargs: Any) -> list[SourceRow | BadRow]:
    return list(iter_rows(config, **kwargs))


def values(rows: list[SourceRow | BadRow]) -> list[Any]:
    return [r.value for r in rows if isinstance(r, SourceRow)]


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 2) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


@pytest.mark.parametrize(
    "name,encode",
    [
        pytest.param("rows.jsonl", jsonl, id="jsonl"),
        pytest.param("rows.ndjson", jsonl, id="ndjson"),
        pytest.param("rows.jsonl.gz", lambda rows: gzip.compress(jsonl(rows)), id="jsonl-gzip"),
        pytest.param("rows.jsonl.zst", lambda rows: zstandard.ZstdCompressor().compress(jsonl(rows)), id="jsonl-zstd"),
        pytest.param(
            "rows.jsonl.zst",
            lambda rows: b"".join(zstandard.ZstdCompressor().compress(jsonl(rows[i : i + 2])) for i in (0, 2, 4)),
            id="jsonl-zstd-frames",
        ),
        pytest.param("rows.json", lambda rows: json.dumps(rows, indent=2).encode(), id="json-array"),
        pytest.param("rows.json.gz", lambda rows: gzip.compress(json.dumps(rows).encode()), id="json-array-gzip"),
        pytest.param("rows.json", jsonl, id="json-that-is-json-lines"),
    ],
)
def test_text_files_stream_every_row_in_order(tmp_path: Path, name: str, encode: Any) -> None:
    (tmp_path / name).write_bytes(encode(ROWS))
    rows = read(DatasetConfig(paths=[str(tmp_path / name)]))
    assert values(rows) == ROWS
    assert [r.index for r in rows] == [0, 1, 2, 3, 4]


def test_parquet_streams_by_record_batch(tmp_path: Path) -> None:
    write_parquet(tmp_path / "rows.parquet", ROWS)
    rows = read(DatasetConfig(paths=[str(tmp_path / "rows.parquet")]))
    assert values(rows) == ROWS
    assert rows[4].source == "rows.parquet:row 5"


def test_a_glob_reads_several_files_in_name_order_with_one_index(tmp_path: Path) -> None:
    (tmp_path / "part-1.jsonl").write_bytes(jsonl(ROWS[2:]))
    (tmp_path / "part-0.jsonl.gz").write_bytes(gzip.compress(jsonl(ROWS[:2])))
    (tmp_path / "notes.txt").write_text("not part of the glob")
    rows = read(DatasetConfig(paths=[str(tmp_path / "part-*")]))
    assert values(rows) == ROWS
    assert [(r.index, r.source) for r in rows][:3] == [
        (0, "part-0.jsonl.gz:1"),
        (1, "part-0.jsonl.gz:2"),
        (2, "part-1.jsonl:1"),
    ]


def test_bad_lines_become_bad_rows_and_reading_goes_on(tmp_path: Path) -> None:
    lines = [b'{"input": "a"}', b'{"input": "trunc', b'{"input": "caf\xe9"}', b"", b"\xef\xbb\xbf" + b'{"input": "b"}']
    (tmp_path / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    rows = read(DatasetConfig(paths=[str(tmp_path / "rows.jsonl")]))
    assert [(type(r).__name__, r.index, r.source) for r in rows] == [
        ("SourceRow", 0, "rows.jsonl:1"),
        ("BadRow", 1, "rows.jsonl:2"),
        ("BadRow", 2, "rows.jsonl:3"),
        ("BadRow", 3, "rows.jsonl:4"),  # every line is accounted for, a blank one too
        ("SourceRow", 4, "rows.jsonl:5"),
    ]
    assert [r.reason for r in rows if isinstance(r, BadRow)] == ["malformed_json", "invalid_utf8", "blank_line"]
    assert values(rows) == [{"input": "a"}, {"input": "b"}]


@pytest.mark.parametrize(
    "data,reason",
    [
        pytest.param(b'[{"input": "a"}, {"input": "b"', "malformed_json", id="truncated"),
        pytest.param(b'[{"input": "a"}, {"input": "\xff"}, {"input": "c"}]', "invalid_utf8", id="utf8"),
    ],
)
def test_a_broken_json_array_keeps_the_items_before_the_fault(tmp_path: Path, data: bytes, reason: str) -> None:
    (tmp_path / "rows.json").write_bytes(data)
    rows = read(DatasetConfig(paths=[str(tmp_path / "rows.json")]))
    assert values(rows) == [{"input": "a"}]
    assert isinstance(rows[-1], BadRow) and rows[-1].reason == reason and rows[-1].source == "rows.json[2]"


def test_a_dataset_saved_to_disk_reads_through_the_hugging_face_path(tmp_path: Path) -> None:
    import datasets

    messages = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "user", "content": "bye"}],
    ]
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"messages": m} for m in messages]),
            "test": datasets.Dataset.from_list([{"messages": messages[1]}]),
        }
    ).save_to_disk(str(tmp_path / "saved"))
    rows = read(DatasetConfig(hf=HubDataset(path="saved")), resolve_path=lambda p: str(tmp_path / p))
    assert values(rows) == [{"messages": m} for m in messages]
    assert rows[0].source == "saved[train]:row 1"


def test_s3_sources_stream_objects_and_expand_globs(s3_client: Any) -> None:
    bucket = f"src-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=bucket)
    s3_client.put_object(
        Bucket=bucket, Key="data/a/part-0.jsonl.zst", Body=zstandard.ZstdCompressor().compress(jsonl(ROWS[:2]))
    )
    s3_client.put_object(Bucket=bucket, Key="data/a/part-1.json", Body=json.dumps(ROWS[2:3]).encode())
    s3_client.put_object(Bucket=bucket, Key="data/a/deeper/skip.jsonl", Body=jsonl(ROWS))
    table = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(ROWS[3:]), table)
    s3_client.put_object(Bucket=bucket, Key="data/b.parquet", Body=table.getvalue().to_pybytes())
    config = DatasetConfig(paths=[f"s3://{bucket}/data/a/part-*", f"s3://{bucket}/data/b.parquet"])
    rows = read(config, s3_client=lambda: s3_client)
    assert values(rows) == ROWS
    assert [r.source for r in rows][::2] == ["part-0.jsonl.zst:1", "part-1.json[1]", "b.parquet:row 2"]
    recursive = expand_files([f"s3://{bucket}/data/**/*.jsonl"], Locator(lambda: s3_client))
    assert [f.uri for f in recursive] == [f"s3://{bucket}/data/a/deeper/skip.jsonl"]


@pytest.mark.parametrize(
    "name,expected",
    [
        pytest.param("a.jsonl", ("jsonl", None), id="jsonl"),
        pytest.param("a.JSON.GZ", ("json", "gzip"), id="json-gz"),
        pytest.param("a.jsonl.zstd", ("jsonl", "zstd"), id="zstd"),
        pytest.param("s3://b/k/a.parquet", ("parquet", None), id="parquet"),
    ],
)
def test_file_kind_from_the_name(name: str, expected: tuple[str, str | None]) -> None:
    assert file_kind(name) == expected


@pytest.mark.parametrize(
    "name,message",
    [
        pytest.param("a.csv", "unknown file type", id="csv"),
        pytest.param("a.parquet.gz", "Parquet compresses its own pages", id="parquet-gz"),
    ],
)
def test_unsupported_files_fail_before_reading(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / name).write_text("x")
    with pytest.raises(ValueError, match=message):
        expand_files([str(tmp_path / name)])


def test_a_source_matching_nothing_fails_with_its_pattern(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="matches no file"):
        expand_files([str(tmp_path / "missing-*.jsonl")])
    with pytest.raises(ValueError, match="only local paths and s3://"):
        expand_files(["gs://bucket/rows.jsonl"])


def test_a_hub_id_streams_through_load_dataset(tmp_path: Path) -> None:
    """The hub cannot be reached here; a local dataset repository (a folder of data files, as cloned from the hub)
    goes through the same `load_dataset(id, split=..., streaming=True)` call."""
    repo = tmp_path / "org" / "glaive-like"
    repo.mkdir(parents=True)
    (repo / "train.jsonl").write_bytes(jsonl(ROWS))
    rows = read(DatasetConfig(hf=HubDataset(id=str(repo), split="train")))
    assert values(rows) == ROWS
    assert rows[0].source == f"{repo}[train]:row 1"


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize(
    "name,compress",
    [
        pytest.param("rows.jsonl.gz", gzip.compress, id="gzip"),
        pytest.param("rows.jsonl.zst", zstandard.ZstdCompressor().compress, id="zstd"),
    ],
)
def test_a_damaged_compressed_file_fails_naming_the_file(
    tmp_path: Path, s3_client: Any, backend: str, name: str, compress: Any
) -> None:
    """Local files and S3 objects stream through the same storage layer: a cut stream fails the same way."""
    damaged = compress(jsonl(ROWS * 50))[:-20]
    if backend == "local":
        (tmp_path / name).write_bytes(damaged)
        uri = str(tmp_path / name)
    else:
        bucket = f"damaged-{uuid.uuid4().hex[:8]}"
        s3_client.create_bucket(Bucket=bucket)
        s3_client.put_object(Bucket=bucket, Key=f"in/{name}", Body=damaged)
        uri = f"s3://{bucket}/in/{name}"
    with pytest.raises(CorruptSource, match=name):
        read(DatasetConfig(paths=[uri]), s3_client=lambda: s3_client)


TREE = ["data/a/part-0.jsonl", "data/a/part-1.json", "data/a/deeper/skip.jsonl", "data/b/x.parquet", "data/top.jsonl"]


@pytest.mark.parametrize(
    "pattern,expected",
    [
        ("data/*.jsonl", ["data/top.jsonl"]),
        ("data/**/*.jsonl", ["data/a/deeper/skip.jsonl", "data/a/part-0.jsonl", "data/top.jsonl"]),
        ("data/a/part-?.json*", ["data/a/part-0.jsonl", "data/a/part-1.json"]),
        ("data/[ab]/*", ["data/a/part-0.jsonl", "data/a/part-1.json", "data/b/x.parquet"]),
        ("data/**", sorted(TREE)),
        ("data/a/part-1.json", ["data/a/part-1.json"]),
        ("data/a/missing.json", []),
    ],
)
def test_a_glob_matches_the_same_files_locally_and_on_s3(
    tmp_path: Path, s3_client: Any, pattern: str, expected: list[str]
) -> None:
    bucket = f"glob-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=bucket)
    for key in TREE:
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_text("{}\n")
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"{}\n")
    locate = Locator(lambda: s3_client)
    local = [Path(uri).relative_to(tmp_path.resolve()).as_posix() for uri in locate.expand(f"{tmp_path}/{pattern}")]
    on_s3 = [uri.removeprefix(f"s3://{bucket}/") for uri in locate.expand(f"s3://{bucket}/{pattern}")]
    assert local == on_s3 == expected
