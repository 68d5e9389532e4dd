"""A dataset's first version is sent longest first too, by lengths predicted before any answer exists: each row's
own reference answer (counted at prepare in the target's tokens, in every format and turn mode), or another target
model's version of the same dataset; the run report says which, and how well it ranked the answers (Spearman)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from regen import pipeline
from regen.chat import ChatRenderer
from regen.config import DatasetConfig
from regen.layout import DatasetLocation
from regen.profiles import lookup
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.stages.publish.length_prediction import spearman
from regen.storage import LocalStorage
from tests.conftest import Simulator, each_shard

ASK = {"role": "user", "content": "What is the capital of France, and why?"}
CASES = {  # format, turns, rows -> each prompt's reference answer as the target would spell it
    "openai_messages": (
        "final",
        [{"messages": [ASK, {"role": "assistant", "reasoning_content": "Think.", "content": "Paris, for long."}]}],
        ["Think.\nParis, for long."],
    ),
    "openai_messages-every-turn": (
        "every_assistant_turn",
        [{"messages": [ASK, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Why?"},
                       {"role": "assistant", "content": "It has been the seat of government for centuries."}]}],
        ["Paris.", "It has been the seat of government for centuries."],
    ),
    "sharegpt": (
        "final",
        [{"conversations": [{"from": "human", "value": "Name a prime."}, {"from": "gpt", "value": "Seven is one."}]}],
        ["Seven is one."],
    ),
    "input_output": ("final", [{"input": "Sum 2 and 2.", "output": "Four: two plus two."}], ["Four: two plus two."]),
    "alpaca": ("final", [{"instruction": "Sum 3 and 3.", "input": "", "output": "Six."}], ["Six."]),
    "glaive": (
        "final",
        [{"system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
          "chat": "USER: Tell me a joke.\n\n\nASSISTANT: Why did the chicken cross the road? <|endoftext|>\n"}],
        ["Why did the chicken cross the road?"],
    ),
    "prompt": ("final", [{"prompt": "Say hello."}], [None]),  # a prompt with no answer: none to predict from
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_each_prompts_reference_answer_is_counted_in_the_targets_tokens(
    case: str, tmp_path: Path, renderer: ChatRenderer
) -> None:
    turns, rows, references = CASES[case]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = DatasetConfig(format=case.split("-")[0], paths=[str(source)], turns=turns)  # type: ignore[arg-type]
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    settings = PrepareSettings(shard_size=10, workers=1, by_length=True)
    prepared = run_prepare(config, location, storage, renderer, settings)
    table = pq.read_table(tmp_path / "root" / prepared.shards[0].prompts_key)  # type: ignore[union-attr]
    counted = sorted(table.column("reference_tokens").to_pylist(), key=lambda n: -1 if n is None else n)
    expected = [None if r is None else len(renderer.tokenizer.encode(r, add_special_tokens=False)) for r in references]
    assert counted == sorted(expected, key=lambda n: -1 if n is None else n)
    assert table.column("expected_tokens").to_pylist() == table.column("reference_tokens").to_pylist()


def test_a_tool_call_answer_counts_its_name_and_arguments(tmp_path: Path, renderer: ChatRenderer) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    row = {"messages": [ASK, {"role": "assistant", "content": "", "tool_calls": [call]}], "tools": [tool]}
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(row) + "\n")
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    config = DatasetConfig(format="openai_messages", paths=[str(source)])
    prepared = run_prepare(config, location, storage, renderer, PrepareSettings(10, workers=1, by_length=True))
    [tokens] = pq.read_table(tmp_path / "root" / prepared.shards[0].prompts_key)["reference_tokens"].to_pylist()  # type: ignore[union-attr]
    name = len(renderer.tokenizer.encode("get_weather", add_special_tokens=False))
    assert tokens > name + 3  # the name and its arguments


def test_a_first_version_deals_its_longest_references_into_the_first_shards(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    rows = [{"input": f"Question {i}.", "output": " ".join(["word"] * ((i * 37) % 50 + 1))} for i in range(40)]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    config = DatasetConfig(format="input_output", paths=[str(source)])
    prepared = run_prepare(config, location, storage, renderer, PrepareSettings(10, workers=1, by_length=True))
    dealt = [pq.read_table(tmp_path / "root" / s.prompts_key)["expected_tokens"].to_pylist() for s in prepared.shards]  # type: ignore[union-attr]
    for earlier, later in itertools.pairwise(dealt):
        assert min(earlier) >= max(later)
    unordered = run_prepare(
        config, DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v2"), storage, renderer,
        PrepareSettings(10, workers=1),
    )  # fmt: skip
    plain = pq.read_table(tmp_path / "root" / unordered.shards[0].prompts_key)  # type: ignore[union-attr]
    assert plain["reference_tokens"].null_count == plain.num_rows  # longest first off: nothing counted


@pytest.mark.parametrize("part_prompts", [None, 3])
def test_on_policy_conversations_count_each_turns_reference_and_deal_the_longest_chain_first(
    tmp_path: Path, renderer: ChatRenderer, part_prompts: int | None
) -> None:
    """A conversation's turns wait on one another: its work is its turns' answers together. Prepared in one task or
    in parts, each turn's reference is counted, the row's is their sum, the longest chains go to the first shards (of
    each part), and a turn's expected length (what the run report ranks against its answer) is its own reference's."""
    from regen.records import ShardPrompts
    from regen.samples import turn_id

    def turn(i: int, k: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"Conversation {i}, question {k}."},
                {"role": "assistant", "content": " ".join(["step"] * ((i * 7 + k * 13) % 40 + 1))}]  # fmt: skip

    rows = [{"messages": [m for k in range(1 + i % 4) for m in turn(i, k)]} for i in range(12)]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    config = DatasetConfig(format="openai_messages", paths=[str(source)], turns="on_policy")
    settings = PrepareSettings(4, workers=1, by_length=True, part_prompts=part_prompts)
    prepared = pipeline_prepared(config, location, storage, renderer, settings)
    tables = [pq.read_table(tmp_path / "root" / s.prompts_key) for s in prepared]
    for table in tables:
        for row in table.to_pylist():
            conversation = rows[row["source_index"]]["messages"]
            answers = [m["content"] for m in conversation[1:] if m["role"] == "assistant"]
            assert row["turn_tokens"] == [len(renderer.tokenizer.encode(a, add_special_tokens=False)) for a in answers]
            assert row["reference_tokens"] == row["expected_tokens"] == sum(row["turn_tokens"])
            prompts = ShardPrompts(table)
            for k, tokens in enumerate(row["turn_tokens"], 1):
                assert prompts.expected_tokens(turn_id(row["id"], k)) == tokens
    dealt = [t["expected_tokens"].to_pylist() for t in tables]
    assert sum(map(len, dealt)) == len(rows)
    if part_prompts is None:
        for earlier, later in itertools.pairwise(dealt):
            assert min(earlier) >= max(later)


def pipeline_prepared(
    config: DatasetConfig,
    location: DatasetLocation,
    storage: LocalStorage,
    renderer: ChatRenderer,
    settings: PrepareSettings,
) -> list[Any]:
    """The shards of a dataset prepared in one task, or in parts (each part tokenized, then the parts finished)."""
    from regen.stages.prepare.parts import PreparedParts, finish_parts, prepare_part

    prepared = run_prepare(config, location, storage, renderer, settings)
    if isinstance(prepared, PreparedParts):
        for part in range(prepared.parts):
            prepare_part(config, location, storage, renderer, part, workers=1)
        prepared = finish_parts(config, location, storage)
    return list(prepared.shards)


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Rows with reference answers of many lengths, under the mini profile and a second one declared like it (another
    model)."""
    source = tmp_path / "rows.jsonl"
    rows = [{"input": f"Question {i}?", "output": " ".join(["word"] * ((i * 37) % 60 + 1))} for i in range(36)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    other = {**lookup("kimi-k2.5-mini").model_dump(mode="json", exclude={"name"}), "served_model_names": ["next"]}
    config = {
        "defaults": {"storage_root": str(tmp_path / "storage"), "shard_size": 10, "tokenize_workers": 1},
        "governance": {"allowed_endpoints": ["127.0.0.1"]},
        "profiles": {"next-model": other},
        "datasets": {"B1": {"format": "input_output", "paths": [str(source)]}},
    }
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    return tmp_path


def run_stages(run_id: str, simulator: Simulator, **params: Any) -> dict[str, Any]:
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "skip_unchanged": False, **params}, run_id))
    summaries = [pipeline.prepare_dataset(run, name) for name in run.datasets]
    for part in pipeline.dataset_parts(run, summaries):  # a dataset left in parts: a task a part
        pipeline.prepare_dataset_part(run, part)
    prepared = pipeline.finish_prepared(run, summaries)
    for shard in each_shard(run, prepared):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    published = [pipeline.publish_dataset(run, p, [], pipeline.verify_dataset(run, p)) for p in prepared]
    return pipeline.report(run, published, [])


