"""Rows built to crash a reader or exhaust memory are rejected with a reason, and reading goes on."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.config import DatasetConfig
from regen.stages.prepare.sources import MAX_DEPTH, MAX_ROW_BYTES, BadRow, SourceRow, iter_rows

GOOD = b'{"input": "still read"}'


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def read(path: Path) -> list[SourceRow | BadRow]:
    return list(iter_rows(DatasetConfig(paths=[str(path)])))


@pytest.mark.parametrize(
    "line,reason",
    [
        pytest.param(b'{"input": "x", "tools": ' + nested(985) + b"}", "too_deep", id="985-levels"),
        pytest.param(b'{"input": "x", "meta": ' + nested(MAX_DEPTH + 1) + b"}", "too_deep", id="just-too-deep"),
        pytest.param(b'{"input": "x", "n": ' + b"7" * 5000 + b"}", "number_too_long", id="5000-digits"),
        pytest.param(b'{"input": "x", "score": NaN}', "non_finite_number", id="nan"),
        pytest.param(b'{"input": "x", "score": -Infinity}', "non_finite_number", id="infinity"),
        pytest.param(b"   \r", "blank_line", id="blank"),
        pytest.param(b'{"input": "x"\x00}', "malformed_json", id="nul"),
    ],
)
def test_a_hostile_line_is_one_rejected_row_with_its_place(tmp_path: Path, line: bytes, reason: str) -> None:
    (tmp_path / "rows.jsonl").write_bytes(line + b"\n" + GOOD + b"\n")
    bad, good = read(tmp_path / "rows.jsonl")
    assert isinstance(bad, BadRow) and (bad.reason, bad.source, bad.index) == (reason, "rows.jsonl:1", 0)
    assert isinstance(good, SourceRow) and good.value == json.loads(GOOD) and good.source == "rows.jsonl:2"


def test_nesting_up_to_the_bound_is_read(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_bytes(b'{"input": "x", "meta": ' + nested(MAX_DEPTH - 1) + b"}\n")
    [row] = read(tmp_path / "rows.jsonl")
    assert isinstance(row, SourceRow)


def test_a_line_over_the_size_bound_is_read_past_not_into_memory(tmp_path: Path) -> None:
    huge = b'{"input": "' + b"a" * (MAX_ROW_BYTES + 10) + b'"}'
    (tmp_path / "rows.jsonl").write_bytes(huge + b"\n" + GOOD + b"\n")
    bad, good = read(tmp_path / "rows.jsonl")
    assert isinstance(bad, BadRow) and bad.reason == "row_too_large"
    assert isinstance(good, SourceRow) and good.source == "rows.jsonl:2"


READ_IN_A_CHILD = """
import resource, sys
from regen.config import DatasetConfig
from regen.stages.prepare.sources import iter_rows
rows = list(iter_rows(DatasetConfig(paths=[sys.argv[1]])))
print([str(getattr(r, "reason", "ok")) for r in rows], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def peak_rss_reading(path: Path) -> tuple[str, int]:
    """What a fresh process reads from `path`, and its peak RSS in MB."""
    done = subprocess.run([sys.executable, "-c", READ_IN_A_CHILD, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    reasons, peak_mb = done.stdout.rsplit(" ", 1)
    return reasons, int(peak_mb)


def test_a_json_array_item_100000_levels_deep_is_rejected_in_flat_memory(tmp_path: Path) -> None:
    """A 200 KB file that once grew a reader to 23 GB. Peak RSS is measured in a child process, against a child
    that reads a three-item file (the imports' share)."""
    (tmp_path / "deep.json").write_bytes(b"[" + nested(100_000) + b", " + GOOD + b", " + nested(3) + b"]")
    (tmp_path / "flat.json").write_bytes(b"[" + nested(3) + b", " + GOOD + b", " + nested(3) + b"]")
    reasons, deep_mb = peak_rss_reading(tmp_path / "deep.json")
    _, flat_mb = peak_rss_reading(tmp_path / "flat.json")
    assert reasons == "['too_deep', 'ok', 'ok']"
    assert deep_mb - flat_mb < 50, f"peak RSS {deep_mb} MB against {flat_mb} MB"


def test_an_array_that_breaks_off_names_the_item_it_broke_in(tmp_path: Path) -> None:
    (tmp_path / "rows.json").write_bytes(b"[" + GOOD + b", {" + b'"input": ' + b"1" * 5000 + b"}]")
    good, bad = read(tmp_path / "rows.json")
    assert isinstance(good, SourceRow)
    assert isinstance(bad, BadRow) and (bad.reason, bad.source) == ("malformed_json", "rows.json[2]")
    assert "integer overflow" in bad.detail and "rest of the file skipped" in bad.detail


def test_a_parquet_row_with_a_nan_is_rejected_not_written_as_non_json(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"input": ["a", "b"], "score": [float("nan"), 0.5]})
    pq.write_table(table, tmp_path / "rows.parquet")
    bad, good = read(tmp_path / "rows.parquet")
    assert isinstance(bad, BadRow) and (bad.reason, bad.source) == ("non_finite_number", "rows.parquet:row 1")
    assert isinstance(good, SourceRow) and good.value == {"input": "b", "score": 0.5}


@pytest.mark.parametrize("damage", ["footer", "pages"])
def test_a_damaged_parquet_file_fails_naming_the_file(tmp_path: Path, damage: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from regen.stages.prepare.sources import CorruptSource

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"input": [f"prompt {i}" * 50 for i in range(2000)]}), path, compression="snappy")
    data = bytearray(path.read_bytes())
    if damage == "footer":
        data = data[:-8]  # no magic bytes at the end
    else:
        data[100:4000] = bytes(3900)  # zeroes over the first column chunk's pages
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSource, match=rf"{path}: not a readable Parquet file"):
        read(path)


