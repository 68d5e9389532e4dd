"""Token frequencies and the draft vocabulary, counted as the records are written, never by reading them again.

Every EAGLE-3 trainer first counts the token ids its loss sees (those under `loss_mask == 1`: the target's answers)
and keeps the `draft_vocab_size` most frequent as the drafter's output vocabulary. Here export counts each shard's
train split as it builds it (`shard_counts`: one small file beside the shard's verdicts), publish sums them in one
array of the target vocabulary's size (163,840 ids: 1.3 MB of int64) and writes the version's `vocab/` files:

- `token_freq.parquet`: `token_id`, `count` (int64), every id seen, by id;
- `d2t.npy`: int64, `draft_vocab_size` entries, `target_id - draft_index` (the draft vocabulary in target id order);
- `t2d.npy`: bool, one per target id, whether the draft vocabulary holds it.

The mapping is vLLM speculators' `build_vocab_mappings_from_distribution` (0.9): the most frequent ids first, ties
by the lower id, padded with the lowest ids never seen when fewer were. tests/parity checks it against that code and
SpecForge's on published versions.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

COUNTS_SCHEMA = pa.schema([("token_id", pa.int64()), ("count", pa.int64())])
COVERAGE_SIZES = (1024, 2048, 4096, 8192, 16384, 32000, 65536)  # the report's curve, besides the profile's own size


def dense_counts(token_ids: Iterable[np.ndarray], size: int = 0) -> np.ndarray:
    """How often each id occurs over the arrays, as one int64 array of at least `size` entries (one bincount over
    them all: one per array zeroed a vocabulary-sized array each time, 15% of export)."""
    arrays = [np.asarray(ids) for ids in token_ids]
    every = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    return np.bincount(every.astype(np.int64, copy=False), minlength=size)


def add_counts(total: np.ndarray, more: np.ndarray) -> np.ndarray:
    """`total + more`, the shorter padded with zeros (in place when `total` is long enough)."""
    if len(more) > len(total):
        total = np.concatenate([total, np.zeros(len(more) - len(total), np.int64)])
    total[: len(more)] += more
    return total


def counts_under_mask(input_ids: pa.ChunkedArray | pa.Array, loss_mask: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The ids under `loss_mask == 1` of a split's records, counted: a trainer's own count, from the records."""
    ids = _flat(input_ids).astype(np.int64, copy=False)
    mask = _flat(loss_mask)
    return np.bincount(ids[mask == 1]) if len(ids) else np.zeros(0, np.int64)


def _flat(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [chunk.flatten().to_numpy(zero_copy_only=False) for chunk in chunks]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def counts_table(counts: np.ndarray) -> pa.Table:
    """The ids seen, by id, with their counts."""
    seen = np.flatnonzero(counts)
    return pa.table({"token_id": seen.astype(np.int64), "count": counts[seen]}, schema=COUNTS_SCHEMA)


def counts_from_table(table: pa.Table, size: int = 0) -> np.ndarray:
    ids = table.column("token_id").to_numpy()
    counts = np.zeros(max(size, int(ids.max()) + 1 if len(ids) else 0), np.int64)
    np.add.at(counts, ids, table.column("count").to_numpy())
    return counts


def parquet_bytes(table: pa.Table) -> bytes:
    """The table as Parquet, byte for byte the same for the same table (a retried publish writes what it wrote)."""
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def specforge_mapping(d2t: np.ndarray, t2d: np.ndarray) -> bytes:
    """The draft vocabulary as SpecForge's trainer loads it (`torch.load`): {"d2t": int64, "t2d": bool} tensors.
    Needs torch, which the pipeline itself does not install."""
    import torch

    out = io.BytesIO()
    torch.save({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)}, out)
    return out.getvalue()


def draft_vocabulary(counts: np.ndarray, draft_vocab_size: int) -> np.ndarray:
    """The draft vocabulary's target ids, ascending: the `draft_vocab_size` most frequent (ties by the lower id),
    then the lowest ids never seen while there are too few."""
    seen = np.flatnonzero(counts)
    by_frequency = seen[np.lexsort((seen, -counts[seen]))]  # lexsort: the last key sorts first
    chosen = by_frequency[:draft_vocab_size]
    if len(chosen) < draft_vocab_size:
        unseen = np.setdiff1d(np.arange(draft_vocab_size), chosen)  # enough: fewer than all of them are chosen
        chosen = np.concatenate([chosen, unseen[: draft_vocab_size - len(chosen)]])
    return np.sort(chosen)


def vocab_mapping(counts: np.ndarray, draft_vocab_size: int, target_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d): a draft index's offset to its target id, and which target ids the draft vocabulary holds."""
    if draft_vocab_size > target_vocab_size:
        raise ValueError(f"a draft vocabulary of {draft_vocab_size} ids from a target's {target_vocab_size}")
    if len(counts) > target_vocab_size:
        raise ValueError(f"id {len(counts) - 1} counted, outside the target vocabulary of {target_vocab_size}")
    target_ids = draft_vocabulary(counts, draft_vocab_size)
    d2t = (target_ids - np.arange(draft_vocab_size)).astype(np.int64)
    t2d = np.zeros(target_vocab_size, bool)
    t2d[target_ids] = True
    return d2t, t2d


def coverage(counts: np.ndarray, sizes: Iterable[int]) -> dict[int, float]:
    """The share of counted tokens the `size` most frequent ids hold, for each size (SpecForge prints it as the
    "top-N token frequency ratio")."""
    total = int(counts.sum())
    ranked = np.cumsum(np.sort(counts[counts > 0])[::-1])
    return {
        size: round(float(ranked[min(size, len(ranked)) - 1]) / total, 6) if total and size else 0.0 for size in sizes
    }