def prompts_and_answers(manifest_uri: str) -> tuple[dict[str, int | None], dict[str, int]]:
    manifest = json.loads(Path(manifest_uri).read_text())
    root = Path(manifest["root"])
    expected: dict[str, int | None] = {}
    for shard in manifest["shards"]:
        table = pq.read_table(root / shard["prompts"], columns=["id", "expected_tokens"])
        expected |= dict(zip(table["id"].to_pylist(), table["expected_tokens"].to_pylist(), strict=True))
    answers: dict[str, int] = {}
    for key in (k for k in manifest["files"] if k.endswith("-verdicts.parquet")):
        table = pq.read_table(root / key, columns=["id", "output_len"])
        answers |= dict(zip(table["id"].to_pylist(), table["output_len"].to_pylist(), strict=True))
    return expected, answers


def test_the_first_version_is_ordered_by_its_references_and_the_report_ranks_them(
    deployment: Path, simulator: Simulator
) -> None:
    [published] = run_stages("v1", simulator)["datasets"]
    prediction = published["length_prediction"]
    expected, answers = prompts_and_answers(published["manifest"])
    pairs = [(expected[i], n) for i, n in answers.items() if expected.get(i) is not None]
    assert prediction["predictor"] == "reference_answers" and prediction["predicted"] == len(pairs) > 10
    ranks = pd.DataFrame(pairs).rank()  # Spearman: Pearson's r of the ranks (ties averaged), computed apart
    assert prediction["spearman"] == pytest.approx(float(np.corrcoef(ranks[0], ranks[1])[0, 1]), abs=1e-4)


