"""A nightly run regenerates only what changed: a dataset whose sources, profile, template and sampling equal those
of its last published version is skipped. Runs the library's stages exactly as the DAG's tasks call them."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from regen import pipeline, read_training_data
from regen.config import ConfigError, DatasetConfig
from regen.errors import FinalError
from regen.layout import latest_key
from regen.sglang.client import answer_id_of
from regen.stages.prepare.sources import source_digests
from regen.verify import VerificationFailed, verify_published
from regen.version_inputs import dataset_inputs
from tests.conftest import ROOT, Simulator, each_shard
from tests.loopback import RecordingProxy

DATASET = "B1_glaive"
SHARDS = 300  # shards in one group, in the XCom test (what the group hands on must not grow with them)


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config whose dataset file the test may edit, and a local storage root."""
    source = tmp_path / "B1.jsonl"
    shutil.copy(ROOT / "data" / "samples" / "B1_glaive.jsonl", source)
    config = {
        # (a budget each task's shard of 20 can fill, 4 x 20: the run report warns of none it has no cause to)
        "defaults": {
            "storage_root": str(tmp_path / "storage"),
            "shard_size": 20,
            "in_flight": 80,
            "tokenize_workers": 1,
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"]},  # the test's simulator, on a port of its own
        "datasets": {DATASET: {"format": "openai_messages", "paths": [str(source)]}},
    }
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    return tmp_path


def digests(dataset: DatasetConfig) -> dict[str, str] | None:
    return source_digests(dataset, str)


def run_stages(run_id: str, simulator: Simulator | RecordingProxy, **params: Any) -> dict[str, Any]:
    """plan -> prepare -> every shard through generate, validate, export -> publish -> report, as the DAG does."""
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], **params}, run_id))
    prepared = [pipeline.prepare_dataset(run, name) for name in run.datasets]
    for part in pipeline.dataset_parts(run, prepared):  # a dataset left in parts: a task a part, then recorded whole
        pipeline.prepare_dataset_part(run, part)
    prepared = pipeline.finish_prepared(run, prepared)
    for shard in each_shard(run, prepared):
        generated = pipeline.generate_shard(run, shard)
        pipeline.export_shard(run, pipeline.validate_shard(run, generated))
    verified = [pipeline.verify_dataset(run, p) for p in prepared]
    published = [pipeline.publish_dataset(run, p, [], v) for p, v in zip(prepared, verified, strict=True)]
    return pipeline.report(run, published, [])


def versions(deployment: Path) -> list[str]:
    return sorted(p.name for p in (deployment / "storage" / "kimi-k2.5-mini" / DATASET).iterdir() if p.is_dir())


def test_an_unchanged_dataset_is_skipped_and_the_run_is_green(deployment: Path, simulator: Simulator) -> None:
    first = run_stages("night-1", simulator)
    answered = simulator.stats()["answered"]
    second = run_stages("night-2", simulator)

    assert [d["version"] for d in first["datasets"]] == ["night-1"]
    assert second["datasets"] == [] and second["unpublished"] == []
    [unchanged] = second["unchanged"]
    assert (unchanged["dataset"], unchanged["version"]) == (DATASET, "night-1")
    assert unchanged["inputs_digest"] == first["datasets"][0]["inputs_digest"]
    assert simulator.stats()["answered"] == answered  # not one request
    assert versions(deployment) == ["night-1"]  # night-2 wrote nothing


@pytest.mark.parametrize(
    "change",
    [
        pytest.param("source", id="a-source-row-changed"),
        pytest.param("sampling", id="sampling-changed"),
        pytest.param("forced", id="skip-unchanged-off"),
        pytest.param("manifest-gone", id="last-version-deleted"),
    ],
)
def test_a_changed_dataset_is_regenerated(deployment: Path, simulator: Simulator, change: str) -> None:
    run_stages("night-1", simulator)
    params: dict[str, Any] = {}
    if change == "source":
        source = deployment / "B1.jsonl"
        source.write_text(source.read_text().replace("Request 0:", "Request zero:", 1))
    elif change == "sampling":
        params["temperature"] = 0.7
    elif change == "forced":
        params["skip_unchanged"] = False
    else:
        (deployment / "storage" / "kimi-k2.5-mini" / DATASET / "night-1" / "manifest.json").unlink()
    second = run_stages("night-2", simulator, **params)
    assert [d["version"] for d in second["datasets"]] == ["night-2"] and second["unchanged"] == []
    latest = json.loads((deployment / "storage" / latest_key("kimi-k2.5-mini", DATASET)).read_text())
    assert latest["version"] == "night-2"


