"""The verifier's checks of what trainers take from a version besides its records: each record on its source prompt's
side (regen.holdout), each shard's token counts and the version's vocab/ files against a count of the records
themselves (regen.vocab), and the hand-off's SpecForge copy of the mapping, where it wrote one. Used by regen.verify,
record file by record file, then once over the version."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa

from regen.holdout import Sides
from regen.layout import VOCAB_FILES, DatasetLocation, is_vocab_file
from regen.records import ShardPrompts
from regen.storage import Storage, read_table
from regen.torch_file import read_tensors
from regen.vocab import counts_from_table, counts_under_mask, vocab_mapping


def wrong_sides(prompts: ShardPrompts, share: float, sample_ids: list[str], claimed: list[str]) -> list[str]:
    """The records of one split file not on their source prompt's side (`claimed`: the side each is on: in train/ or
    validation/, where it is; in truncated/, its `side` column). A record of no prompt of the shard has no side to
    check: the comparison with what was sent names it."""
    side = Sides(prompts, share)
    return [i for i, claim in zip(sample_ids, claimed, strict=True) if i in prompts and claim != side(i)]


def count_train_file(
    storage: Storage, manifest: dict[str, Any], key: str, table: pa.Table, bad_files: set[str]
) -> tuple[np.ndarray, list[str]]:
    """The ids under a train file's loss mask, counted from its records, and its shard's counts file against them."""
    counts = counts_under_mask(table.column("input_ids"), table.column("loss_mask"))
    shard: dict[str, Any] = next((s for s in manifest["shards"] if s["train"] == key), {})
    counts_key = shard.get("token_counts")
    if not counts_key or counts_key in bad_files:
        return counts, []
    problem = counts_file_problem(storage, counts_key, counts)
    return counts, [problem] if problem else []


def has_vocab(manifest: dict[str, Any], bad_files: set[str]) -> bool:
    """Whether the manifest lists vocab/ (versions published before it do not), and every file it is counted from
    was read whole (a bad one is named already)."""
    listed = [key for key in manifest["files"] if is_vocab_file(key)]
    train_whole = not any(key.endswith(".parquet") and "/train/" in key for key in bad_files)
    return len(listed) == len(VOCAB_FILES) and train_whole and not set(listed) & bad_files


def same_counts(a: np.ndarray, b: np.ndarray) -> bool:
    size = max(len(a), len(b))
    return np.array_equal(np.pad(a, (0, size - len(a))), np.pad(b, (0, size - len(b))))


def counts_file_problem(storage: Storage, key: str, counted: np.ndarray) -> str | None:
    """A shard's counts file against the count of its train records."""
    if same_counts(counts_from_table(read_table(storage, key)), counted):
        return None
    return f"{key}: the token counts differ from those of the shard's train records"


def vocab_problems(manifest: dict[str, Any], storage: Storage, counted: np.ndarray) -> list[str]:
    """vocab/token_freq.parquet against the count of every train record, and d2t/t2d against the mapping of that
    count at the manifest's sizes."""
    location = DatasetLocation(manifest["root"], manifest["profile"]["name"], manifest["dataset"], manifest["version"])
    sizes = manifest.get("vocab") or {}
    problems = []
    freq = location.vocab_file("token_freq.parquet")
    if not same_counts(counts_from_table(read_table(storage, freq)), counted):
        problems.append(f"{freq}: the counts differ from a count of the train records")
    d2t, t2d = vocab_mapping(counted, sizes["draft_vocab_size"], sizes["target_vocab_size"])
    for name, expected in (("d2t.npy", d2t), ("t2d.npy", t2d)):
        key = location.vocab_file(name)
        found = np.load(io.BytesIO(storage.get_bytes(key)), allow_pickle=False)
        if found.dtype != expected.dtype or not np.array_equal(found, expected):
            problems.append(
                f"{key}: not the draft vocabulary of the train records' counts (draft {sizes['draft_vocab_size']} "
                f"of {sizes['target_vocab_size']} ids)"
            )
    return problems + specforge_problems(storage, location.specforge_mapping, {"d2t": d2t, "t2d": t2d})


def specforge_problems(storage: Storage, key: str, mapping: dict[str, np.ndarray]) -> list[str]:
    """vocab/specforge.pt (the hand-off writes it after the version verified; a trainer loads it instead of the
    .npy pair) against the mapping, read without torch: a copy left from another mapping (a version overwritten),
    damaged or not torch's is named."""
    if not storage.exists(key):
        return []
    try:
        tensors = read_tensors(storage.get_bytes(key))
    except ValueError as e:
        return [f"{key}: unreadable ({e})"]
    wrong = [
        name
        for name, expected in mapping.items()
        if (found := tensors.get(name)) is None or found.dtype != expected.dtype or not np.array_equal(found, expected)
    ]
    return [f"{key}: its {' and '.join(wrong)} are not the version's draft vocabulary"] if wrong else []