def test_an_on_policy_first_version_is_ranked_turn_by_turn_against_each_turns_reference(
    deployment: Path, simulator: Simulator
) -> None:
    from regen.samples import sample_of, turn_of

    chats(deployment)
    [published] = run_stages("v1", simulator)["datasets"]
    prediction = published["length_prediction"]
    manifest = json.loads(Path(published["manifest"]).read_text())
    turn_tokens: dict[str, list[int]] = {}
    for shard in manifest["shards"]:
        table = pq.read_table(Path(manifest["root"]) / shard["prompts"], columns=["id", "turn_tokens"])
        turn_tokens |= dict(zip(table["id"].to_pylist(), table["turn_tokens"].to_pylist(), strict=True))
    _, answers = prompts_and_answers(published["manifest"])
    pairs = [(turn_tokens[sample_of(i)][turn_of(i) - 1], n) for i, n in answers.items()]  # type: ignore[operator]
    assert len(answers) == sum(1 + i % 3 for i in range(12))  # every turn answered, each ranked against its own
    assert prediction["predictor"] == "reference_answers" and prediction["predicted"] == len(pairs)
    ranks = pd.DataFrame(pairs).rank()
    assert prediction["spearman"] == pytest.approx(float(np.corrcoef(ranks[0], ranks[1])[0, 1]), abs=1e-4)