@pytest.mark.parametrize("in_parts", [False, True], ids=["whole", "in-parts"])
def test_a_later_version_deals_the_longest_answers_of_the_last_into_the_first_shards_and_sends_them_first(
    deployment: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch, in_parts: bool
) -> None:
    """The simulator gives a prompt the same answer length every time (as a model roughly does): the next version
    knows every length, deals the longest into its first shards, and sends each shard's longest first. A dataset
    left in parts is read once, by its reader: each part deals its own prompts, by the lengths they carry, and the
    run takes the shards of every part longest first. The records are the same whatever the order."""
    if in_parts:
        config = yaml.safe_load((deployment / "regen.yaml").read_text())
        config["defaults"].update(prepare_part_prompts=8, shard_size=4)  # 36 prompts: 5 parts of 2 shards at most
        (deployment / "regen.yaml").write_text(yaml.safe_dump(config))
    run_stages("night-1", simulator)
    folder = deployment / "storage" / "kimi-k2.5-mini" / DATASET
    lengths: dict[str, int] = {}
    for verdicts in sorted((folder / "night-1" / "reports").glob("*-verdicts.parquet")):
        table = pq.read_table(verdicts)
        lengths.update(zip(table.column("id").to_pylist(), table.column("output_len").to_pylist(), strict=True))
    reads: list[str] = []
    read_lengths, prepare_part = pipeline.prepare.answer_lengths, pipeline.prepare_dataset_part
    monkeypatch.setattr(pipeline.prepare, "answer_lengths", lambda *a: reads.append(a[2].dataset) or read_lengths(*a))
    monkeypatch.setattr(pipeline, "prepare_dataset_part", lambda *a: reads.append("a part") or prepare_part(*a))
    with RecordingProxy(simulator.url) as proxy:
        run_stages("night-2", proxy, skip_unchanged=False, in_flight=1)  # one request at a time: the send order
    # The lengths read once, by the dataset's reader, never by a part task (five of them, when in parts).
    assert reads == [DATASET, *["a part"] * (5 if in_parts else 0)]
    shards = [pq.read_table(p).to_pylist() for p in sorted((folder / "night-2" / "prompts").glob("shard-*.parquet"))]
    assert len(shards) > 1 and {p["id"]: p["expected_tokens"] for s in shards for p in s} == lengths
    dealt_together = [shards[i : i + 2] for i in range(0, len(shards), 2)] if in_parts else [shards]
    assert len(dealt_together) == (5 if in_parts else 1)
    for dealt in dealt_together:  # dealt longest first
        for earlier, later in itertools.pairwise(dealt):
            assert min(p["expected_tokens"] for p in earlier) >= max(p["expected_tokens"] for p in later)
    sent = [lengths[answer_id_of(body["rid"])] for body in proxy.bodies]
    assert sorted(sent) == sorted(lengths.values()) and len(set(sent)) > 5  # lengths that differ
    at = 0  # shard after shard in the run's order (the longest first, across the parts), each one's longest first
    for shard in sorted(shards, key=lambda shard: -max(p["expected_tokens"] for p in shard)):
        assert sent[at : at + len(shard)] == sorted((p["expected_tokens"] for p in shard), reverse=True)
        at += len(shard)
    if not in_parts:  # dealt across every shard: the whole version's longest first
        assert sent == sorted(sent, reverse=True)

    def records(version: str) -> list[str]:  # kept ones, trained on or held out
        manifest = str(folder / version / "manifest.json")
        batches = [b for split in ("train", "validation") for b in read_training_data(manifest, split=split)]
        return sorted(json.dumps(row, sort_keys=True) for batch in batches for row in batch.to_pylist())

    first = records("night-1")
    assert first == records("night-2") and len(first) == len(lengths)