def test_an_io_error_reading_a_parquet_file_is_retried_not_called_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network file system's I/O error mid-read: the task's retry reads the file again, no 'replace it'."""
    import errno

    import pyarrow as pa
    import pyarrow.parquet as pq

    from regen.stages.prepare.sources import CorruptSource

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"input": ["a", "b"]}), path)

    def failing(self: object, **_: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", failing)
    with pytest.raises(OSError) as raised:
        read(path)
    assert not isinstance(raised.value, CorruptSource) and raised.value.errno == errno.EIO


def test_a_prepare_broken_off_by_a_damaged_file_leaves_nothing_a_rerun_keeps(tmp_path: Path) -> None:
    import gzip

    from regen.layout import DatasetLocation
    from regen.profiles import lookup
    from regen.stages.prepare.prepare import PrepareSettings, run_prepare
    from regen.stages.prepare.sources import CorruptSource
    from regen.storage import LocalStorage

    rows = b"".join(json.dumps({"input": f"task {i}"}).encode() + b"\n" for i in range(1500))  # past the read-ahead
    (tmp_path / "part-0.jsonl").write_bytes(rows)
    (tmp_path / "part-1.jsonl.gz").write_bytes(gzip.compress(rows.replace(b"task", b"job"))[:-20])  # truncated
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    config = DatasetConfig(paths=[str(tmp_path / "part-*")])
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    with pytest.raises(CorruptSource, match=r"part-1\.jsonl\.gz: the gzip stream is damaged"):
        run_prepare(config, location, storage, renderer, PrepareSettings(shard_size=100, limit=None, workers=1))
    left = storage.list_keys(location.prompts_folder)
    assert left and location.prepared not in left  # shards of part-0, no completion marker

    (tmp_path / "part-1.jsonl.gz").unlink()  # the damaged file is taken out of the dataset
    prepared = run_prepare(config, location, storage, renderer, PrepareSettings(shard_size=1000, limit=None, workers=1))
    assert sorted(storage.list_keys(location.prompts_folder)) == sorted(
        [s.prompts_key for s in prepared.shards] + [location.prepared]
    )


def test_a_message_too_long_for_any_tokenization_is_rejected_before_tokenizing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from regen.profiles import lookup
    from regen.stages.prepare.tokenize import render

    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    per_token, limit = renderer.max_token_bytes, renderer.profile.max_prompt_tokens
    assert per_token is not None
    # The bound holds: no token of the vocabulary decodes to more bytes (special tokens included).
    table = renderer._byte_table()
    assert table is not None and max(len(entry) for entry in table.table) == per_token

    def no_tokenizing(*args: object) -> list[int]:
        raise AssertionError("tokenized a message that cannot fit")

    huge = [{"role": "user", "content": "ten megabytes " * 750_000}]
    with monkeypatch.context() as patched:
        patched.setattr(renderer, "render_ids", no_tokenizing)
        rejected = render(renderer, huge, [])
    assert not isinstance(rejected, list) and rejected.reason == "prompt_too_long"
    assert f"more than {limit} tokens however it is tokenized" in rejected.detail
    # Just past the limit in tokens but under the byte bound: tokenized, and rejected by its count.
    words = [{"role": "user", "content": "word " * (limit + 10)}]
    counted = render(renderer, words, [])
    assert not isinstance(counted, list) and counted.detail.endswith(f"tokens > {limit}")


def test_no_cheap_bound_when_a_normalizer_could_shrink_text_without_limit() -> None:
    from tokenizers import normalizers

    from regen.profiles import lookup

    def with_normalizer(normalizer: normalizers.Normalizer) -> ChatRenderer:
        renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
        renderer.tokenizer = copy.deepcopy(renderer.tokenizer)  # the loaded tokenizer is shared: change a copy
        renderer.tokenizer.backend_tokenizer.normalizer = normalizer
        return renderer

    plain = ChatRenderer(lookup("kimi-k2.5-mini")).max_token_bytes
    assert plain is not None
    assert with_normalizer(normalizers.Strip()).max_token_bytes is None
    assert with_normalizer(normalizers.NFC()).max_token_bytes == 3 * plain
    assert ChatRenderer(lookup("kimi-k2.5-mini")).tokenizer.backend_tokenizer.normalizer is None