def chats(deployment: Path, **defaults: Any) -> list[dict[str, Any]]:
    """An on-policy dataset of 12 conversations of 1 to 3 turns, each turn's recorded answer of its own length."""
    rows = [
        {"messages": [m for k in range(1 + i % 3) for m in (
            {"role": "user", "content": f"Chat {i}, question {k}?"},
            {"role": "assistant", "content": " ".join(["word"] * ((i * 11 + k * 29) % 50 + 1))},
        )]}
        for i in range(12)
    ]  # fmt: skip
    (deployment / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = yaml.safe_load((deployment / "regen.yaml").read_text())
    config["datasets"] = {"chats": {"format": "openai_messages", "paths": ["chats.jsonl"], "turns": "on_policy"}}
    config["defaults"].update(defaults)
    (deployment / "regen.yaml").write_text(yaml.safe_dump(config))
    return rows


@pytest.mark.parametrize("in_parts", [False, True], ids=["whole", "in-parts"])
def test_a_second_on_policy_version_predicts_each_turn_by_the_last_versions_answer_to_it(
    deployment: Path, simulator: Simulator, in_parts: bool
) -> None:
    """A conversation's turn keeps its id from version to version: the next version expects each turn as long as
    the last version's answer to it (the conversation's work, their sum), deals and ranks by that, and the report
    names the last version as the predictor. Whole or read in parts (each part carries its prompts' lengths)."""
    from regen.samples import turn_id

    rows = chats(deployment, **({"prepare_part_prompts": 4, "shard_size": 4} if in_parts else {}))
    [first] = run_stages("v1", simulator)["datasets"]
    _, answered = prompts_and_answers(first["manifest"])
    assert len(answered) == sum(1 + i % 3 for i in range(12))
    [second] = run_stages("v2", simulator)["datasets"]
    assert second["length_prediction"]["predictor"] == "last_version"
    assert second["length_prediction"]["predicted"] == len(answered)
    manifest = json.loads(Path(second["manifest"]).read_text())
    seen = 0
    for shard in manifest["shards"]:
        table = pq.read_table(
            Path(manifest["root"]) / shard["prompts"], columns=["id", "turn_tokens", "expected_tokens"]
        )
        for row in table.to_pylist():
            turns = [answered[turn_id(row["id"], k)] for k in range(1, len(row["turn_tokens"]) + 1)]
            assert row["turn_tokens"] == turns and row["expected_tokens"] == sum(turns)
            seen += 1
    assert seen == len(rows)
    chains = [
        pq.read_table(Path(manifest["root"]) / s["prompts"])["expected_tokens"].to_pylist() for s in manifest["shards"]
    ]
    if not in_parts:  # dealt longest first by the last version's chains
        for earlier, later in itertools.pairwise(chains):
            assert min(earlier) >= max(later)


def test_another_models_version_predicts_a_first_version_under_a_new_profile(
    deployment: Path, simulator: Simulator
) -> None:
    [first] = run_stages("v1", simulator)["datasets"]
    [other] = run_stages("v1", simulator, profile="next-model")["datasets"]
    assert other["length_prediction"] | {"spearman": None, "predicted": None, "answers": None} == {
        "predictor": "another_profile",
        "profile": "kimi-k2.5-mini",
        "version": "v1",
        "spearman": None,
        "predicted": None,
        "answers": None,
    }
    _, answered_before = prompts_and_answers(first["manifest"])
    expected, _ = prompts_and_answers(other["manifest"])
    assert expected == {i: answered_before[i] for i in expected}  # each prompt's answer under the other model


def test_spearman_is_the_rank_correlation() -> None:
    assert spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1.0)
    assert spearman(np.array([1, 1, 2]), np.array([5, 6, 7])) == pytest.approx(0.8660254, abs=1e-6)
    assert spearman(np.array([1, 2]), np.array([1, 2])) is None and spearman(np.ones(5), np.arange(5)) is None


def shard_prompts(prompt_lengths: list[int], references: list[int | None]) -> Any:
    import pyarrow as pa

    from regen.records import ShardPrompts

    return ShardPrompts(
        pa.table(
            {
                "id": [f"s{i}" for i in range(len(prompt_lengths))],
                "prompt_ids": [list(range(n)) for n in prompt_lengths],
                "expected_tokens": pa.array(references, pa.int32()),
                "reference_tokens": pa.array(references, pa.int32()),
            }
        )
    )


