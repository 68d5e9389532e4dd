"""The draft vocabulary's sizes: t2d spans the model's vocabulary, whichever of the profile, the fleet and the
tokenizer says what it is, and is never widened to a tokenizer that holds more ids than the model."""

from __future__ import annotations

import numpy as np
import pytest

from regen.stages.publish.vocab_files import VocabSizes
from regen.vocab import dense_counts, vocab_mapping


def test_the_profiles_vocabulary_wins_and_a_larger_tokenizer_does_not_widen_it() -> None:
    assert VocabSizes.of(32_000, 163_840, [163_840], 163_842) == VocabSizes(32_000, 163_840, "profile")
    assert VocabSizes.of(32_000, None, [1_000, None], 1_200) == VocabSizes(1_000, 1_000, "server")
    assert VocabSizes.of(32_000, None, [1_000, 2_000], 1_200) == VocabSizes(1_200, 1_200, "tokenizer")
    assert VocabSizes.of(500, 1_000, [], 800) == VocabSizes(500, 1_000, "profile")  # a smaller tokenizer: the model's


def test_an_answer_id_outside_the_models_vocabulary_fails_the_mapping() -> None:
    sizes = VocabSizes.of(4, 1_000, [], 1_200)
    counts = dense_counts([np.array([3, 3, 1_100])], size=1_200)
    with pytest.raises(ValueError, match="outside the target vocabulary of 1000"):
        vocab_mapping(counts, sizes.draft, sizes.target)
