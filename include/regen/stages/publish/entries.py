"""What a version's manifest says of its shards and splits: each shard's files and counts (as the verifier reads them),
the records per split, and the share of source prompts held out."""

from __future__ import annotations

from typing import Any

from regen.manifest import PreparedDataset, ShardManifest


def shard_entries(shards: list[ShardManifest]) -> list[dict[str, Any]]:
    """The manifest's `shards`: each shard's files and counts, as the verifier reads them."""
    return [_shard_entry(s) for s in shards]


def _shard_entry(shard: ShardManifest) -> dict[str, Any]:
    entry = {
        "shard": shard.name,
        "prompts": shard.prompts_key,
        "num_prompts": shard.num_prompts,
        "train": shard.train_key,
        "raw": shard.raw_key,
        "records": shard.train_records,
    }
    if (validation := shard.keys.split("validation")) in shard.files:
        entry |= {"validation": validation, "validation_records": shard.split_records.get("validation", 0)}
    if shard.keys.token_counts in shard.files:
        entry["token_counts"] = shard.keys.token_counts
    return entry


def split_records(shards: list[ShardManifest]) -> dict[str, int]:
    """Records per split over the shards (validation/ only when some shard has it)."""
    splits = {
        "train": sum(s.train_records for s in shards),
        "validation": sum(s.split_records.get("validation", 0) for s in shards),
        "truncated": sum(s.split_records.get("truncated", s.stats["export"].dropped) for s in shards),
    }
    if not any(s.keys.split("validation") in s.files for s in shards):
        del splits["validation"]
    return splits


def draft_manifest(
    prepared: PreparedDataset, shards: list[ShardManifest], data_files: dict[str, str]
) -> dict[str, Any]:
    """What the verifier needs of a manifest that is not written yet: the files, the shards, the token roles."""
    location = prepared.location
    return {
        "dataset": location.dataset,
        "version": location.version,
        "token_roles": prepared.token_roles,
        "records": sum(s.train_records for s in shards),
        "validation_share": version_share(prepared),
        "shards": shard_entries(shards),
        "files": data_files,
    }


def version_share(prepared: PreparedDataset) -> float:
    """The share of source prompts the version holds out: one of its inputs (regen.version_inputs)."""
    return float(prepared.inputs.get("validation_share", 0.0))