def test_rows_without_a_reference_are_ordered_by_the_fit_of_the_answers_so_far() -> None:
    """No row has a reference (a prompt-only first version): the source order until 16 answers are in, then the
    rest by the fit of answer length on prompt length, longest first."""
    from regen.stages.generate.order import FIRST_FIT, LengthOrder

    lengths = [(i * 37) % 97 + 3 for i in range(80)]
    prompts = shard_prompts(lengths, [None] * 80)
    order = LengthOrder(prompts, list(prompts.ids))
    taken = []
    for sample_id in order:
        taken.append(sample_id)
        order.observe(sample_id, 5 * len(prompts.prompt_ids(sample_id)))  # the answer: five tokens a prompt token
    assert taken[:FIRST_FIT] == prompts.ids[:FIRST_FIT]  # nothing known yet: the source order
    rest = [len(prompts.prompt_ids(i)) for i in taken[FIRST_FIT:]]
    assert rest == sorted(rest, reverse=True)  # after the first fit: longest predicted first
    assert sorted(taken) == sorted(prompts.ids)  # each sample once


def write_verdicts(
    storage: LocalStorage,
    location: DatasetLocation,
    shard: int,
    prompt_lengths: list[int],
    expected: list[int | None] | None = None,
) -> None:
    """A validated shard's verdicts for the columns the fit reads: answers five tokens a prompt token, with the
    lengths prepare expected (none by default)."""
    import pyarrow as pa

    from regen.layout import VERDICTS_SUFFIX

    table = pa.table(
        {
            "prompt_len": pa.array(prompt_lengths, pa.int32()),
            "output_len": pa.array([5 * n for n in prompt_lengths], pa.int32()),
            "expected_tokens": pa.array(expected or [None] * len(prompt_lengths), pa.int32()),
        }
    )
    path = storage.root / "verdicts.parquet"
    pq.write_table(table, path)
    storage.put_file(f"{location.prefix}/reports/shard-{shard:05d}{VERDICTS_SUFFIX}", path)


def test_a_later_shard_is_ordered_by_the_earlier_shards_answers_from_its_first_request(tmp_path: Path) -> None:
    """The dataset's shards validated before this one (0 and 1; 3 is dealt after it) measured answers of five tokens
    a prompt token: this shard sends its longest predicted first from its first request, not the source order."""
    from regen.hints import Hints
    from regen.manifest import ShardManifest
    from regen.stages.generate.order import pooled_answers, shard_order

    storage = LocalStorage(tmp_path)
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    for number, lengths in ((0, [40, 3, 90, 12, 60]), (1, [7, 33, 81, 25]), (3, [1000] * 5)):
        write_verdicts(storage, location, number, lengths)
    this = ShardManifest(location, 2, location.shard(2).prompts, "", 80)
    pooled = pooled_answers(storage, this)
    assert sorted(round(float(np.expm1(p))) for p, _, _ in pooled) == sorted([40, 3, 90, 12, 60, 7, 33, 81, 25])
    assert all(r is None and y == pytest.approx(np.log1p(5 * np.expm1(p))) for p, r, y in pooled)

    prompts = shard_prompts([(i * 37) % 97 + 3 for i in range(80)], [None] * 80)
    hints = Hints()
    taken = [len(prompts.prompt_ids(i)) for i in shard_order(prompts, list(prompts.ids), hints, None, storage, this)]
    assert taken == sorted(taken, reverse=True) and hints.failed == {}  # longest first from the first request


def test_a_shard_s_fit_starts_from_the_last_eight_shards_dealt_before_it_and_their_latest_4096_answers(
    tmp_path: Path,
) -> None:
    """Ten shards validated before shard 10, one answer each with its reference (one of -1: counted as 0): the pool
    is the last eight's, never its own. After a shard of 4,100 answers, the latest 4,096 of the last eight shards'."""
    from regen.manifest import ShardManifest
    from regen.stages.generate.order import pooled_answers

    storage = LocalStorage(tmp_path)
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    for number in range(10):
        write_verdicts(storage, location, number, [number + 1], [-1 if number == 9 else 10 * number])
    write_verdicts(storage, location, 10, [500])  # its own, validated by a try before a reopen: not another shard's
    this = ShardManifest(location, 10, location.shard(10).prompts, "", 1)
    pooled = pooled_answers(storage, this)
    assert [(round(np.expm1(p)), round(np.expm1(r)), round(np.expm1(y))) for p, r, y in pooled] == [
        (n + 1, 0 if n == 9 else 10 * n, 5 * (n + 1)) for n in range(2, 10)
    ]
    write_verdicts(storage, location, 11, list(range(1, 4101)))
    later = ShardManifest(location, 12, location.shard(12).prompts, "", 1)
    pooled = pooled_answers(storage, later)
    assert [round(np.expm1(p)) for p, _, _ in pooled] == list(range(5, 4101))  # shards 3-9's 7 and 4 more dropped


