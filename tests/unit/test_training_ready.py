"""A published version is ready to train on: a held-out validation split decided by the source prompt alone (the
same prompts in every version, every row of a prompt on one side), the train split's token frequencies and the draft
vocabulary, all listed in the manifest and checked by `regen verify` against a count of the records themselves.
Runs the library's stages as the DAG's tasks call them (tests/unit/test_nightly.py's way)."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from regen import pipeline
from regen.holdout import held_out, opening, side_of, source_key
from regen.manifest import ShardManifest
from regen.samples import sample_of
from regen.verify import verify_version
from regen.vocab import coverage, dense_counts, vocab_mapping
from tests.conftest import ROOT, Simulator, each_shard
from tests.torch_format import torch_saved

SHARE = 0.5  # half the prompts: both sides hold many rows of a small dataset


def test_a_prompts_side_depends_on_its_opening_and_tools_only() -> None:
    system = {"role": "system", "content": "Be brief."}
    ask = {"role": "user", "content": "What is 2 + 2?"}
    one = [system, ask, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"}]
    assert opening(one) == [system, ask]
    assert source_key(one, []) == source_key(one[:2], []) == source_key([*one[:2], {"role": "assistant"}], None)
    assert source_key(one, []) != source_key(one, [{"type": "function", "function": {"name": "add"}}])
    assert source_key(one, []) != source_key([system, {"role": "user", "content": "What is 2 + 3?"}], [])


def test_raising_the_share_only_moves_prompts_to_validation() -> None:
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(2000)]
    shares = (0.0, 0.01, 0.02, 0.1, 0.5, 1.0)
    held = {share: {k for k in keys if held_out(k, share)} for share in shares}
    for smaller, larger in itertools.pairwise(shares):
        assert held[smaller] <= held[larger]
    assert held[0.0] == set() and held[1.0] == set(keys)
    assert 0.08 < len(held[0.1]) / len(keys) < 0.12  # a digest is uniform
    assert side_of(json.dumps([{"role": "user", "content": "x"}]), "[]", 0.0) == "train"


def test_the_draft_vocabulary_is_the_most_frequent_ids_ties_by_the_lower_id() -> None:
    counts = dense_counts([np.array([7, 7, 3, 5, 5, 9, 2])], size=12)
    d2t, t2d = vocab_mapping(counts, 3, 12)
    assert np.flatnonzero(t2d).tolist() == [2, 5, 7]  # 7 and 5 twice; of 2, 3 and 9 once, the lowest
    assert d2t.tolist() == [2, 4, 5] and d2t.dtype == np.int64 and t2d.dtype == np.bool_ and len(t2d) == 12
    d2t, t2d = vocab_mapping(counts, 8, 12)  # five ids seen: padded with the lowest never seen
    assert np.flatnonzero(t2d).tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    assert (np.flatnonzero(t2d) - np.arange(8)).tolist() == d2t.tolist()
    assert coverage(counts, [1, 2, 3, 100]) == {1: round(2 / 7, 6), 2: round(4 / 7, 6), 3: round(5 / 7, 6), 100: 1.0}
    with pytest.raises(ValueError, match="outside the target vocabulary of 9"):
        vocab_mapping(counts, 3, 9)


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three datasets: B1 answered at two temperatures, B1 cut at every assistant turn, and C1 on-policy."""
    source = tmp_path / "B1.jsonl"
    shutil.copy(ROOT / "data" / "samples" / "B1_glaive.jsonl", source)
    b1 = {"format": "openai_messages", "paths": [str(source)]}
    config = {
        "defaults": {
            "storage_root": str(tmp_path / "storage"),
            "shard_size": 7,
            "tokenize_workers": 1,
            "validation_share": SHARE,
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"]},
        "datasets": {
            "temperatures": {**b1, "temperatures": [0.3, 1.0]},
            "every_turn": {**b1, "turns": "every_assistant_turn"},
            "on_policy": {
                "format": "auto",
                "turns": "on_policy",
                "paths": [str(ROOT / "data" / "samples" / "C1_multiturn.jsonl")],
            },
        },
    }
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    return tmp_path


def run_stages(run_id: str, simulator: Simulator, **params: Any) -> dict[str, dict[str, Any]]:
    """plan -> prepare -> shards -> verify -> publish, as the DAG does; each dataset's published summary."""
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "skip_unchanged": False, **params}, run_id))
    prepared = pipeline.finish_prepared(run, [pipeline.prepare_dataset(run, name) for name in run.datasets])
    for shard in each_shard(run, prepared):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    return {p["dataset"]: pipeline.publish_dataset(run, p, [], pipeline.verify_dataset(run, p)) for p in prepared}