def test_the_digest_covers_content_template_and_sampling(deployment: Path) -> None:
    from regen.config import load_config

    dataset = load_config().dataset(DATASET)
    profile = {"name": "kimi-k2.5-mini", "chat_template_sha256": "a" * 64, "transformers_version": "5.0"}
    base = dataset_inputs(dataset, profile, {"temperature": 1.0}, None, digests(dataset))
    assert base["digest"] == dataset_inputs(dataset, profile, {"temperature": 1.0}, None, digests(dataset))["digest"]
    assert (
        base["digest"]
        == dataset_inputs(
            dataset,
            {**profile, "transformers_version": "5.1"},
            {"temperature": 1.0},
            None,
            digests(dataset),
        )["digest"]
    )  # a library upgrade alone is no change
    template = {**profile, "chat_template_sha256": "b" * 64}
    assert dataset_inputs(dataset, template, {"temperature": 1.0}, None, digests(dataset))["digest"] != base["digest"]
    assert dataset_inputs(dataset, profile, {"temperature": 1.0}, 5, digests(dataset))["digest"] != base["digest"]
    # Export options change what a version holds (a text column, JSON Lines files): inputs when on, and off is as
    # before they were inputs (the digests of versions published then stand).
    sampled = (dataset, profile, {"temperature": 1.0}, None, digests(dataset), None, 0.0)
    off = dataset_inputs(*sampled, {"jsonl": False, "review_text": False})
    assert off["digest"] == base["digest"] and "export" not in off
    review = dataset_inputs(*sampled, {"jsonl": False, "review_text": True})
    assert review["export"] == {"review_text": True} and review["digest"] != base["digest"]


def test_a_hub_dataset_at_no_pinned_revision_is_never_taken_as_unchanged() -> None:
    from regen.config import DatasetConfig

    unpinned = DatasetConfig(hf={"id": "org/prompts"})
    pinned = DatasetConfig(hf={"id": "org/prompts", "revision": "abc123"})
    assert dataset_inputs(unpinned, {}, {}, None, digests(unpinned))["digest"] is None
    assert dataset_inputs(pinned, {}, {}, None, digests(pinned))["sources"] == {"hf://org/prompts": "abc123"}


def test_an_s3_source_is_identified_by_its_etag(s3_client: Any) -> None:
    from regen.config import DatasetConfig

    s3_client.create_bucket(Bucket="nightly-src")
    s3_client.put_object(Bucket="nightly-src", Key="p/a.jsonl", Body=b'{"prompt": "hi"}\n')
    dataset = DatasetConfig(paths=["s3://nightly-src/p/*.jsonl"])
    before = dataset_inputs(dataset, {}, {}, None, source_digests(dataset, str, lambda: s3_client))
    s3_client.put_object(Bucket="nightly-src", Key="p/a.jsonl", Body=b'{"prompt": "hello"}\n')
    after = dataset_inputs(dataset, {}, {}, None, source_digests(dataset, str, lambda: s3_client))
    assert list(before["sources"]) == ["s3://nightly-src/p/a.jsonl"]
    assert before["digest"] != after["digest"]


def test_a_published_version_verifies_and_tampering_is_named(deployment: Path, simulator: Simulator) -> None:
    [published] = run_stages("night-1", simulator)["datasets"]
    verified = verify_published(published["manifest"])
    assert (verified["version"], verified["records"]) == ("night-1", published["records"])

    manifest = json.loads(Path(published["manifest"]).read_text())
    train = deployment / "storage" / manifest["shards"][0]["train"]
    shutil.copy(deployment / "storage" / manifest["shards"][1]["train"], train)  # a real Parquet file, the wrong one
    (deployment / "storage" / manifest["shards"][1]["raw"]).unlink()
    with pytest.raises(VerificationFailed) as failed:
        verify_published(published["manifest"])
    wrong_size = f"{manifest['shards'][0]['train']}: {train.stat().st_size} bytes, manifest says"
    assert wrong_size in str(failed.value)  # the size tells first; the same size would fail on its sha256
    assert f"{manifest['shards'][1]['raw']}: missing" in str(failed.value)


