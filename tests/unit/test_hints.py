"""An optimisation never fails a run: a hint (the send order and its length fit, another version's answer lengths,
endpoint affinity) that raises is turned off for the rest of its task, the plain path is taken, the data is the same,
and the run report says which hint failed and why."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from regen import pipeline, read_training_data
from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import GenerationReport
from regen.sglang import fleet
from regen.stages.generate import order
from regen.stages.generate.generate import GenerateSettings, run_generate
from tests.conftest import Simulator, each_shard, prepare_sample, raw_answers


class Broken(Exception):
    pass


def broken(*args: object, **kwargs: object) -> Any:
    raise Broken("a hint that raises")


class ExplodingSlack(float):
    """AFFINITY_SLACK as a value whose every use in the affinity rule raises."""

    def __rmul__(self, other: object) -> float:
        raise Broken("affinity rule broken")

    __mul__ = __rmul__


def test_a_failing_hint_gives_the_plain_value_stays_off_and_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    from regen.hints import ENDPOINT_AFFINITY, SEND_ORDER, Hint, Hints

    hints, calls = Hints(), []

    def fit(n: int) -> int:
        calls.append(n)
        raise ZeroDivisionError("no spread")

    with caplog.at_level(logging.WARNING, "regen.hints"):
        assert hints.use(SEND_ORDER, "plain", fit, 1) == "plain"
        assert hints.use(SEND_ORDER, "plain", fit, 2) == "plain"  # off for the rest of the task: not called again
    assert calls == [1] and hints.failed == {"send_order": "ZeroDivisionError: no spread"}
    assert len(caplog.records) == 1 and not hints.on(SEND_ORDER) and hints.on(ENDPOINT_AFFINITY)
    assert hints.use(ENDPOINT_AFFINITY, 0, lambda: 7) == 7  # another hint is still on
    [warning] = hints.warnings("B1")
    assert warning.startswith("B1: the send order (") and "failed (ZeroDivisionError: no spread)" in warning
    with pytest.raises(KeyError, match="declared"):  # a hint is declared once, in regen.hints
        hints.use(Hint("mine", "", ""), None, lambda: None)


def test_a_cancellation_is_never_swallowed_as_a_hint_failure() -> None:
    from regen.hints import SEND_ORDER, Hints

    def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        Hints().use(SEND_ORDER, None, cancelled)


def test_the_generation_reports_of_several_tries_keep_each_failed_hint() -> None:
    report = GenerationReport(0.0, 1.0, 1, 1, 1.0, 5)
    first = dataclasses.replace(report, hints_off={"send_order": "first"})
    second = dataclasses.replace(report, hints_off={"send_order": "second", "endpoint_affinity": "x"})
    combined = GenerationReport.combined([first, second, report])
    assert combined is not None and combined.hints_off == {"send_order": "first", "endpoint_affinity": "x"}
    assert GenerationReport.from_dict(dataclasses.asdict(combined)) == combined


def test_broken_endpoint_affinity_takes_the_least_busy_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet, "AFFINITY_SLACK", ExplodingSlack(1.25))

    async def acquire() -> tuple[list[str], dict[str, str]]:
        async with aiohttp.ClientSession() as session:
            pool = fleet.EndpointPool(["http://127.0.0.1:1", "http://127.0.0.1:2"], session)
            pool.endpoints[1].outstanding = 3
            taken = [(await pool.acquire(None, "http://127.0.0.1:2")).url for _ in range(2)]
            await pool.close()
            return taken, pool.hints.failed

    taken, failed = asyncio.run(acquire())
    assert taken == ["http://127.0.0.1:1", "http://127.0.0.1:1"]  # the least busy, as with no preference
    assert list(failed) == ["endpoint_affinity"]


def test_broken_affinity_never_fails_an_on_policy_shard_nor_changes_its_answers(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=4)
    answers = []
    for name in ("plain", "broken"):
        if name == "broken":
            monkeypatch.setattr(fleet, "AFFINITY_SLACK", ExplodingSlack(1.25))
        prepared, storage = prepare_sample(tmp_path / name, renderer, "C1_multiturn", shard_size=100)
        [shard] = [run_generate(s, storage, settings, renderer) for s in prepared.shards]
        answers.append({a["id"]: a["output_ids"] for a in raw_answers(storage, shard.raw_key)})
        assert shard.generation is not None
    assert answers[0] == answers[1] and len(answers[1]) > 24  # every turn answered, the same answers
    assert list(shard.generation.hints_off) == ["endpoint_affinity"]


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """40 rows with reference answers in one shard: 16 answers in, a fit re-ranks the rest."""
    source = tmp_path / "rows.jsonl"
    rows = [{"input": f"Question {i}?", "output": " ".join(["word"] * ((i * 37) % 60 + 1))} for i in range(40)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for root in ("plain", "broken"):
        config = {
            "defaults": {"storage_root": str(tmp_path / root), "shard_size": 40, "tokenize_workers": 1},
            "governance": {"allowed_endpoints": ["127.0.0.1"]},
            "datasets": {"B1": {"format": "input_output", "paths": [str(source)]}},
        }
        (tmp_path / f"{root}.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def run_stages(simulator: Simulator) -> dict[str, Any]:
    """plan -> prepare -> generate, validate, export -> verify -> publish -> report, as the DAG's tasks call them."""
    params = {"endpoints": [simulator.url], "skip_unchanged": False, "in_flight": 1}  # one request at a time
    run = pipeline.RunSpec(**pipeline.plan(params, "v1"))
    prepared = pipeline.finish_prepared(run, [pipeline.prepare_dataset(run, name) for name in run.datasets])
    for shard in each_shard(run, prepared):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    published = [pipeline.publish_dataset(run, p, [], pipeline.verify_dataset(run, p)) for p in prepared]
    return pipeline.report(run, published, [])


def training_records(report: dict[str, Any]) -> dict[str, Any]:
    [dataset] = report["datasets"]
    return {r["id"]: r for batch in read_training_data(dataset["manifest"]) for r in batch.to_pylist()}


def test_a_fit_that_raises_never_fails_the_run_nor_changes_what_is_published(
    deployment: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGEN_CONFIG", str(deployment / "plain.yaml"))
    plain = run_stages(simulator)
    monkeypatch.setenv("REGEN_CONFIG", str(deployment / "broken.yaml"))
    monkeypatch.setattr(order, "fitted_lengths", broken)
    report = run_stages(simulator)  # green: a failed hint is no failed task
    assert not plain["warnings"] and training_records(report) == training_records(plain) != {}
    [warning] = report["warnings"]
    assert warning.startswith("B1: the send order (") and "(Broken: a hint that raises)" in warning
    assert "the rest of the shard was sent in the order it had" in warning
    written = json.loads(Path(report["report"]).read_text())  # the run report on storage says it too
    assert written["warnings"] == report["warnings"]
    assert written["datasets"][0]["generation"][0]["hints_off"] == {"send_order": "Broken: a hint that raises"}
