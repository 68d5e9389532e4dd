"""Stage 1: a dataset source -> normalised, deduplicated, tokenised prompt shards in storage.

Idempotent: once `prompts/prepare.json` exists for a dataset version, it is the answer, so a cleared or retried task
never reshards prompts that later stages already consumed.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from regen.chat import ChatRenderer
from regen.config import DatasetConfig
from regen.datasets.normalise import Conversation, Rejection, normalise_row
from regen.datasets.readers import BadRow, expand_paths, iter_jsonl
from regen.manifest import DatasetLocation, PreparedDataset, ShardManifest, StageStats
from regen.storage import Storage

log = logging.getLogger(__name__)

PROMPT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source_index", pa.int64()),
        ("source", pa.string()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("meta", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
    ]
)


def prepare_manifest_key(location: DatasetLocation) -> str:
    return location.key("prompts", "prepare.json")


class _Rejections:
    """Rejected rows streamed to a local file, uploaded once: nothing dropped silently, memory stays flat."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "rejected.jsonl"
        self._file = self.path.open("w", encoding="utf-8")

    def add(self, index: int, source: str, reason: str, detail: str, sample_id: str | None = None) -> None:
        record = {
            "id": sample_id,
            "source_index": index,
            "source": source,
            "stage": "prepare",
            "reason": reason,
            "detail": detail,
        }
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._file.close()


def _conversations(
    config: DatasetConfig, paths: list[Path], id_format: str, stats: StageStats, rejections: _Rejections
) -> Iterator[tuple[int, str, Conversation]]:
    for row in iter_jsonl(paths):
        if isinstance(row, BadRow):
            stats.drop(row.reason)
            rejections.add(row.index, row.source, row.reason, row.detail)
            continue
        result = normalise_row(row.value, config.format, id_format)
        if isinstance(result, Rejection):
            stats.drop(result.reason)
            rejections.add(row.index, row.source, result.reason, result.detail)
            continue
        yield row.index, row.source, result


def _write_shard(rows: list[dict[str, Any]], storage: Storage, key: str, workdir: Path) -> str:
    table = pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)
    path = workdir / "shard.parquet"
    pq.write_table(table, path, compression="zstd")
    return storage.put_file(key, path)


def run_prepare(
    config: DatasetConfig,
    location: DatasetLocation,
    storage: Storage,
    renderer: ChatRenderer,
    shard_size: int,
    limit: int | None,
    resolve_path: Any = str,
) -> PreparedDataset:
    existing = prepare_manifest_key(location)
    if storage.exists(existing):
        log.info("%s already prepared; reusing %s", location.dataset, storage.uri(existing))
        return PreparedDataset.from_dict(json.loads(storage.get_bytes(existing)))

    paths = expand_paths([resolve_path(p) for p in config.paths])
    stats, seen, shards, buffer = StageStats(), set[str](), list[ShardManifest](), list[dict[str, Any]]()
    duplicates = 0
    with tempfile.TemporaryDirectory(prefix="regen-prepare-") as tmp:
        workdir = Path(tmp)
        rejections = _Rejections(workdir)

        def flush() -> None:
            shard = ShardManifest(location, len(shards), "", "", len(buffer))
            key = shard.key("prompts", ".parquet")
            digest = _write_shard(buffer, storage, key, workdir)
            shards.append(ShardManifest(location, shard.shard, key, digest, len(buffer)))
            buffer.clear()

        for index, source, conversation in _conversations(
            config, paths, renderer.profile.tool_call_id_format, stats, rejections
        ):
            sample_id = conversation.sample_id
            if sample_id in seen:
                duplicates += 1
                stats.drop("duplicate")
                rejections.add(index, source, "duplicate", "same prompt as an earlier row", sample_id)
                continue
            prompt_ids = renderer.render_ids(conversation.messages, conversation.tools)
            if len(prompt_ids) > renderer.profile.max_prompt_tokens:
                stats.drop("prompt_too_long")
                detail = f"{len(prompt_ids)} tokens > {renderer.profile.max_prompt_tokens}"
                rejections.add(index, source, "prompt_too_long", detail, sample_id)
                continue
            seen.add(sample_id)
            stats.keep()
            buffer.append(
                {
                    "id": sample_id,
                    "source_index": index,
                    "source": source,
                    # Key order kept as rendered: re-rendering the stored columns gives the same prompt_ids.
                    "messages": json.dumps(conversation.messages, ensure_ascii=False),
                    "tools": json.dumps(conversation.tools, ensure_ascii=False),
                    "meta": json.dumps(conversation.meta, ensure_ascii=False),
                    "prompt_ids": prompt_ids,
                }
            )
            if len(buffer) >= shard_size:
                flush()
            if limit is not None and stats.kept >= limit:
                break
        if buffer:
            flush()
        rejections.close()
        files = {}
        if stats.dropped:
            rejected_key = location.key("rejected", "prepare.jsonl")
            files[rejected_key] = storage.put_file(rejected_key, rejections.path)

    stats.check()
    prepared = PreparedDataset(
        location=location,
        shards=shards,
        stats=stats,
        duplicates=duplicates,
        profile=renderer.profile.as_record(),
        token_roles=renderer.roles.as_record(),
        files=files,
    )
    storage.put_bytes(existing, json.dumps(prepared.to_dict(), indent=1).encode())
    log.info(
        "prepared %s: %d rows read, %d prompts kept in %d shards, %d duplicates, dropped %s",
        location.dataset,
        stats.total,
        stats.kept,
        len(shards),
        duplicates,
        stats.dropped_by_reason,
    )
    return prepared


def read_prompts(storage: Storage, shard: ShardManifest) -> pa.Table:
    with tempfile.TemporaryDirectory(prefix="regen-read-") as tmp:
        path = Path(tmp) / "prompts.parquet"
        storage.get_file(shard.prompts_key, path)
        return pq.read_table(path)
