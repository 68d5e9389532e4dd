"""The order a shard's samples are sent in: the longest answers of the dataset's last version first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import ShardManifest
from regen.records import ShardPrompts
from regen.sglang.client import answer_id_of
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.stages.generate.order import LengthOrder, fitted_lengths
from regen.storage import LocalStorage
from tests.conftest import Simulator, prepare_sample, raw_answers


def shard(expected: list[int | None] | None) -> ShardPrompts:
    columns = {"id": [f"s{i}" for i in range(5)], "prompt_ids": [[1, 2]] * 5}
    if expected is not None:
        columns["expected_tokens"] = expected
    return ShardPrompts(pa.table(columns))


def test_the_longest_go_first_and_an_unknown_one_where_the_median_would() -> None:
    prompts = shard([10, None, 300, 40, 300])
    # known: 10, 40, 300, 300 -> median 300 (the upper middle): s1 is taken as a 300, and equals keep their order
    assert prompts.longest_expected_first(["s0", "s1", "s2", "s3", "s4"]) == ["s1", "s2", "s4", "s3", "s0"]
    assert prompts.longest_expected_first(["s3", "s0"]) == ["s3", "s0"]  # a resumed shard: what is left, in order


def test_a_first_version_keeps_the_shards_order() -> None:
    todo = ["s4", "s0", "s2"]
    assert shard(None).longest_expected_first(todo) == todo  # prompts prepared before the column existed
    assert shard([None] * 5).longest_expected_first(todo) == todo


def test_references_capped_alike_never_fail_the_shard_and_every_sample_is_answered(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """Issue 54's reproduction: the 15 longest references capped at 4,096 tokens and one at 4,095 whose answer was
    the longest of them. Least squares put a slope of thousands on that 2e-4 spread of log(reference), and the next
    shorter reference's prediction overflowed (OverflowError inside a worker: the shard failed, its requests
    cancelled). The fit now shrinks a slope the data hardly supports and clips what it predicts."""
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=1)  # 16 answers, then a fit
    plain, plain_storage = prepare_sample(tmp_path / "plain", renderer, "B2_opencodeinstruct", 100)
    lengths = answer_lengths(plain_storage, run_generate(plain.shards[0], plain_storage, settings))
    prepared, storage = prepare_sample(tmp_path / "capped", renderer, "B2_opencodeinstruct", 100)
    shard = prepared.shards[0]
    path = tmp_path / "capped" / shard.prompts_key
    table = pq.read_table(path)
    ids = table.column("id").to_pylist()
    capped = sorted(ids, key=lambda i: lengths[i])[-16:]  # sent first; the longest answer of them is the 4,095's
    references = [4096 if i in capped[:-1] else 4095 if i == capped[-1] else 20 + 7 * n for n, i in enumerate(ids)]
    for name in ("expected_tokens", "reference_tokens"):
        table = table.set_column(table.column_names.index(name), name, pa.array(references, pa.int32()))
    pq.write_table(table, path)

    generated = run_generate(shard, storage, settings)
    assert generated.stats["generate"].kept == len(ids) == 48  # finished: every sample answered
    assert answer_lengths(storage, generated) == lengths  # the same answers: the order never changes the data
    assert generated.generation is not None and generated.generation.hints_off == {}  # the fit copes: no fallback
    sent = [answer_id_of(record["rid"]) for record in simulator.records()][-len(ids) :]
    assert set(sent[:16]) == set(capped)


def answer_lengths(storage: LocalStorage, shard: ShardManifest) -> dict[str, int]:
    return {a["id"]: len(a["output_ids"]) for a in raw_answers(storage, shard.raw_key)}


HUGE = 2**31 - 1  # an int32 column's largest
TOKENS = st.sampled_from([0, 1, HUGE]) | st.integers(0, HUGE)
CAPPED = st.sampled_from([4095, 4096]) | st.integers(0, 4096)  # references cut at 4,096 tokens: many there or next to


@st.composite
def rows(draw: st.DrawFn) -> tuple[list[int], list[int | None], list[int | None], list[int]]:
    """A shard's prompt lengths, expected and reference answer lengths, and its answers' lengths: drawn, constant,
    zero, capped, huge, or collinear with the reference or the prompt. Mostly more than 16 rows: a fit is made."""
    n = draw(st.integers(17, 48) | st.integers(1, 16))

    def column(values: st.SearchStrategy[Any]) -> list[Any]:
        return [draw(values)] * n if draw(st.booleans()) else draw(st.lists(values, min_size=n, max_size=n))

    def some(values: list[int]) -> list[int | None]:
        present = [True] * n if draw(st.booleans()) else column(st.booleans())
        return [value if there else None for value, there in zip(values, present, strict=True)]

    prompt_lengths = column(st.integers(0, 40))
    references = some(column(draw(st.sampled_from([CAPPED, TOKENS]))))
    expected = references if draw(st.booleans()) else some(column(TOKENS))  # the last version's, where it had one
    factor = draw(st.sampled_from([1, 2, 1000]))
    answers = draw(
        st.sampled_from(
            [
                column(TOKENS),
                [min(HUGE, factor * (r or 0)) for r in references],
                [min(HUGE, factor * p) for p in prompt_lengths],
            ]
        )
    )
    return prompt_lengths, expected, references, answers


@given(rows())
@settings(max_examples=300, deadline=None)
def test_the_order_never_raises_and_sends_every_sample_once(
    drawn: tuple[list[int], list[int | None], list[int | None], list[int]],
) -> None:
    prompt_lengths, expected, references, answers = drawn
    prompts = ShardPrompts(
        pa.table(
            {
                "id": [f"s{i}" for i in range(len(prompt_lengths))],
                "prompt_ids": pa.array([list(range(n)) for n in prompt_lengths], pa.list_(pa.int32())),
                "expected_tokens": pa.array(expected, pa.int32()),
                "reference_tokens": pa.array(references, pa.int32()),
            }
        )
    )
    order = LengthOrder(prompts, list(prompts.ids))
    taken = []
    for sample_id in order:
        taken.append(sample_id)
        order.observe(sample_id, answers[prompts.row(sample_id)])
        predicted = fitted_lengths(prompts, order.seen, order.pending)
        assert predicted is None or len(predicted) == len(order.pending)
        assert predicted is None or all(n is None or 0 <= n <= HUGE for n in predicted)
    assert sorted(taken) == sorted(prompts.ids)  # a permutation of the pending: each sample sent once


def test_an_on_policy_shard_sends_the_longest_chain_of_answers_first_and_in_the_shards_order_when_that_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from regen.hints import Hints
    from regen.samples import turn_id
    from regen.stages.generate import order

    def prompts(turn_tokens: list[list[int | None]] | None) -> ShardPrompts:
        columns: dict[str, Any] = {"id": ["a", "b", "c", "d"], "prompt_ids": [[1, 2]] * 4, "later": ["[]"] * 4}
        return ShardPrompts(pa.table({**columns, **({"turn_tokens": turn_tokens} if turn_tokens else {})}))

    todo = [turn_id(*t) for t in [("a", 2), ("b", 1), ("b", 2), ("b", 3), ("c", 1), ("a", 3), ("d", 1)]]
    # No references (prompts prepared before they were counted): the most unfinished turns first, then the shard's.
    assert order.conversation_order(prompts(None), todo, Hints()) == ["b", "a", "c", "d"]
    # Each unfinished turn's reference, summed, a turn without one counted as the median of the unfinished turns'
    # (5, 5, 5, 40, 100, 900 -> 40); a's finished first turn (3,000) left out: a 900 + 40, d 100, c 40, b 3 x 5.
    chains = prompts([[3000, 900, None], [5, 5, 5], [40], [100]])
    assert order.conversation_order(chains, todo, Hints()) == ["a", "d", "c", "b"]
    monkeypatch.setattr(order, "longest_first", lambda *_: 1 / 0)
    hints = Hints()
    assert order.conversation_order(chains, todo, hints) == ["a", "b", "c", "d"]
    assert list(hints.failed) == ["send_order"]


def prompts_of(prompt_lengths: list[int], references: list[int | None], expected: list[int | None]) -> ShardPrompts:
    return ShardPrompts(
        pa.table(
            {
                "id": [f"s{i}" for i in range(len(prompt_lengths))],
                "prompt_ids": pa.array([list(range(n)) for n in prompt_lengths], pa.list_(pa.int32())),
                "expected_tokens": pa.array(expected, pa.int32()),
                "reference_tokens": pa.array(references, pa.int32()),
            }
        )
    )


def test_the_fit_is_the_ridge_solution_from_eight_answers_of_more_than_one_length() -> None:
    """The closed form, exactly: slope = sum(c * (y - mean y)) / (sum(c^2) + RIDGE * n) over centred features c."""
    import numpy as np

    from regen.stages.generate.order import FIRST_FIT, RIDGE, Fit, _least_squares

    x = [float(v) for v in range(FIRST_FIT // 2)]
    y = [3.0 * v + 5.0 for v in x]
    fit = _least_squares([[v] for v in x], y)
    assert fit is not None
    c = np.asarray(x) - np.mean(x)
    expected = float(c @ (np.asarray(y) - np.mean(y))) / (float(c @ c) + RIDGE * len(y))
    assert abs(float(fit.slopes[0]) - expected) < 1e-12 and fit.mean_y == np.mean(y)
    assert float(fit.slopes[0]) < 3.0  # shrunk, never past the least-squares slope
    assert _least_squares([[v] for v in x[:-1]], y[:-1]) is None  # seven answers: no fit yet
    assert _least_squares([[v] for v in x], [7.0] * len(x)) is None  # one length: nothing to fit
    two = _least_squares([[v, 1.0] for v in x], y)  # a feature that never varies gets no slope, not a division by 0
    assert two is not None and float(two.slopes[1]) == 0.0 and abs(float(two.slopes[0]) - expected) < 1e-12
    # A prediction is clipped to [0, max_tokens]: an int32 column's largest when the sampling sets no limit
    huge = Fit(np.zeros(1), 1e6, np.zeros(1))
    assert huge.predict([0.0], 4096) == 4096 and huge.predict([0.0], HUGE) >= HUGE - 1
    assert Fit(np.zeros(1), -50.0, np.zeros(1)).predict([0.0], 4096) == 0
    assert LengthOrder(prompts_of([1], [1], [1]), ["s0"]).max_tokens == HUGE
    from regen.stages.generate.order import _features

    assert _features(prompts_of([4, 4], [0, 9], [0, 9]), "s0") == (np.log1p(4), 0.0)  # an empty reference: 0 tokens


def test_fitted_lengths_keep_the_last_versions_exact_lengths_and_fit_by_reference_where_there_is_one() -> None:
    """The answers are twice their references: a pending sample with a reference is predicted near twice it; one
    whose last version's length differs from its reference keeps that length exactly; one whose last version's length
    is its reference (a first version's expected length is the reference) gets the fit."""
    n = 20
    references = [300 + 37 * i for i in range(n)] + [400, 900, 1000]
    expected: list[int | None] = [*references[:n], 400, 5000, 1000]  # s21: the last version gave 5,000
    prompts = prompts_of([5 + i % 3 for i in range(n + 3)], references, expected)
    seen = [(f"s{i}", 2 * references[i]) for i in range(n)]
    assert fitted_lengths(prompts, seen[:3], ["s20"]) is None  # too few answers: no fit, no prediction
    predicted = fitted_lengths(prompts, seen, ["s20", "s21", "s22"])
    assert predicted is not None
    by_reference, kept, fitted = predicted
    assert kept == 5000
    assert by_reference is not None and fitted is not None
    assert 700 < by_reference < 900 and 1800 < fitted < 2200  # about twice 400 and 1,000, not the 1,000 itself


def test_a_refit_that_would_not_permute_the_pending_leaves_them_and_turns_the_order_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from regen.stages.generate import order as order_module

    for broken in (lambda n: [0] * len(n), lambda n: [len(n) - 1] * len(n)):  # sorts below and above a permutation
        prompts = prompts_of([3] * 40, [10 * (i + 1) for i in range(40)], [None] * 40)
        order = LengthOrder(prompts, list(prompts.ids))
        monkeypatch.setattr(order_module, "longest_first_order", broken)
        taken = [next(order) for _ in range(16)]
        pending = list(order.pending)
        for sample_id in taken:
            order.observe(sample_id, 7 * prompts.reference_tokens(sample_id))  # the 16th answer refits
        assert order.pending == pending and "send_order" in order.hints.failed


def test_the_fit_is_made_again_each_time_the_answers_double_past_256(monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = prompts_of([3] * 600, [i + 1 for i in range(600)], [None] * 600)
    order = LengthOrder(prompts, list(prompts.ids))
    fits: list[int] = []
    monkeypatch.setattr(LengthOrder, "refit", lambda self: fits.append(len(self.seen)))
    for sample_id in list(order)[:600]:
        order.observe(sample_id, 2 * prompts.reference_tokens(sample_id))
    assert fits == [16, 32, 64, 128, 256, 512]


def test_an_answer_seen_and_one_pooled_from_another_shard_are_one_observation_each_empty_ones_too() -> None:
    """The fit takes this shard's answers as it takes other shards' verdicts: log1p of the prompt's, the
    reference's and the answer's lengths, an empty answer as 0 tokens; so moving answers between the two changes no
    prediction."""
    import numpy as np

    n = 12
    references = [50 * (i + 1) for i in range(n)] + [700, None]
    prompts = prompts_of([3 + i for i in range(n + 2)], references, references)
    seen = [(f"s{i}", 0 if i % 4 == 0 else 3 * references[i]) for i in range(n)]
    pooled = [
        (float(np.log1p(3 + i)), float(np.log1p(references[i])), float(np.log1p(y))) for i, (_, y) in enumerate(seen)
    ]
    pending = ["s12", "s13"]
    alone = fitted_lengths(prompts, seen, pending)
    assert alone is not None and alone == fitted_lengths(prompts, [], pending, pooled=pooled)
    assert alone == fitted_lengths(prompts, seen[:6], pending, pooled=pooled[6:])