def test_more_shards_than_the_task_limit_are_grouped_in_order_within_a_dataset() -> None:
    prepared = [{"dataset": "a", "shard_count": 30}, {"dataset": "b", "shard_count": 5}]

    def shards(groups: list[dict[str, Any]]) -> list[tuple[str, int]]:
        return [(g["dataset"], g["first"] + i) for g in groups for i in range(g["count"])]

    every = [("a", i) for i in range(30)] + [("b", i) for i in range(5)]
    assert pipeline.shard_groups(prepared, 35) == [{"dataset": d, "first": i, "count": 1} for d, i in every]
    groups = pipeline.shard_groups(prepared, 20)
    assert len(groups) == 18 and [g["count"] for g in groups] == [2] * 15 + [2, 2, 1]
    assert shards(groups) == every  # in order, each once, no group spanning two datasets
    assert len(pipeline.shard_groups(prepared, 2)) == len(pipeline.shard_groups(prepared, 1)) == 2  # one per dataset
    unchanged = {"dataset": "c", "unchanged_since": {"version": "v1"}}
    assert pipeline.shard_groups([{"dataset": "a", "shard_count": 0}, unchanged], 20) == []


def test_what_travels_between_tasks_does_not_grow_with_the_dataset(deployment: Path, simulator: Simulator) -> None:
    """prepare's XCom is a count whatever the number of shards; a group's shards come from prepare's record."""
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "shard_size": 4}, "bounded"))
    [prepared] = [pipeline.prepare_dataset(run, run.datasets[0])]
    record = pipeline.prepared_version(run, run.datasets[0])
    assert prepared == {
        "dataset": run.datasets[0],
        "shard_count": len(record.shards),
        "prompts": record.stats.kept,
        "answers": record.stats.kept,  # one answer a prompt
    }
    assert len(record.shards) > 3
    [group] = pipeline.shard_groups([prepared], 1)
    assert pipeline.group_shards(run, group) == [s.to_dict() for s in record.shards]
    assert pipeline.group_shards(run, {**group, "first": 2, "count": 1}) == [record.shards[2].to_dict()]


def prepared_with_parts(deployment: Path, config: dict[str, Any], simulator: Simulator, run_id: str) -> Any:
    (deployment / "regen.yaml").write_text(yaml.safe_dump(config))
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "shard_size": 5}, run_id))
    return run, [pipeline.prepare_dataset(run, name) for name in run.datasets]


