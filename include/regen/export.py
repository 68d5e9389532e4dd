"""Stage 5: validated raw answers -> training records (input_ids, loss_mask) as Parquet.

`build_training_record` is pure: the sequence is prompt_ids + output_ids, untouched, and the mask is the generation
boundary. Records that failed validation go to rejected/ with their verdict; nothing is dropped silently.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from regen.manifest import ShardManifest, StageStats
from regen.storage import Storage
from regen.validate import OK, verdicts_key

TRAIN_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("prompt_len", pa.int32()),
        ("verdict", pa.string()),
        ("finish_reason", pa.string()),
    ]
)


def build_training_record(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    return [*prompt_ids, *output_ids], [0] * len(prompt_ids) + [1] * len(output_ids)


def run_export(shard: ShardManifest, storage: Storage) -> ShardManifest:
    if shard.raw_key is None:
        raise ValueError(f"{shard.name} has no raw answers yet: run generate first")
    verdicts = json.loads(storage.get_bytes(verdicts_key(shard)))["verdicts"]
    rows, rejected, stats = [], [], StageStats()
    for line in storage.get_bytes(shard.raw_key).decode("utf-8").splitlines():
        record = json.loads(line)
        verdict = verdicts[record["id"]]
        finish_reason = json.dumps(record["meta_info"]["finish_reason"])
        if verdict != OK:
            stats.drop(verdict)
            rejected.append({"id": record["id"], "stage": "validate", "reason": verdict, "detail": finish_reason})
            continue
        input_ids, loss_mask = build_training_record(record["prompt_ids"], record["output_ids"])
        rows.append(
            {
                "id": record["id"],
                "input_ids": input_ids,
                "loss_mask": loss_mask,
                "prompt_len": len(record["prompt_ids"]),
                "verdict": verdict,
                "finish_reason": finish_reason,
            }
        )
        stats.keep()
    train_key = shard.key("train", ".parquet")
    files = {}
    with tempfile.TemporaryDirectory(prefix="regen-export-") as tmp:
        path = Path(tmp) / "train.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=TRAIN_SCHEMA), path, compression="zstd")
        files[train_key] = storage.put_file(train_key, path)
    if rejected:
        key = shard.key("rejected", "-validate.jsonl")
        files[key] = storage.put_bytes(key, "".join(json.dumps(r) + "\n" for r in rejected).encode())
    exported = shard.with_stage("export", stats, files, train_key=train_key)
    storage.put_bytes(shard_report_key(shard), json.dumps(exported.to_dict(), indent=1).encode())
    return exported


def shard_report_key(shard: ShardManifest) -> str:
    """The shard's final manifest; its presence means the shard is finished."""
    return shard.key("reports", ".json")
