"""The scale bench's exactly-once check (bench/scale_once.py) counts from the data, and fails when the data is wrong:
a small dataset of the bench's own rows published for real, then a row published twice, a row missing, a row both
published and rejected, and a source row the pipeline never accounted for planted in copies of it."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen.chat import ChatRenderer
from regen.config import DatasetConfig
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.stages.publish.publish import run_publish
from regen.storage import LocalStorage
from tests.conftest import ROOT, finish_shards
from tools.devstack import Simulator, start_simulator

sys.path.insert(0, str(ROOT / "bench"))
from scale_once import count_once, source_prompts
from scale_rows import generate


@pytest.fixture(scope="module")
def flaky_simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    """Some answers carry a defect, so validate rejects a few."""
    with start_simulator(tmp_path_factory.mktemp("sim"), "--defect-rate", "0.3") as sim:
        yield sim


def publish(folder: Path, config: DatasetConfig, renderer: ChatRenderer, url: str) -> Path:
    storage = LocalStorage(folder / "storage")
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "scale", "v1")
    prepared = run_prepare(config, location, storage, renderer, PrepareSettings(shard_size=6, limit=None, workers=1))
    assert isinstance(prepared, PreparedDataset)
    finish_shards(prepared.shards, storage, renderer, url)
    run_publish(prepared, storage, fleet=[], run_id="manual__v1")
    return folder / "storage" / location.prefix


@pytest.fixture(scope="module")
def published(
    tmp_path_factory: pytest.TempPathFactory, renderer: ChatRenderer, flaky_simulator: Simulator
) -> tuple[Path, DatasetConfig]:
    """20 of the bench's rows, a row that is not an object and a copy of the first row, published."""
    folder = tmp_path_factory.mktemp("scale")
    source = folder / "main.jsonl"
    generate(source, 20, shape="short")
    lines = source.read_text().splitlines()
    source.write_text("\n".join([*lines, "[1, 2]", lines[0]]) + "\n")
    config = DatasetConfig(paths=[str(source)])
    return publish(folder, config, renderer, flaky_simulator.url), config


def counted(version: Path, config: DatasetConfig, renderer: ChatRenderer) -> dict[str, Any]:
    return count_once(version, source_prompts(config, renderer.profile.tool_call_id_format))


def copy_of(version: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(version, tmp_path / "version"))


def rewrite_first_train_file(version: Path, change: Any) -> str:
    """The first train/ file with its rows changed by `change(rows)`; returns its first row's id."""
    path = sorted((version / "train").glob("*.parquet"))[0]
    table = pq.read_table(path)
    rows = table.to_pylist()
    pq.write_table(pa.Table.from_pylist(change(rows), schema=table.schema), path)
    return str(rows[0]["id"])


def test_a_published_dataset_accounts_for_every_source_row_once(
    published: tuple[Path, DatasetConfig], renderer: ChatRenderer
) -> None:
    version, config = published
    result = counted(version, config, renderer)
    assert result["ok"], result
    assert result["source_rows"] == 22 and result["prompts"] == 21  # the non-object row gives no prompt
    assert result["rejected"]["prepare"] == 2  # the non-object row and the copy
    assert result["rejected"].get("validate", 0) > 0  # some answers rejected later, each counted as that row's outcome
    assert result["published"] + result["rejected"]["validate"] + result["rejected"].get("generate", 0) == 20


@pytest.mark.parametrize(
    ("change", "problem"),
    [(lambda rows: [*rows, rows[0]], "published_twice"), (lambda rows: rows[1:], "missing")],
    ids=["a-row-published-twice", "a-row-missing-from-train"],
)
def test_a_train_file_with_a_row_too_many_or_too_few_is_caught(
    published: tuple[Path, DatasetConfig], renderer: ChatRenderer, tmp_path: Path, change: Any, problem: str
) -> None:
    version = copy_of(published[0], tmp_path)
    first = rewrite_first_train_file(version, change)
    result = counted(version, published[1], renderer)
    assert not result["ok"] and result["problems"] == {problem: 1}
    assert result["examples"][problem] == [first]


def test_a_row_both_published_and_rejected_is_caught(
    published: tuple[Path, DatasetConfig], renderer: ChatRenderer, tmp_path: Path
) -> None:
    version = copy_of(published[0], tmp_path)
    both = rewrite_first_train_file(version, lambda rows: rows)
    line = {"id": both, "stage": "validate", "reason": "missing_think_end", "detail": "planted"}
    with (version / "rejected" / "shard-00000-validate.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")
    result = counted(version, published[1], renderer)
    assert not result["ok"] and result["problems"] == {"published_and_rejected": 1}


def test_a_source_row_the_version_never_saw_is_caught(
    published: tuple[Path, DatasetConfig], renderer: ChatRenderer, tmp_path: Path
) -> None:
    """The manifest agrees with itself here (nothing in the version changed): only the source rows tell."""
    version, config = published
    source = tmp_path / "main.jsonl"
    source.write_text(Path(str(config.paths[0])).read_text() + json.dumps({"input": "one more", "output": "r"}) + "\n")
    result = counted(version, DatasetConfig(paths=[str(source)]), renderer)
    assert not result["ok"] and result["problems"] == {"missing": 1}


def test_a_row_rejected_at_prepare_that_was_also_published_is_caught(
    published: tuple[Path, DatasetConfig], renderer: ChatRenderer, tmp_path: Path
) -> None:
    version = copy_of(published[0], tmp_path)
    both = rewrite_first_train_file(version, lambda rows: rows)
    index = next(i for i, prompts in source_prompts(published[1], "") if prompts and prompts[0][1] == [both])
    line = {"id": both, "stage": "prepare", "reason": "too_long", "detail": "planted", "source_index": index}
    with (version / "rejected" / "prepare.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")
    result = counted(version, published[1], renderer)
    assert not result["ok"] and result["problems"] == {"rejected_at_prepare_and_answered": 1}


def test_a_row_the_pipelines_reader_drops_is_caught(
    tmp_path: Path, renderer: ChatRenderer, flaky_simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader bug that loses a line (planted in the pipeline's JSON Lines reader for the whole test) is not shared
    by the count, which reads the source itself: the lost row's prompt is missing."""
    from regen.stages.prepare import sources

    read_lines = sources._jsonl_values

    def losing_line_4(stream: Any, name: str) -> Iterator[Any]:
        return (value for number, value in enumerate(read_lines(stream, name), start=1) if number != 4)

    monkeypatch.setattr(sources, "_jsonl_values", losing_line_4)
    source = tmp_path / "main.jsonl"
    generate(source, 8, shape="short")
    config = DatasetConfig(paths=[str(source)])
    version = publish(tmp_path, config, renderer, flaky_simulator.url)
    result = counted(version, config, renderer)
    assert result["source_rows"] == 8 and not result["ok"]
    assert result["problems"] == {"missing": 1}, result