def split_rows(manifest_uri: str) -> dict[str, list[dict[str, Any]]]:
    manifest = json.loads(Path(manifest_uri).read_text())
    root = Path(manifest["root"])
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for key in sorted(manifest["files"]):
        split = key.split("/")[-2]
        if split in ("train", "validation", "truncated") and key.endswith(".parquet"):
            rows[split] += pq.read_table(root / key).to_pylist()
    return rows


def source_of(manifest_uri: str) -> dict[str, int]:
    """Each sample id's source row (prompts/ `source_index`): what the split must keep on one side."""
    manifest = json.loads(Path(manifest_uri).read_text())
    root = Path(manifest["root"])
    sources: dict[str, int] = {}
    for shard in manifest["shards"]:
        table = pq.read_table(root / shard["prompts"], columns=["id", "source_index"])
        sources |= dict(zip(table.column("id").to_pylist(), table.column("source_index").to_pylist(), strict=True))
    return sources


def test_every_row_of_a_source_prompt_is_on_one_side_and_the_same_side_in_every_version(
    deployment: Path, simulator: Simulator
) -> None:
    first, second = run_stages("night-1", simulator), run_stages("night-2", simulator, validation_share=SHARE)
    for dataset, published in first.items():
        rows, sources = split_rows(published["manifest"]), source_of(published["manifest"])
        sides: dict[int, set[str]] = defaultdict(set)
        for split in ("train", "validation"):
            for row in rows[split]:
                sides[sources[sample_of(row["id"])]].add(split)
        for row in rows["truncated"]:
            sides[sources[sample_of(row["id"])]].add(row["side"])
        assert all(len(s) == 1 for s in sides.values()), dataset  # samples, turns and cuts of a source: one side
        assert {"train", "validation"} == set().union(*sides.values()), dataset
        assert published["splits"]["train"] == len(rows["train"]) == published["records"]
        assert published["splits"]["validation"] == len(rows["validation"]) > 0
        again = split_rows(second[dataset]["manifest"])
        for split in ("train", "validation"):  # the same prompts held out in the next version
            assert {sample_of(r["id"]) for r in rows[split]} == {sample_of(r["id"]) for r in again[split]}, split


def test_the_version_counts_its_train_answers_and_maps_the_draft_vocabulary(
    deployment: Path, simulator: Simulator
) -> None:
    published = run_stages("v1", simulator, datasets=["temperatures"])["temperatures"]
    manifest = json.loads(Path(published["manifest"]).read_text())
    root, folder = Path(manifest["root"]), Path(published["manifest"]).parent
    rows = split_rows(published["manifest"])
    expected: Counter[int] = Counter()
    for row in rows["train"]:  # what every trainer counts: the ids under loss_mask == 1 of the train split
        expected.update(i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m == 1)
    freq = pq.read_table(folder / "vocab" / "token_freq.parquet")
    assert freq.schema.names == ["token_id", "count"] and freq.schema.field("count").type == pa.int64()
    assert dict(zip(freq.column("token_id").to_pylist(), freq.column("count").to_pylist(), strict=True)) == expected
    d2t, t2d = np.load(folder / "vocab" / "d2t.npy"), np.load(folder / "vocab" / "t2d.npy")
    vocab = manifest["vocab"]
    assert (vocab["draft_vocab_size"], vocab["target_vocab_size"]) == (32_000, 163_840) == (len(d2t), len(t2d))
    assert set(expected) <= set(np.flatnonzero(t2d).tolist())  # fewer ids seen than 32,000: every one is drafted
    assert vocab["tokens"] == sum(expected.values()) and vocab["coverage"] == 1.0
    assert {f"{folder.relative_to(root)}/vocab/{n}" for n in ("token_freq.parquet", "d2t.npy", "t2d.npy")} <= set(
        manifest["files"]
    )
    assert verify_version(published["manifest"]).problems == []