def test_a_shared_fit_that_cannot_be_read_leaves_the_shard_its_own_fit_and_one_for_a_second_version_is_not_read(
    tmp_path: Path,
) -> None:
    from regen.hints import Hints
    from regen.manifest import ShardManifest
    from regen.stages.generate.order import FIRST_FIT, shard_order

    class Unlistable(LocalStorage):
        listed = 0

        def list_keys(self, prefix: str) -> list[str]:
            self.listed += 1
            raise ConnectionError("storage is down")

    storage = Unlistable(tmp_path)
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    this = ShardManifest(location, 2, location.shard(2).prompts, "", 80)
    prompts = shard_prompts([(i * 37) % 97 + 3 for i in range(80)], [None] * 80)
    hints = Hints()
    order = shard_order(prompts, list(prompts.ids), hints, None, storage, this)
    assert [next(order) for _ in range(FIRST_FIT)] == prompts.ids[:FIRST_FIT]  # the source order, as with no pool
    assert list(hints.failed) == ["shared_fit"] and storage.listed == 1

    import pyarrow as pa

    from regen.records import ShardPrompts

    second = ShardPrompts(
        pa.table({
            "id": ["a", "b", "c"], "prompt_ids": [[1], [1, 2], [1, 2, 3]],
            "expected_tokens": pa.array([300, 100, 200], pa.int32()),  # the last version's answers
            "reference_tokens": pa.array([10, 20, 30], pa.int32()),
        })
    )  # fmt: skip
    assert list(shard_order(second, ["a", "b", "c"], Hints(), None, storage, this)) == ["a", "c", "b"]
    assert storage.listed == 1  # its last version's lengths are exact: the pool is not read


def test_the_fit_places_rows_without_a_reference_among_those_with_one() -> None:
    """Half the rows carry a reference; answers are twice the reference, or five times the prompt: once fitted, a
    row with no reference is sent where its predicted length falls among the others."""
    from regen.stages.generate.order import FIRST_FIT, LengthOrder

    lengths = [(i * 37) % 97 + 3 for i in range(80)]
    references = [5 * n // 2 if i % 2 else None for i, n in enumerate(lengths)]  # answer = 2 x reference = 5 x prompt
    prompts = shard_prompts(lengths, references)
    order = LengthOrder(prompts, list(prompts.ids))
    taken = []
    for sample_id in order:
        taken.append(sample_id)
        order.observe(sample_id, 5 * len(prompts.prompt_ids(sample_id)))
    answers = [5 * len(prompts.prompt_ids(i)) for i in taken[2 * FIRST_FIT :]]
    assert answers == sorted(answers, reverse=True)  # both kinds of row in one longest-first order


def test_the_prediction_is_read_from_the_verdicts_and_shards_validated_before_count_none(tmp_path: Path) -> None:
    """Publish reads each answer's expected length from its shard's verdicts, where validate copied it from
    prompts/ (never prompts/ again); a shard validated before that column existed has none."""
    import pyarrow as pa

    from regen.manifest import ShardManifest
    from regen.stages.publish.dataset_report import read_verdicts
    from regen.stages.publish.length_prediction import length_prediction

    storage = LocalStorage(tmp_path)
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "d", "v1")
    shards = [ShardManifest(location, n, location.shard(n).prompts, "", 4) for n in (0, 1)]
    old = pa.table({"id": ["a", "b"], "output_len": pa.array([5, 9], pa.int32())})
    new = old.append_column("expected_tokens", pa.array([3, None], pa.int32()))
    new = new.set_column(0, "id", pa.array(["c", "d"]))
    for shard, table in zip(shards, (old, new), strict=True):
        path = tmp_path / shard.keys.verdicts
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    verdicts = read_verdicts(storage, shards)
    assert verdicts.column("expected_tokens").to_pylist() == [None, None, 3, None]
    found = length_prediction(verdicts, {"predictor": "reference_answers"})
    assert (found["answers"], found["predicted"], found["spearman"]) == (4, 1, None)
