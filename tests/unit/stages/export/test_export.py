"""A shard through generate, validate and export against a server that plants defects, omits `</think>` before tool
calls and is cut by a small token budget: every valid answer lands in train/ bit-exact, truncated ones in their own
split, defective ones in rejected/ for their own reason, and the dataset report counts them all."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.judge import FLAG_NO_REASONING_END
from regen.layout import report_writer
from regen.manifest import PreparedDataset, ShardManifest
from regen.simulator.defects import BY_NAME
from regen.stages.export import ExportSettings, run_export
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.stages.publish.publish import run_publish
from regen.stages.validate import TemplateDrift, run_validate
from regen.storage import LocalStorage
from tests.conftest import Simulator, prepare_sample, raw_answers, shard_prompt_ids, start_simulator

MAX_NEW_TOKENS = 120  # the simulator's answers run 34-194 tokens: some are cut


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    sim = start_simulator(
        tmp_path_factory.mktemp("sim"),
        "--defect-rate",
        "0.3",
        "--omit-think-end-rate",
        "0.5",
        "--tool-call-rate",
        "0.8",
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def published(
    tmp_path_factory: pytest.TempPathFactory, renderer: ChatRenderer, server: Simulator
) -> tuple[PreparedDataset, LocalStorage, dict[str, Any]]:
    prepared, storage = prepare_sample(tmp_path_factory.mktemp("root"), renderer, "B1_glaive", 100)
    sampling = Sampling(max_new_tokens=MAX_NEW_TOKENS).as_params()
    settings = GenerateSettings([server.url], sampling, concurrency=8, backoff_max_s=0.05)
    for shard in prepared.shards:
        validated = run_validate(run_generate(shard, storage, settings), storage, renderer)
        run_export(validated, storage, ExportSettings(jsonl=True, review_text=True), renderer.decode)
    return prepared, storage, run_publish(prepared, storage, fleet=[])


def parquet(storage: LocalStorage, key: str) -> list[dict[str, Any]]:
    return pq.read_table(io.BytesIO(storage.get_bytes(key))).to_pylist()


def lines(storage: LocalStorage, key: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in storage.get_bytes(key).decode().splitlines()] if storage.exists(key) else []


def test_every_answer_lands_in_exactly_one_place_as_the_server_sent_it(
    published: tuple[PreparedDataset, LocalStorage, dict[str, Any]], server: Simulator, renderer: ChatRenderer
) -> None:
    prepared, storage, _ = published
    sent = {r["rid"]: r for r in server.records()}
    [shard] = prepared.shards
    location = prepared.location
    raw = {r["id"]: r for r in raw_answers(storage, shard.keys.raw)}
    prompt_ids = shard_prompt_ids(storage, shard)
    train = parquet(storage, shard.keys.split("train"))
    truncated = parquet(storage, shard.keys.split("truncated"))
    rejected = {r["id"]: r for r in lines(storage, location.shard(0).rejected("validate"))}
    generate_rejected = lines(storage, location.shard(0).rejected("generate"))

    placed = [r["id"] for r in train] + [r["id"] for r in truncated] + list(rejected)
    assert sorted(placed) == sorted(raw) and len(raw) + len(generate_rejected) == len(prompt_ids)
    for record in train + truncated:  # bit-exact: the prompt sent, then the ids the server returned
        output = sent[raw[record["id"]]["rid"]]["output_ids"]
        assert record["input_ids"] == prompt_ids[record["id"]] + output
        assert record["loss_mask"] == [0] * len(prompt_ids[record["id"]]) + [1] * len(output)
        assert record["text"] == renderer.decode(output)
        assert record["dataset"] == "B1_glaive" and record["profile"] == "kimi-k2.5-mini"
    assert {r["verdict"] for r in train} == {"ok"}
    assert {r["verdict"] for r in truncated} <= {"truncated_in_reasoning", "truncated_in_answer"} and truncated
    assert all(r["finish_reason"] == "length" for r in truncated)
    assert any(FLAG_NO_REASONING_END in r["flags"] for r in train)  # kept, flagged
    for sample_id, rejection in rejected.items():  # each planted defect, for its own reason
        defect = sent[raw[sample_id]["rid"]]["defect"]
        assert defect is not None and rejection["reason"] == BY_NAME[defect].reason.value, (defect, rejection)
    assert rejected and all(r["reason"] == "count_mismatch" for r in generate_rejected)
    assert lines(storage, shard.keys.split("train", "jsonl")) == [
        {"id": r["id"], "input_ids": r["input_ids"], "loss_mask": r["loss_mask"], "text": r["text"]} for r in train
    ]


def test_a_split_file_keeps_statistics_for_its_scalar_columns_and_dictionaries_for_its_strings_only(
    published: tuple[PreparedDataset, LocalStorage, dict[str, Any]],
) -> None:
    """Token-id lists gain nothing from either, and computing them was a tenth of the write; a reader filtering by id,
    dataset or verdict still skips row groups by their statistics."""
    prepared, storage, _ = published
    [shard] = prepared.shards
    group = pq.ParquetFile(io.BytesIO(storage.get_bytes(shard.keys.split("train")))).metadata.row_group(0)
    columns = {group.column(i).path_in_schema.split(".")[0]: group.column(i) for i in range(group.num_columns)}
    with_statistics = {name for name, column in columns.items() if column.is_stats_set}
    dictionary = {name for name, column in columns.items() if any("DICTIONARY" in e for e in column.encodings)}
    assert with_statistics == set(columns) - {"input_ids", "loss_mask", "flags"}
    assert dictionary == {"id", "verdict", "finish_reason", "dataset", "profile", "text"}


def test_the_dataset_report_counts_what_landed(published: tuple[PreparedDataset, LocalStorage, dict[str, Any]]) -> None:
    prepared, storage, summary = published
    location = prepared.location
    manifest = json.loads(storage.get_bytes(location.manifest))
    writer = report_writer(manifest)
    report = json.loads(storage.get_bytes(location.report_file("report.json", writer)))
    [shard] = prepared.shards
    train = parquet(storage, shard.keys.split("train"))
    truncated = parquet(storage, shard.keys.split("truncated"))
    rejected = lines(storage, location.shard(0).rejected("validate"))

    assert report["train_records"] == manifest["splits"]["train"] == summary["records"] == len(train)
    assert report["truncated_records"] == manifest["splits"]["truncated"] == len(truncated)
    assert report["rejected_records"] == len(rejected) == manifest["stages"]["validate"]["dropped"]
    exported = manifest["stages"]["export"]  # kept: the ok answers; the truncated are export's drops, by verdict
    assert exported["kept"] == len(train) and exported["total"] == len(train) + len(truncated)
    assert exported["dropped_by_reason"] == dict(Counter(r["verdict"] for r in truncated))
    verdicts = Counter(r["verdict"] for r in train + truncated) + Counter(r["reason"] for r in rejected)
    assert report["verdicts"] == dict(verdicts)
    kept = train + truncated
    assert report["tokens"]["output"] == sum(sum(r["loss_mask"]) for r in kept)
    assert report["tool_call_rate"] == round(sum("<|tool_call_end|>" in r["text"] for r in kept) / len(kept), 4)
    drift = report["retokenize_drift"]
    assert min(16, len(kept)) <= drift["sampled"] <= len(kept)
    measured = [v for v in parquet(storage, shard.keys.verdicts) if v["retokenize_drift"] is not None]
    assert len(measured) == drift["sampled"] and sum(v["retokenize_drift"] for v in measured) == drift["drifted"]
    for name in ("report.html", "lengths.png", "verdicts.png"):
        assert location.report_file(name, writer) in manifest["files"]
    assert Path(storage.uri(location.report_file("verdicts.png", writer))).read_bytes()[:4] == b"\x89PNG"
    html = storage.get_bytes(location.report_file("report.html", writer)).decode()
    assert f"{report['train_records']} training records" in html and 'src="lengths.png"' in html
    assert manifest["profile"]["chat_template_sha256"] and manifest["profile"]["tokenizer_files_sha256"]


def test_retokenization_drift_is_what_a_text_pipeline_would_corrupt(
    published: tuple[PreparedDataset, LocalStorage, dict[str, Any]], renderer: ChatRenderer
) -> None:
    prepared, storage, _ = published
    [shard] = prepared.shards
    records = {r["id"]: r for r in parquet(storage, shard.keys.split("train"))}
    records |= {r["id"]: r for r in parquet(storage, shard.keys.split("truncated"))}
    for verdict in parquet(storage, shard.keys.verdicts):
        if verdict["retokenize_drift"] is None:
            continue
        record = records[verdict["id"]]
        output = record["input_ids"][record["prompt_len"] :]
        again = renderer.tokenizer.encode(renderer.decode(output), add_special_tokens=False)
        assert verdict["retokenize_drift"] == (again != output)


def test_a_template_that_changed_since_prepare_fails_validate(
    published: tuple[PreparedDataset, LocalStorage, dict[str, Any]], renderer: ChatRenderer
) -> None:
    prepared, storage, _ = published
    shard = dataclasses.replace(prepared.shards[0], raw_key=prepared.shards[0].keys.raw)
    moved = renderer.profile.replaced(
        chat_template_kwargs={"thinking": False},
        generation_suffix="<|im_assistant|>assistant<|im_middle|><think></think>",
    )
    with pytest.raises(TemplateDrift, match=r"renders differently now than at prepare \(first difference at id \d+\)"):
        run_validate(shard, storage, ChatRenderer(moved))


def test_a_shard_past_an_arrow_lists_int32_offsets_is_built_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Arrow list array holds fewer than 2^31 values; a shard of long answers holds more. Its columns are built in
    chunks below the limit (here lowered to 50 ids), and read back record for record as one column would be."""
    import numpy as np

    from regen.stages import export

    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 1000, n).astype(np.int32) for n in rng.integers(1, 20, 40)]
    outputs = [rng.integers(0, 1000, n).astype(np.int32) for n in rng.integers(1, 20, 40)]
    whole_ids, whole_mask = export.build_training_columns(prompts, outputs)
    assert np.iinfo(np.int32).max == export.MAX_LIST_VALUES  # the most an int32 offset addresses
    monkeypatch.setattr(export, "MAX_LIST_VALUES", 50)
    ids, mask = export.build_training_columns(prompts, outputs)
    assert ids.num_chunks > 10 and all(len(chunk.values) <= 50 for chunk in ids.chunks)
    # each chunk as full as it can be: the next record would have taken it past the limit
    assert all(len(c.values) + len(n[0].values) > 50 for c, n in zip(ids.chunks, ids.chunks[1:], strict=False))
    pairs = list(zip(prompts, outputs, strict=True))
    assert ids.to_pylist() == whole_ids.to_pylist() == [[*p, *o] for p, o in pairs]
    assert mask.to_pylist() == whole_mask.to_pylist() == [[0] * len(p) + [1] * len(o) for p, o in pairs]