def parquet_bytes(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def altered(path: Path, body: bytes, manifest_path: Path) -> None:
    """A file rewritten, and the manifest updated to its new sha256 and size: only a recount can tell."""
    path.write_bytes(body)
    manifest = json.loads(manifest_path.read_text())
    key = str(path.relative_to(manifest["root"]))
    manifest["files"][key], manifest["sizes"][key] = hashlib.sha256(body).hexdigest(), len(body)
    manifest_path.write_text(json.dumps(manifest))


def test_verify_recounts_the_counts_and_the_mapping_and_checks_every_records_side(
    deployment: Path, simulator: Simulator
) -> None:
    published = run_stages("v1", simulator, datasets=["every_turn"])["every_turn"]
    manifest_path = Path(published["manifest"])
    folder = manifest_path.parent
    manifest = json.loads(manifest_path.read_text())

    freq = pq.read_table(folder / "vocab" / "token_freq.parquet")
    bumped = freq.set_column(1, "count", pa.array([c + (i == 0) for i, c in enumerate(freq["count"].to_pylist())]))
    altered(folder / "vocab" / "token_freq.parquet", parquet_bytes(bumped), manifest_path)
    [problem] = verify_version(str(manifest_path)).problems
    assert "token_freq.parquet: the counts differ from a count of the train records" in problem

    shard = manifest["shards"][0]
    counts = pq.read_table(Path(manifest["root"]) / shard["token_counts"])
    one_dropped = parquet_bytes(counts.slice(1))  # one id's count dropped
    altered(Path(manifest["root"]) / shard["token_counts"], one_dropped, manifest_path)
    problems = verify_version(str(manifest_path)).problems
    assert any("token counts differ from those of the shard's train records" in p for p in problems), problems

    d2t = np.load(folder / "vocab" / "d2t.npy")
    d2t[-1] += 1
    out = io.BytesIO()
    np.save(out, d2t)
    altered(folder / "vocab" / "d2t.npy", out.getvalue(), manifest_path)
    problems = verify_version(str(manifest_path)).problems
    assert any("d2t.npy: not the draft vocabulary" in p for p in problems), problems
    d2t[-1] -= 1
    for dtype in (np.int32, np.float64):  # the right ids in another type (narrower, wider): not what trainers load
        out = io.BytesIO()
        np.save(out, d2t.astype(dtype))
        altered(folder / "vocab" / "d2t.npy", out.getvalue(), manifest_path)
        problems = verify_version(str(manifest_path)).problems
        assert any("d2t.npy: not the draft vocabulary" in p for p in problems), (dtype, problems)

    # A record of one side in place of the first record of the other side's file: on the wrong side, either way.
    entry = next(s for s in manifest["shards"] if s.get("validation_records"))
    root = Path(manifest["root"])
    train, validation = pq.read_table(root / entry["train"]), pq.read_table(root / entry["validation"])
    for into, stray, held in (("train", validation, train), ("validation", train, validation)):
        altered(root / entry[into], parquet_bytes(pa.concat_tables([stray.slice(0, 1), held.slice(1)])), manifest_path)
        problems = verify_version(str(manifest_path)).problems
        assert any(f"1 records not on their source prompt's side ({stray['id'][0]})" in p for p in problems), problems


def test_answers_cut_on_both_sides_verify_clean_by_the_side_their_file_names(
    deployment: Path, simulator: Simulator
) -> None:
    """truncated/ holds the cut answers of both sides and names each one's side in a column: read back from the file,
    each equals the side its source prompt is on."""
    published = run_stages("v1", simulator, datasets=["temperatures"], max_new_tokens=60)["temperatures"]
    truncated = split_rows(published["manifest"])["truncated"]
    assert {row["side"] for row in truncated} == {"train", "validation"}
    assert verify_version(published["manifest"]).problems == []


def test_a_damaged_validation_file_leaves_the_vocabulary_checked(deployment: Path, simulator: Simulator) -> None:
    """vocab/ is counted from the train records only: a validation file that is no Parquet file (its digest the
    manifest's: the writer's bytes) is named, not a crash of verify, and the counts are still checked against train
    (only a train file read in part leaves them uncountable)."""
    published = run_stages("v1", simulator, datasets=["every_turn"])["every_turn"]
    manifest_path = Path(published["manifest"])
    manifest = json.loads(manifest_path.read_text())
    entry = next(s for s in manifest["shards"] if s.get("validation_records"))
    altered(Path(manifest["root"]) / entry["validation"], b"not parquet", manifest_path)
    freq_path = manifest_path.parent / "vocab" / "token_freq.parquet"
    freq = pq.read_table(freq_path)
    bumped = freq.set_column(1, "count", pa.array([c + 1 for c in freq["count"].to_pylist()]))
    altered(freq_path, parquet_bytes(bumped), manifest_path)
    problems = verify_version(str(manifest_path)).problems
    assert f"{entry['validation']}: unreadable as a file of records (ArrowInvalid: " in "\n".join(problems), problems
    assert any("token_freq.parquet: the counts differ from a count of the train records" in p for p in problems)
    altered(Path(manifest["root"]) / entry["train"], b"not parquet either", manifest_path)
    problems = verify_version(str(manifest_path)).problems
    assert f"{entry['train']}: unreadable as a file of records" in "\n".join(problems), problems
    assert not any("token_freq.parquet" in p for p in problems), problems  # train read in part: not recounted


def test_a_share_of_zero_writes_no_validation_split(deployment: Path, simulator: Simulator) -> None:
    published = run_stages("v1", simulator, datasets=["temperatures"], validation_share=0)["temperatures"]
    manifest = json.loads(Path(published["manifest"]).read_text())
    assert "validation" not in manifest["splits"] and manifest["validation_share"] == 0.0
    assert not any("/validation/" in key for key in manifest["files"])
    assert verify_version(published["manifest"]).problems == []


def test_a_version_published_before_splits_and_vocab_still_verifies_and_reads(
    deployment: Path, simulator: Simulator
) -> None:
    """A manifest as this project wrote it before: no validation/, no vocab/, no counts files, no new fields."""
    from regen import read_training_data

    published = run_stages("v1", simulator, datasets=["temperatures"], validation_share=0)["temperatures"]
    manifest_path = Path(published["manifest"])
    manifest = json.loads(manifest_path.read_text())
    root = Path(manifest["root"])
    for key in [k for k in manifest["files"] if "/vocab/" in k or k.endswith("-token-freq.parquet")]:
        (root / key).unlink()
        del manifest["files"][key], manifest["sizes"][key]
    for name in ("validation_share", "vocab"):
        del manifest[name]
    for shard in manifest["shards"]:
        del shard["token_counts"]
    manifest_path.write_text(json.dumps(manifest))
    assert verify_version(str(manifest_path)).problems == []
    records = sum(batch.num_rows for batch in read_training_data(str(manifest_path)))
    assert records == manifest["records"] > 0


def test_the_report_shows_each_rejection_reason_with_an_example_and_the_draft_vocabularys_coverage(
    deployment: Path, simulator: Simulator
) -> None:
    published = run_stages("v1", simulator, datasets=["temperatures"])["temperatures"]
    manifest = json.loads(Path(published["manifest"]).read_text())
    report_html = Path(manifest["report"]["html"])
    report = json.loads(Path(manifest["report"]["json"]).read_text())
    page = report_html.read_text()
    rejected = {(r["stage"], r["reason"]): r for r in report["rejections"]}
    assert sum(r["count"] for r in rejected.values()) == manifest["prepare"]["dropped"] > 0  # B1's rows left out
    rows = [
        json.loads(line)
        for line in (
            Path(manifest["root"]) / next(k for k in manifest["files"] if k.endswith("rejected/prepare.jsonl"))
        )
        .read_text()
        .splitlines()
    ]
    for (stage, reason), entry in rejected.items():
        first = next(r for r in rows if r["reason"] == reason)  # the file's first row of that reason, as the example
        assert entry["example"] == (first["id"] or f"{first['source']}:{first['source_index']}")
        assert f"<td>{stage}</td><td>{reason}</td><td>{entry['count']}</td>" in page
    assert '<a href="report.json">report.json</a>' in page and "<pre>" not in page  # linked, not printed raw
    coverage_share = f"{100 * report['vocab']['coverage']:.2f}%"
    assert coverage_share in page and 'src="vocab.png"' in page
    assert (report_html.parent / "vocab.png").read_bytes()[:4] == b"\x89PNG"


def test_a_version_loads_with_hugging_face_datasets_in_one_call(
    deployment: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/data.md's one call: both splits, every column, as a trainer's data loader reads them."""
    from datasets import load_dataset

    monkeypatch.setenv("HF_DATASETS_CACHE", str(deployment / "hf-cache"))
    published = run_stages("v1", simulator, datasets=["temperatures"])["temperatures"]
    folder = Path(published["manifest"]).parent
    files = {split: str(folder / split / "*.parquet") for split in ("train", "validation")}
    loaded = load_dataset("parquet", data_files=files)  # some shards hold no validation record: files of no row
    rows = split_rows(published["manifest"])
    shards = json.loads(Path(published["manifest"]).read_text())["shards"]
    assert any(shard["validation_records"] == 0 for shard in shards)  # the case an empty row group broke
    for split in ("train", "validation"):
        assert loaded[split].num_rows == published["splits"][split] == len(rows[split]) > 0
        assert sorted(loaded[split]["id"]) == sorted(r["id"] for r in rows[split])
    first = loaded["train"][0]
    assert len(first["input_ids"]) == len(first["loss_mask"]) and sum(first["loss_mask"]) > 0


def test_without_torch_the_handoff_writes_no_specforge_file_and_the_version_still_verifies(
    deployment: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline's environment has no torch: the hand-off says how to convert, and writes nothing. (With torch,
    tests/parity/test_trainers_vocab.py loads the file as SpecForge's trainer does.)"""
    import sys

    from regen.stages.publish.vocab_files import write_specforge_mapping

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, whatever is installed
    published = run_stages("v1", simulator, datasets=["temperatures"])["temperatures"]
    assert write_specforge_mapping(published["manifest"]) is None
    vocab = Path(published["manifest"]).parent / "vocab"
    assert not (vocab / "specforge.pt").exists()
    mapping = {name: np.load(vocab / f"{name}.npy") for name in ("d2t", "t2d")}
    (vocab / "specforge.pt").write_bytes(torch_saved(mapping))  # as the hand-off writes it where torch is
    assert verify_version(published["manifest"]).problems == []  # the hand-off's copy is no stray


def test_where_torch_is_the_handoff_writes_the_versions_mapping_and_only_where_the_version_has_vocab(
    deployment: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in torch (this environment has none): the hand-off writes vocab/specforge.pt from the version's own .npy
    pair and verify accepts it; a version whose manifest lists no vocab/ gets none, torch or not."""
    import sys
    import types

    from regen.stages.publish import vocab_files

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setattr(vocab_files, "specforge_mapping", lambda d2t, t2d: torch_saved({"d2t": d2t, "t2d": t2d}))
    published = run_stages("v1", simulator, datasets=["temperatures"])["temperatures"]
    vocab = Path(published["manifest"]).parent / "vocab"
    mapping = {name: np.load(vocab / f"{name}.npy") for name in ("d2t", "t2d")}
    assert vocab_files.write_specforge_mapping(published["manifest"]) == str(vocab / "specforge.pt")
    assert (vocab / "specforge.pt").read_bytes() == torch_saved(mapping)
    assert verify_version(published["manifest"]).problems == []

    (vocab / "specforge.pt").unlink()
    manifest = json.loads(Path(published["manifest"]).read_text())
    manifest["files"] = {key: digest for key, digest in manifest["files"].items() if "/vocab/" not in key}
    Path(published["manifest"]).write_text(json.dumps(manifest))
    assert vocab_files.write_specforge_mapping(published["manifest"]) is None
    assert not (vocab / "specforge.pt").exists()


def test_verify_reads_the_handoff_s_specforge_copy_and_names_one_of_another_mapping(
    deployment: Path, simulator: Simulator
) -> None:
    """A trainer loads vocab/specforge.pt instead of the .npy pair: a copy left from another mapping (a version
    overwritten since), or one that is not torch's file, is named (read without torch: regen.torch_file)."""
    published = run_stages("v1", simulator, datasets=["temperatures"])["temperatures"]
    vocab = Path(published["manifest"]).parent / "vocab"
    d2t, t2d = np.load(vocab / "d2t.npy"), np.load(vocab / "t2d.npy")
    key = f"{vocab.relative_to(deployment / 'storage')}/specforge.pt"
    other = np.roll(t2d, 1)
    (vocab / "specforge.pt").write_bytes(
        torch_saved({"d2t": np.flatnonzero(other) - np.arange(len(d2t)), "t2d": other})
    )
    assert verify_version(published["manifest"]).problems == [
        f"{key}: its d2t and t2d are not the version's draft vocabulary"
    ]
    for dtype in (np.int32, np.float64):  # the right ids in another type (narrower, wider): not what trainers load
        (vocab / "specforge.pt").write_bytes(torch_saved({"d2t": d2t.astype(dtype), "t2d": t2d}))
        assert verify_version(published["manifest"]).problems == [
            f"{key}: its d2t are not the version's draft vocabulary"
        ], dtype
    (vocab / "specforge.pt").write_bytes(b"torch's bytes")
    [problem] = verify_version(published["manifest"]).problems
    assert problem.startswith(f"{key}: unreadable (not a torch file of plain tensors")
    (vocab / "specforge.pt").write_bytes(torch_saved({"d2t": d2t, "t2d": t2d}))
    assert verify_version(published["manifest"]).problems == []


def test_a_version_with_prompts_tokenized_before_source_keys_publishes_and_verifies(
    deployment: Path, simulator: Simulator
) -> None:
    """A dataset in parts, some tokenized by the release before source keys and finished by this one: its shards
    hold a source_key column of nulls. Export and verify decide those sides from the messages (they once read an
    empty list there, IndexError on every try), the same sides as a version with keys."""
    plan = {"endpoints": [simulator.url], "skip_unchanged": False, "datasets": ["every_turn"]}
    run = pipeline.RunSpec(**pipeline.plan(plan, "v1"))
    prepared = pipeline.finish_prepared(run, [pipeline.prepare_dataset(run, "every_turn")])
    root, location = Path(str(run.storage_root)), run.location("every_turn")
    record = json.loads((root / location.prepared).read_text())
    for shard in record["shards"]:
        path = root / ShardManifest.from_dict(shard).keys.prompts
        table = pq.read_table(path)
        column = table.schema.get_field_index("source_key")
        pq.write_table(table.set_column(column, "source_key", pa.nulls(table.num_rows, pa.string())), path)
        shard["prompts_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (root / location.prepared).write_text(json.dumps(record))
    for shard in each_shard(run, prepared):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    [summary] = prepared
    published = pipeline.publish_dataset(run, summary, [], pipeline.verify_dataset(run, summary))
    assert verify_version(published["manifest"]).problems == []
    keyed = run_stages("v2", simulator, datasets=["every_turn"])["every_turn"]
    for split in ("train", "validation"):
        ids = {r["id"] for r in split_rows(published["manifest"])[split]}
        assert ids == {r["id"] for r in split_rows(keyed["manifest"])[split]} and ids, split


def test_verify_reports_a_record_of_no_prompt_instead_of_failing(deployment: Path, simulator: Simulator) -> None:
    """A train record whose id is in none of its shard's prompts: one problem named, at any share (the side check
    once raised KeyError before the comparison with what was sent could name it)."""
    published = run_stages("v1", simulator, datasets=["temperatures"])["temperatures"]
    manifest_path = Path(published["manifest"])
    manifest = json.loads(manifest_path.read_text())
    root = Path(manifest["root"])
    entry = manifest["shards"][0]
    train = pq.read_table(root / entry["train"])
    ids = ["0" * 20, *train.column("id").to_pylist()[1:]]
    altered(root / entry["train"], parquet_bytes(train.set_column(0, "id", pa.array(ids, pa.string()))), manifest_path)
    problems = verify_version(str(manifest_path)).problems
    assert any(
        "1 records whose input_ids are not the prompt sent + the server's output (" + "0" * 20 in p for p in problems
    ), problems


def resumed(simulator: Simulator, dataset: str, **first: Any) -> dict[str, Any]:
    """A version whose first run (params `first`) prepared it and made one shard, then went red; resumed as the
    page's Resume button does (datasets and version only: today's defaults). Its published summary."""
    run = pipeline.RunSpec(
        **pipeline.plan({"endpoints": [simulator.url], "skip_unchanged": False, "datasets": [dataset], **first}, "v1")
    )
    [prepared] = pipeline.finish_prepared(run, [pipeline.prepare_dataset(run, dataset)])
    first_shard = next(each_shard(run, [prepared]))
    pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, first_shard)))
    with pytest.raises(Exception, match="not published: "):  # its other shards never ran: red
        pipeline.report(run, [], [])
    return run_stages("resume", simulator, datasets=[dataset], version="v1")[dataset]


def test_a_resumed_version_is_made_with_its_own_settings_not_the_resuming_runs(
    deployment: Path, simulator: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    """Prepared at share 0 and temperature 0.7 with review text, resumed at the config's share 0.5 and temperature
    1.0 without: every shard split, sampled and exported as the version says (a Resume once took today's: a
    validation/ split under a manifest saying 0, the later shards sampled at 1.0)."""
    earlier = len(simulator.records())  # the session's simulator: other tests asked for these samples too
    published = resumed(simulator, "every_turn", validation_share=0, temperature=0.7, export={"review_text": True})
    manifest = json.loads(Path(published["manifest"]).read_text())
    rows = split_rows(published["manifest"])
    assert manifest["validation_share"] == 0.0 and not rows["validation"] and len(rows["train"]) > 7
    assert manifest["sampling_params"]["temperature"] == 0.7
    assert all(row["text"] is not None for row in rows["train"])
    version_ids = {sample_of(row["id"]) for row in rows["train"]}
    sent = [
        r["sampling"]["temperature"] for r in simulator.records()[earlier:] if r["rid"].split("-")[0] in version_ids
    ]
    assert len(sent) >= len(rows["train"]) and set(sent) == {0.7}
    said = "every_turn version v1 is made with its own settings, not this run's: review_text: True (not False); "
    assert said + "temperature: 0.7 (not 1.0); validation_share: 0.0 (not 0.5)" in caplog.text
    assert verify_version(published["manifest"]).problems == []


def test_a_version_prepared_at_another_share_is_green_when_resumed(deployment: Path, simulator: Simulator) -> None:
    """Prepared at 0.3, resumed at the config's 0.5: split at 0.3 throughout, and verified (every Resume was red:
    "records not on their source prompt's side")."""
    published = resumed(simulator, "every_turn", validation_share=0.3)
    manifest = json.loads(Path(published["manifest"]).read_text())
    assert manifest["validation_share"] == 0.3 and published["splits"]["validation"] > 0
    assert verify_version(published["manifest"]).problems == []
