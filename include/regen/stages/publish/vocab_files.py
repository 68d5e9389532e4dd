"""A version's vocab/ files, made at publish from its shards' token counts (regen.vocab): summed one shard at a time
into one array of the target vocabulary, then the draft vocabulary mapped from them. Their bytes are a function of
the counts alone, so a retried publish makes the same files, and a published version's are compared, not rewritten.
"""

from __future__ import annotations

import hashlib
import io
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from regen.layout import DatasetLocation
from regen.manifest import ShardManifest
from regen.storage import Storage, get_json, open_storage, read_table
from regen.vocab import (
    COVERAGE_SIZES,
    add_counts,
    counts_from_table,
    counts_table,
    counts_under_mask,
    coverage,
    npy_bytes,
    parquet_bytes,
    specforge_mapping,
    vocab_mapping,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VocabSizes:
    """The draft vocabulary's size, and the target's (the model's, which t2d spans), with where it was read."""

    draft: int
    target: int
    target_from: str  # profile, server or tokenizer

    @classmethod
    def of(cls, draft: int, declared: int | None, served: list[int | None], tokenizer: int) -> VocabSizes:
        """The profile's declared vocabulary, else the fleet's (check_server read it), else the tokenizer's ids.
        t2d spans the model's vocabulary, never widened to a tokenizer's that holds more ids (added tokens the model
        has no row for): a trainer indexes the model's logits with it. An answer id outside it fails the mapping."""
        known = {size for size in served if size is not None}
        target, source = (
            (declared, "profile")
            if declared
            else (known.pop(), "server")
            if len(known) == 1
            else (tokenizer, "tokenizer")
        )
        return cls(min(draft, target), target, source)


def shard_counts(storage: Storage, shard: ShardManifest) -> np.ndarray:
    """The shard's train counts as export wrote them; a shard exported before counts were kept is counted from its
    train split."""
    key = shard.keys.token_counts
    if key in shard.files:
        return counts_from_table(read_table(storage, key))
    assert shard.train_key is not None, f"{shard.name} is finished, so exported"
    table = read_table(storage, shard.train_key, ["input_ids", "loss_mask"])
    return counts_under_mask(table.column("input_ids"), table.column("loss_mask"))


def version_vocab(
    storage: Storage, location: DatasetLocation, shards: list[ShardManifest], sizes: VocabSizes
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The vocab/ files (key -> bytes) and what the manifest records of them."""
    counts = np.zeros(sizes.target, np.int64)
    for shard in shards:
        counts = add_counts(counts, shard_counts(storage, shard))
    d2t, t2d = vocab_mapping(counts, sizes.draft, sizes.target)
    files = {
        location.vocab_file("token_freq.parquet"): parquet_bytes(counts_table(counts)),
        location.vocab_file("d2t.npy"): npy_bytes(d2t),
        location.vocab_file("t2d.npy"): npy_bytes(t2d),
    }
    summary = {
        "draft_vocab_size": sizes.draft,
        "target_vocab_size": sizes.target,
        "target_vocab_from": sizes.target_from,
        "tokens": int(counts.sum()),
        "distinct_ids": int(np.count_nonzero(counts)),
        "coverage": coverage(counts, [sizes.draft])[sizes.draft],
        "coverage_curve": {str(n): share for n, share in coverage(counts, _curve(sizes)).items()},
    }
    return files, summary


def _curve(sizes: VocabSizes) -> list[int]:
    return sorted({n for n in COVERAGE_SIZES if n < sizes.target} | {sizes.draft})


def write_specforge_mapping(manifest_uri: str, s3_client: Any = None) -> str | None:
    """vocab/specforge.pt beside a verified version's .npy pair, for SpecForge's trainer: its URI, or None when the
    version has no vocab/ or this process has no torch."""
    folder = manifest_uri.rsplit("/", 1)[0]
    here = open_storage(folder, s3_client)
    listed = {key.split("/", 3)[-1] for key in get_json(here, "manifest.json")["files"]}  # relative to the version
    if not {"vocab/d2t.npy", "vocab/t2d.npy"} <= listed:
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        log.info("no torch here: vocab/specforge.pt is not written (docs/data.md converts the .npy pair in one line)")
        return None
    d2t, t2d = (np.load(io.BytesIO(here.get_bytes(f"vocab/{n}")), allow_pickle=False) for n in ("d2t.npy", "t2d.npy"))
    here.put_bytes("vocab/specforge.pt", specforge_mapping(d2t, t2d))
    return here.uri("vocab/specforge.pt")


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {key: hashlib.sha256(body).hexdigest() for key, body in files.items()}