def test_one_record_past_the_list_limit_is_refused_by_its_length(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from regen.stages import export

    monkeypatch.setattr(export, "MAX_LIST_VALUES", 50)
    prompts, outputs = [np.arange(5, dtype=np.int32), np.arange(30, dtype=np.int32)], [np.arange(3), np.arange(31)]
    with pytest.raises(ValueError, match=r"^a record of 61 token ids does not fit an Arrow list$"):
        export.build_training_columns(prompts, outputs)


def test_by_default_a_shard_is_exported_to_parquet_alone_with_nothing_held_out() -> None:
    assert (ExportSettings().formats, ExportSettings().validation_share) == (("parquet",), 0.0)
    assert ExportSettings(jsonl=True).formats == ("parquet", "jsonl")


def test_truncated_answers_stay_in_truncated_whichever_side_their_prompt_is_on(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, dict[str, Any]]
) -> None:
    """Exported again at a share of 0.5 in a copy of the root: truncated/ keeps every cut answer and names its side,
    validation/ holds ok answers only; with no answer cut, no truncated/ file is written at all."""
    prepared, storage, _ = published
    [prepared_shard] = prepared.shards
    shard = ShardManifest.from_dict(json.loads(storage.get_bytes(prepared_shard.keys.report)))
    copy = LocalStorage(tmp_path / "copy")
    shutil.copytree(storage.root, copy.root, dirs_exist_ok=True)
    truncated_before = {r["id"] for r in parquet(storage, shard.keys.split("truncated"))}
    held = ExportSettings(validation_share=0.5)

    exported = run_export(shard, copy, held)
    truncated = parquet(copy, shard.keys.split("truncated"))
    validation = parquet(copy, shard.keys.split("validation"))
    assert {r["id"] for r in truncated} == truncated_before
    assert {r["side"] for r in truncated} == {"train", "validation"}  # both sides cut, at 0.5 of about 20 sources
    assert validation and {r["verdict"] for r in validation} == {"ok"}
    assert exported.split_records["truncated"] == len(truncated_before)

    verdicts = pq.read_table(copy.root / shard.keys.verdicts)
    cut = pa.array([v.startswith("truncated_") for v in verdicts.column("verdict").to_pylist()])
    uncut = verdicts.set_column(
        verdicts.column_names.index("verdict"), "verdict", pc.if_else(cut, "empty_output", verdicts.column("verdict"))
    )
    pq.write_table(uncut, copy.root / shard.keys.verdicts)
    copy.delete(shard.keys.split("truncated"))
    exported = run_export(shard, copy, held)
    assert not copy.exists(shard.keys.split("truncated"))
    assert copy.exists(shard.keys.split("validation")) and exported.split_records["truncated"] == 0
