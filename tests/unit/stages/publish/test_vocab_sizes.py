"""The draft vocabulary's sizes: t2d spans the model's vocabulary, whichever of the profile, the fleet and the
tokenizer says what it is, and is never widened to a tokenizer that holds more ids than the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from regen.layout import DatasetLocation
from regen.stages.publish.vocab_files import VocabSizes, version_vocab
from regen.storage import LocalStorage
from regen.vocab import (
    add_counts,
    counts_from_table,
    counts_table,
    counts_under_mask,
    coverage,
    dense_counts,
    vocab_mapping,
)


def test_the_profiles_vocabulary_wins_and_a_larger_tokenizer_does_not_widen_it() -> None:
    assert VocabSizes.of(32_000, 163_840, [163_840], 163_842) == VocabSizes(32_000, 163_840, "profile")
    assert VocabSizes.of(32_000, None, [1_000, None], 1_200) == VocabSizes(1_000, 1_000, "server")
    assert VocabSizes.of(32_000, None, [1_000, 2_000], 1_200) == VocabSizes(1_200, 1_200, "tokenizer")
    assert VocabSizes.of(500, 1_000, [], 800) == VocabSizes(500, 1_000, "profile")  # a smaller tokenizer: the model's


def test_an_answer_id_outside_the_models_vocabulary_fails_the_mapping() -> None:
    sizes = VocabSizes.of(4, 1_000, [], 1_200)
    counts = dense_counts([np.array([3, 3, 1_101])])  # as export counts: up to the highest id seen
    with pytest.raises(ValueError, match=r"^id 1101 counted, outside the target vocabulary of 1000$"):
        vocab_mapping(counts, sizes.draft, sizes.target)


def test_counts_of_different_lengths_add_up_to_the_longer() -> None:
    """The shards' counts are as long as each one's highest id: their sum is exactly as long as the longest."""
    assert add_counts(np.array([1, 2], np.int64), np.array([1, 1, 1, 4], np.int64)).tolist() == [2, 3, 1, 4]
    assert add_counts(np.array([1, 2, 0, 5], np.int64), np.array([1], np.int64)).tolist() == [2, 2, 0, 5]
    assert add_counts(np.zeros(0, np.int64), np.array([0, 7], np.int64)).tolist() == [0, 7]


def test_with_no_declared_or_served_size_the_tokenizer_says() -> None:
    assert VocabSizes.of(32_000, None, [], 1_200) == VocabSizes(1_200, 1_200, "tokenizer")
    assert VocabSizes.of(32_000, None, [None], 1_200) == VocabSizes(1_200, 1_200, "tokenizer")


def test_the_coverage_curve_is_the_sizes_below_the_target_and_the_drafts_own(tmp_path: Path) -> None:
    """The manifest's coverage_curve: every COVERAGE_SIZES entry smaller than the model's vocabulary, and the draft
    vocabulary's size (one not among them), each the share of tokens that many ids hold."""
    storage = LocalStorage(tmp_path)
    location = DatasetLocation(storage.root_uri, "p", "d", "v1")
    sizes = VocabSizes.of(3_000, 9_000, [], 9_000)
    _, summary = version_vocab(storage, location, [], sizes)
    assert list(summary["coverage_curve"]) == ["1024", "2048", "3000", "4096", "8192"]
    assert summary["draft_vocab_size"] == 3_000 and summary["target_vocab_size"] == 9_000
    _, summary = version_vocab(storage, location, [], VocabSizes.of(4_096, 9_000, [], 9_000))  # a draft among them
    assert list(summary["coverage_curve"]) == ["1024", "2048", "4096", "8192"]
    _, summary = version_vocab(storage, location, [], VocabSizes.of(2_000, 8_192, [], 8_192))  # a target among them
    assert list(summary["coverage_curve"]) == ["1024", "2000", "2048", "4096"]
    _, summary = version_vocab(storage, location, [], VocabSizes.of(32_000, 163_840, [], 163_840))  # Kimi's (data.md)
    assert list(summary["coverage_curve"]) == ["1024", "2048", "4096", "8192", "16384", "32000", "65536"]


def test_a_counts_file_reads_back_as_long_as_its_highest_id() -> None:
    """A file keeps the ids seen; read back, the counts end at the highest (one longer would name an id past the
    target's vocabulary when the highest is its last), or are empty, or as long as asked."""
    counts = np.array([0, 2, 0, 1], np.int64)
    assert counts_from_table(counts_table(counts)).tolist() == [0, 2, 0, 1]
    assert counts_from_table(counts_table(np.zeros(0, np.int64))).tolist() == []
    assert counts_from_table(counts_table(counts), size=6).tolist() == [0, 2, 0, 1, 0, 0]


def test_a_draft_vocabulary_as_large_as_the_targets_is_the_whole_vocabulary() -> None:
    d2t, t2d = vocab_mapping(np.array([0, 5, 0, 2], np.int64), 4, 4)
    assert d2t.tolist() == [0, 0, 0, 0] and t2d.tolist() == [True] * 4
    with pytest.raises(ValueError, match="a draft vocabulary of 5 ids from a target's 4"):
        vocab_mapping(np.array([0, 5], np.int64), 5, 4)


def test_nothing_counted_covers_nothing() -> None:
    """A version with no train tokens (every record truncated or held out) has a curve of zeros, not of ones."""
    assert coverage(np.zeros(8, np.int64), [1, 1024]) == {1: 0.0, 1024: 0.0}
    assert coverage(np.array([3, 1], np.int64), [0, 1, 2, 9]) == {0: 0.0, 1: 0.75, 2: 1.0, 9: 1.0}
    assert dense_counts([]).tolist() == []


def test_a_split_of_no_records_counts_nothing() -> None:
    nothing = pa.chunked_array([], type=pa.list_(pa.int64()))
    assert counts_under_mask(nothing, nothing).tolist() == []
    assert counts_under_mask(pa.array([[]], pa.list_(pa.int64())), pa.array([[]], pa.list_(pa.int8()))).tolist() == []