def test_the_advice_for_too_many_parts_is_a_value_that_maps(
    deployment: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More parts than Airflow maps: the prepare_part_prompts the error asks for, set and run, is accepted. Under a
    cap of 3, 72 prompts / 3 = 24 a part (the old advice) would be cut to 20 (whole shards of 5) for the first
    dataset and to 10 prompts of 2 samples for the second: 6 parts."""
    monkeypatch.setattr(pipeline.prepare, "MAX_MAP_LENGTH", 3)
    config = yaml.safe_load((deployment / "regen.yaml").read_text())
    config["datasets"]["second"] = {**config["datasets"][DATASET], "samples_per_prompt": 2}
    config["defaults"]["prepare_part_prompts"] = 8
    run, summaries = prepared_with_parts(deployment, config, simulator, "too-many")
    with pytest.raises(ConfigError, match="more than Airflow maps") as advice:
        pipeline.dataset_parts(run, summaries)

    config["defaults"]["prepare_part_prompts"] = int(str(advice.value).rsplit(" ", 1)[1])
    run, summaries = prepared_with_parts(deployment, config, simulator, "as-advised")
    assert config["defaults"]["prepare_part_prompts"] == 40  # 35 would give the first 2 parts, the second 3
    assert [s.get("parts") for s in summaries] == [None, 2]  # the first prepared whole (one part), the second in 2
    assert pipeline.dataset_parts(run, summaries) == [[1, 0], [1, 1]]


def one_prompt_rows(path: Path, count: int) -> None:
    rows = ({"messages": [{"role": "user", "content": f"Question {i}: name a prime above {i}."}]} for i in range(count))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_group_of_hundreds_of_shards_passes_the_same_few_bytes_between_its_tasks(
    deployment: Path, simulator: Simulator
) -> None:
    """Each of generate, validate and export returns what the DAG's mapped task puts in XCom: the group's range,
    its shards' manifests staying in storage, so one task's XCom is as small at hundreds of shards as at one."""
    one_prompt_rows(deployment / "B1.jsonl", SHARDS)
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "shard_size": 1}, "a-thousand"))
    prepared = pipeline.prepare_dataset(run, DATASET)
    assert prepared["shard_count"] == SHARDS
    [group] = pipeline.shard_groups([prepared], 1)  # one mapped task for all 1,000 shards
    assert group["count"] == SHARDS
    sizes, value = {}, group
    for stage in (pipeline.generate_group, pipeline.validate_group, pipeline.export_group):
        value = stage(run, value)
        assert value == group  # the range it was given, whatever its count
        sizes[stage.__name__] = len(json.dumps(value).encode())
    assert max(sizes.values()) < 100, sizes
    published = pipeline.publish_dataset(run, prepared, [], pipeline.verify_dataset(run, prepared))
    kept = published["splits"]["train"] + published["splits"]["validation"]
    assert kept == SHARDS  # every shard went through all three stages, handed on in storage


def test_a_stage_run_again_alone_without_its_input_says_which_stage_to_run(
    deployment: Path, simulator: Simulator
) -> None:
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "shard_size": 4}, "cleared-alone"))
    prepared = pipeline.prepare_dataset(run, DATASET)
    [group] = pipeline.shard_groups([prepared], 1)
    with pytest.raises(FinalError, match=r"shard-00000\.generate\.json is missing: run generate_shard"):
        pipeline.validate_group(run, group)


def test_a_dataset_in_parts_waits_for_every_part_and_then_publishes(deployment: Path, simulator: Simulator) -> None:
    """The DAG's path for a large dataset: one reader, a task per part, list_shards records the parts whole. A part
    that failed leaves the dataset out (verify names why) until it is run again."""
    config = yaml.safe_load((deployment / "regen.yaml").read_text())
    config["defaults"]["prepare_part_prompts"] = 8
    (deployment / "regen.yaml").write_text(yaml.safe_dump(config))
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "shard_size": 4}, "in-parts"))
    summary = pipeline.prepare_dataset(run, DATASET)
    parts = pipeline.dataset_parts(run, [summary])
    assert summary == {"dataset": DATASET, "parts": 5, "prompts": 36} and parts == [[0, p] for p in range(5)]
    counts = [pipeline.prepare_dataset_part(run, part) for part in parts[:-1]]
    assert counts[0] == {"dataset": DATASET, "part": 0, "shards": 2, "kept": 8}
    # 49 prompts a part would be cut to 48 (whole shards of 4), 1,042 parts: the advice is what part_layout cuts.
    with pytest.raises(ConfigError, match=r"set defaults\.prepare_part_prompts to at least 52$"):
        pipeline.dataset_parts(run, [{"dataset": DATASET, "parts": 1025, "prompts": 50_000}])
    assert pipeline.finish_prepared(run, [summary]) == []  # the last part never ran
    with pytest.raises(pipeline.NotPrepared, match="one of its prepare_part tasks failed"):
        pipeline.verify_dataset(run, summary)
    pipeline.prepare_dataset_part(run, parts[-1])  # the failed part, cleared and run again
    [prepared] = pipeline.finish_prepared(run, [summary])
    assert prepared == {"dataset": DATASET, "shard_count": 9, "prompts": 36, "answers": 36}
    for shard in each_shard(run, [prepared]):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    published = pipeline.publish_dataset(run, prepared, [], pipeline.verify_dataset(run, prepared))
    assert published["splits"]["train"] + published["splits"]["validation"] == 36
    assert pipeline.prepare_dataset(run, DATASET) == prepared  # a retried reader finds the dataset prepared


def test_publish_refuses_a_dataset_whose_verification_did_not_pass(deployment: Path, simulator: Simulator) -> None:
    """In the DAG, publish gets None from a failed verify_dataset: it names the cause and writes nothing."""
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url]}, "unverified"))
    prepared = pipeline.prepare_dataset(run, run.datasets[0])
    with pytest.raises(pipeline.NotVerified, match="verify_dataset did not pass"):
        pipeline.publish_dataset(run, prepared, [], None)
    assert not (deployment / "storage" / run.location(run.datasets[0]).manifest).exists()


def test_fields_added_to_the_dataset_config_leave_earlier_digests_alone(deployment: Path) -> None:
    """A version published before samples_per_prompt existed has the digest of its config without it: at the
    default the field changes nothing, so the nightly skip still recognizes it; set, it is a new input."""
    from regen.config import DatasetConfig

    plain = DatasetConfig(paths=[str(deployment / "B1.jsonl")], format="openai_messages")
    sampled = plain.model_copy(update={"samples_per_prompt": 3})
    digest = [dataset_inputs(c, {}, {}, None, digests(c))["digest"] for c in (plain, sampled)]
    later = {"samples_per_prompt", "temperatures", "tool_result_names"}
    before = plain.model_dump(mode="json", exclude={"description", *later})
    assert dataset_inputs(plain, {}, {}, None, digests(plain))["dataset"] == before
    assert digest[0] != digest[1]


def test_a_resumed_run_keeps_the_earlier_runs_report_beside_its_own(deployment: Path, simulator: Simulator) -> None:
    first = run_stages("night-1", simulator)
    again = run_stages("night-1", simulator)  # the same run's report task retried: its own report, rewritten
    resumed = run_stages("manual__resume", simulator, version="night-1")  # a Resume of the version
    runs = deployment / "storage" / "kimi-k2.5-mini" / "runs"
    assert first["report"] == again["report"] == str(runs / "night-1.json")
    assert resumed["report"] == str(runs / "night-1--manual__resume.json")
    assert json.loads((runs / "night-1.json").read_text())["run"]["run_id"] == "night-1"
    assert json.loads((runs / "night-1--manual__resume.json").read_text())["run"]["run_id"] == "manual__resume"


def _older_manifest(deployment: Path, version: str, drop: tuple[str, ...]) -> None:
    """The version's manifest as an earlier release wrote it (without `drop`), latest.json pointing at it."""
    folder = deployment / "storage" / "kimi-k2.5-mini" / DATASET
    manifest = json.loads((folder / version / "manifest.json").read_text())
    body = json.dumps({k: v for k, v in manifest.items() if k not in drop}, indent=1).encode()
    (folder / version / "manifest.json").write_bytes(body)
    latest = json.loads((folder / "latest.json").read_text())
    latest["manifest_sha256"] = hashlib.sha256(body).hexdigest()
    (folder / "latest.json").write_text(json.dumps(latest))


def test_a_last_version_published_before_run_ids_and_splits_still_orders_the_next(
    deployment: Path, simulator: Simulator
) -> None:
    """Longest first reads the last version's manifest: one an earlier release wrote (no `run_id`, no `splits`)
    reads with their defaults, so the nightly after an upgrade is green and still sends the longest first."""
    run_stages("night-1", simulator)
    _older_manifest(deployment, "night-1", drop=("run_id", "splits"))
    second = run_stages("night-2", simulator, skip_unchanged=False)
    assert [d["version"] for d in second["datasets"]] == ["night-2"] and not second["warnings"]
    prompts = deployment / "storage" / "kimi-k2.5-mini" / DATASET / "night-2" / "prompts"
    rows = [r for p in sorted(prompts.glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert rows and all(r["expected_tokens"] is not None for r in rows)


def test_last_lengths_that_cannot_be_read_leave_the_reference_order_and_a_warning_never_a_red_run(
    deployment: Path, simulator: Simulator
) -> None:
    """An ordering hint never fails a run: a verdict file of the last version gone, the next version is prepared as a
    first version is (ordered by its rows' reference answers), green, and its run report says why."""
    run_stages("night-1", simulator)
    folder = deployment / "storage" / "kimi-k2.5-mini" / DATASET / "night-1" / "reports"
    next(iter(sorted(folder.glob("*-verdicts.parquet")))).unlink()
    second = run_stages("night-2", simulator, skip_unchanged=False)
    assert [d["version"] for d in second["datasets"]] == ["night-2"]
    [warning] = second["warnings"]
    assert warning.startswith(f"{DATASET}: the answer lengths of the last version (this profile's or another's) failed")
    assert "by its rows' reference answers" in warning
    prompts = deployment / "storage" / "kimi-k2.5-mini" / DATASET / "night-2" / "prompts"
    rows = [r for p in sorted(prompts.glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert rows and all(r["expected_tokens"] == r["reference_tokens"] is not None for r in rows)


def test_a_dataset_in_parts_with_a_gap_in_its_shard_numbers_is_published_group_by_group(
    tmp_path: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that loses prompts at tokenize (too long) writes fewer shards than its numbers were kept for, so the
    dataset's shard numbers have a gap. Every stage names a group's shards the same way (their places in
    prepare.json), so each group validates and exports its own shards and the dataset publishes."""
    from tools.crash_points import write_deployment

    monkeypatch.setenv("REGEN_CONFIG", str(write_deployment(tmp_path / "deployment", str(tmp_path / "root"))))
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "datasets": ["parts"]}, "gap"))
    prepared = [pipeline.prepare_dataset(run, "parts")]
    for part in pipeline.dataset_parts(run, prepared):
        pipeline.prepare_dataset_part(run, part)
    [prepared_parts] = pipeline.finish_prepared(run, prepared)
    assert [s.shard for s in pipeline.prepared_version(run, "parts").shards] == [0, 2, 3]
    groups = pipeline.shard_groups([prepared_parts], 2)
    assert groups == [{"dataset": "parts", "first": 0, "count": 2}, {"dataset": "parts", "first": 2, "count": 1}]
    for group in groups:
        for stage in (pipeline.generate_group, pipeline.validate_group, pipeline.export_group):
            assert stage(run, group) == group
    published = pipeline.publish_dataset(run, prepared_parts, [], pipeline.verify_dataset(run, prepared_parts))
    assert sum(published["splits"].values()) == 8  # the eight prompts that fit, each once
    assert verify_published(published["manifest"])["records"] == published["records"]


def test_the_last_lengths_are_read_only_where_used_and_after_the_claim(
    deployment: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Longest first reads the last version's verdicts once the version is this run's (a run refused for another
    run's claim reads nothing first), on-policy too (a turn's last length is found by its turn id)."""
    from regen.claims import VersionBusy, claim

    run_stages("night-1", simulator)
    reads: list[str] = []
    read_lengths = pipeline.prepare.answer_lengths
    monkeypatch.setattr(pipeline.prepare, "answer_lengths", lambda *a: reads.append(a[2].dataset) or read_lengths(*a))
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "skip_unchanged": False}, "night-2"))
    claim(pipeline.RunStorage.open(run, None).storage, run.location(DATASET), "another-run", "its-token")
    with pytest.raises(VersionBusy):
        pipeline.prepare_dataset(run, DATASET)
    assert reads == []
    config = yaml.safe_load((deployment / "regen.yaml").read_text())
    config["datasets"][DATASET]["turns"] = "on_policy"
    (deployment / "regen.yaml").write_text(yaml.safe_dump(config))
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "skip_unchanged": False}, "night-3"))
    assert pipeline.prepare_dataset(run, DATASET)["prompts"] > 0
    assert reads == [DATASET]


def test_the_dags_verify_names_a_file_no_manifest_would_list_as_regen_verify_does(
    deployment: Path, simulator: Simulator
) -> None:
    """The DAG's verify step is regen verify's checks, strays included: a file a dying try left in the version's
    folder fails it before any manifest is written (the run was green, and regen verify refused the version)."""
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url]}, "strays"))
    [prepared] = [pipeline.prepare_dataset(run, DATASET)]
    for shard in each_shard(run, [prepared]):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    stray = f"{run.location(DATASET).prefix}/raw/shard-00000/part-00003.jsonl"
    pipeline.RunStorage.open(run, None).storage.put_bytes(stray, b"{}\n")
    with pytest.raises(VerificationFailed, match=r"1 files in the version's folder are not listed .*part-00003"):
        pipeline.verify_dataset(run, prepared)
