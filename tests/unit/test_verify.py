"""A published version proves itself: the verifier reads it back whole (every file's sha256 and size, every record's
invariants), on local storage and through boto3 against an S3 HTTP API; a version is never changed silently."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen.__main__ import main
from regen.chat import ChatRenderer
from regen.manifest import PreparedDataset
from regen.stages.publish.publish import ChangedSinceVerified, VersionExists, run_publish, verify_contents
from regen.storage import LocalStorage, S3Storage
from regen.verify import VerificationFailed, read_training_data, unlisted, verify_published, verify_version
from regen.version_inputs import latest_published
from tests.conftest import Simulator, finish_shards, prepare_sample

BUCKET = "regen-verify"


@pytest.fixture(scope="module")
def published(
    tmp_path_factory: pytest.TempPathFactory, renderer: ChatRenderer, simulator: Simulator
) -> tuple[PreparedDataset, LocalStorage, str]:
    """B1_glaive in two shards, generated, validated, exported and published on local storage."""
    prepared, storage = prepare_sample(tmp_path_factory.mktemp("published"), renderer, "B1_glaive", 20)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    summary = run_publish(prepared, storage, fleet=[{"url": simulator.url}])
    return prepared, storage, summary["manifest"]


def copy_version(tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]) -> tuple[Path, dict[str, Any]]:
    """A copy of the published root to alter; returns the copy's manifest path and manifest (root rewritten)."""
    _, storage, manifest_uri = published
    root = tmp_path / "copy"
    shutil.copytree(storage.root, root)
    path = root / Path(manifest_uri).relative_to(storage.root)
    manifest = json.loads(path.read_text())
    manifest["root"] = str(root)
    path.write_text(json.dumps(manifest))
    return path, manifest


def test_a_published_version_verifies_clean(published: tuple[PreparedDataset, LocalStorage, str]) -> None:
    _, storage, manifest_uri = published
    result = verify_version(manifest_uri)
    manifest = result.manifest
    assert result.problems == []
    assert result.records_checked == manifest["splits"]["train"] + manifest["splits"]["truncated"] > 0
    assert result.bytes_read == sum(manifest["sizes"].values()) == sum(storage.size(k) for k in manifest["files"])
    listed = set(manifest["files"])
    for shard in manifest["shards"]:  # generate's, validate's and export's files of every shard, with their sizes
        assert {shard["prompts"], shard["raw"], shard["train"]} <= listed
    assert any("/rejected/" in key for key in listed) and set(manifest["sizes"]) == listed


def train_records(manifest: dict[str, Any]) -> tuple[str, list[dict[str, Any]], pa.Schema]:
    """The first shard's train file: its key, its records as rows to alter, and its schema to write them back."""
    key = manifest["shards"][0]["train"]
    table = pq.read_table(Path(manifest["root"]) / key)
    return key, table.to_pylist(), table.schema


def rewrite(path: Path, manifest: dict[str, Any], key: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """The split file `key` written anew from `rows`, and the manifest at `path` updated to its sha256 and size."""
    file = Path(manifest["root"]) / key
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), file)
    manifest["files"][key] = hashlib.sha256(file.read_bytes()).hexdigest()
    manifest["sizes"][key] = file.stat().st_size
    path.write_text(json.dumps(manifest))


def test_records_that_break_an_invariant_are_found_even_when_their_checksums_match(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    """A train file rewritten with one output id changed, one mask shifted and one id past the vocabulary, and the
    manifest updated to its new sha256 and size: only reading the records can tell."""
    path, manifest = copy_version(tmp_path, published)
    key, rows, schema = train_records(manifest)
    rows[0]["input_ids"][-2] += 1  # the server's output, altered
    rows[1]["loss_mask"][rows[1]["prompt_len"]] = 0  # the boundary moved by one
    rows[2]["input_ids"][3] = manifest["token_roles"]["vocab_size"]
    rewrite(path, manifest, key, rows, schema)

    [problem] = verify_version(str(path)).problems  # a file that breaks the structure is not compared further
    vocab = manifest["token_roles"]["vocab_size"]
    assert problem == f"{key}: 1 records with ids outside the vocabulary of {vocab} ({rows[2]['id']})"
    rows[2]["input_ids"][3] = 7  # inside the vocabulary again, and so a prompt altered: the others are found
    rewrite(path, manifest, key, rows, schema)
    problems = verify_version(str(path)).problems
    assert any(f"whose loss mask is not the prompt boundary ({rows[1]['id']})" in p for p in problems), problems
    [sent] = [p for p in problems if "not the prompt sent + the server's output" in p]
    assert "2 records whose" in sent and rows[0]["id"] in sent and rows[2]["id"] in sent, sent  # output, prompt


def test_split_counts_and_files_the_manifest_does_not_list_are_named(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    """The manifest's truncated/ count is checked against the records read, and every file in the version's folder
    that the manifest does not list (bookkeeping aside) is named, records or files only."""
    path, manifest = copy_version(tmp_path, published)
    truncated = manifest["splits"]["truncated"]
    manifest["splits"]["truncated"] = truncated + 1
    path.write_text(json.dumps(manifest))
    assert verify_version(str(path)).problems == [
        f"truncated/ holds {truncated} records, manifest says {truncated + 1}"
    ]
    manifest["splits"]["truncated"] = truncated
    trained = manifest["splits"]["train"]
    manifest["splits"]["train"] = trained - 1  # fewer than it holds, as well as more
    path.write_text(json.dumps(manifest))
    assert verify_version(str(path)).problems == [f"train/ holds {trained} records, manifest says {trained - 1}"]
    manifest["splits"]["train"] = trained
    path.write_text(json.dumps(manifest))
    folder = path.parent
    (folder / "train" / "shard-00099.parquet").write_bytes(b"not listed")
    (folder / "notes.txt").write_text("not listed either")
    prefix = str(folder.relative_to(manifest["root"]))
    stray = f"2 files in the version's folder are not listed in the manifest: {prefix}/notes.txt, {prefix}/train/"
    for records in (True, False):
        [problem] = verify_version(str(path), records=records).problems
        assert problem == stray + "shard-00099.parquet"


def to_s3(
    s3_client: Any, tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> tuple[str, S3Storage]:
    """The published version uploaded through boto3 to the S3 API, its manifest's root pointed there."""
    _, storage, manifest_uri = published
    s3_client.create_bucket(Bucket=BUCKET)
    s3 = S3Storage(BUCKET, "runs", s3_client)
    for key in storage.list_keys(""):
        s3.put_file(key, Path(storage.uri(key)))
    manifest_key = str(Path(manifest_uri).relative_to(storage.root))
    manifest = json.loads(storage.get_bytes(manifest_key))
    s3.put_bytes(manifest_key, json.dumps({**manifest, "root": s3.root_uri}).encode())
    return s3.uri(manifest_key), s3


def test_altered_truncated_and_missing_objects_on_s3_are_each_named(
    tmp_path: Path,
    s3_client: Any,
    s3_endpoint: str,
    published: tuple[PreparedDataset, LocalStorage, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    manifest_uri, s3 = to_s3(s3_client, tmp_path, published)
    manifest = json.loads(s3.get_bytes(manifest_uri.removeprefix(f"{s3.root_uri}/")))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)  # the CLI builds its client as boto3 does by default
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert main(["verify", manifest_uri]) == 0
    assert json.loads(capsys.readouterr().out)["records_checked"] > 0

    train, raw, prompts = (manifest["shards"][1][k] for k in ("train", "raw", "prompts"))
    body = bytearray(s3.get_bytes(train))
    body[len(body) // 2] ^= 0xFF  # one bit pattern flipped, same size
    s3.put_bytes(train, bytes(body))
    s3.put_bytes(raw, s3.get_bytes(raw)[:-10])  # cut short
    s3.delete(prompts)
    assert main(["verify", manifest_uri, "--files-only"]) == 1
    err = capsys.readouterr().err
    assert f"{train}: sha256 " in err and f"{raw}: {manifest['sizes'][raw] - 10} bytes, manifest says" in err
    assert f"{prompts}: missing" in err and "3 problems" in err


def test_a_multipart_upload_round_trips_with_its_checksums(tmp_path: Path, s3_client: Any) -> None:
    """Over boto3's 8 MB threshold the upload is multipart, every part checksummed by S3; it reads back the same."""
    s3_client.create_bucket(Bucket=BUCKET)
    s3 = S3Storage(BUCKET, "big", s3_client)
    local = tmp_path / "big.bin"
    local.write_bytes(bytes(range(256)) * (9 * 4096 + 7))  # 9 MiB and a little
    digest = s3.put_file("train/big.bin", local)
    head = s3_client.head_object(Bucket=BUCKET, Key="big/train/big.bin", ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-2") and head["ChecksumSHA256"]  # two parts, checksummed
    streamed = hashlib.sha256()
    for chunk in s3.iter_chunks("train/big.bin"):
        streamed.update(chunk)
    assert streamed.hexdigest() == digest == hashlib.sha256(local.read_bytes()).hexdigest()
    assert s3.size("train/big.bin") == local.stat().st_size


def test_a_trainer_reads_verified_batches_and_nothing_of_a_tampered_file(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    _, _, manifest_uri = published
    batches = list(read_training_data(manifest_uri, columns=["id", "input_ids", "loss_mask"]))
    manifest = json.loads(Path(manifest_uri).read_text())
    assert sum(b.num_rows for b in batches) == manifest["records"]
    path, copied = copy_version(tmp_path, published)
    second = Path(copied["root"]) / copied["shards"][1]["train"]
    second.write_bytes(second.read_bytes()[:-1])
    read: list[Any] = []
    with pytest.raises(VerificationFailed, match="bytes, manifest says"):
        for batch in read_training_data(str(path)):
            read.append(batch)
    assert sum(b.num_rows for b in read) == copied["shards"][0]["records"]  # the first shard only


def test_a_published_version_is_never_changed_silently(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    prepared, storage, manifest_uri = published
    before = Path(manifest_uri).read_bytes()
    again = run_publish(prepared, storage, fleet=[])  # a retried publish: the same data, nothing written
    assert Path(manifest_uri).read_bytes() == before and again["manifest"] == manifest_uri
    extra = f"{prepared.location.prefix}/extra.txt"
    other = dataclasses.replace(prepared, files={**prepared.files, extra: storage.put_bytes(extra, b"other data\n")})
    with pytest.raises(VersionExists, match=r"already published with other data.*overwrite_version"):
        run_publish(other, storage, fleet=[])
    assert Path(manifest_uri).read_bytes() == before
    run_publish(other, storage, fleet=[], overwrite=True)
    assert extra in json.loads(Path(manifest_uri).read_text())["files"]
    storage.delete(extra)
    run_publish(prepared, storage, fleet=[], overwrite=True)  # put back for the other tests of the module
    assert verify_version(manifest_uri).problems == []


def test_two_publishers_at_once_one_manifest_and_the_first_data_intact(
    published: tuple[PreparedDataset, LocalStorage, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a check-then-write loses: a second publisher with other data checks before the first one's manifest
    lands, then writes after it. The manifest is created only if absent, so the second is refused and the first's
    manifest stays as it was; a second publisher with the same data finds the version published and succeeds."""
    from regen.stages.publish import publish

    prepared, storage, manifest_uri = published
    before = Path(manifest_uri).read_bytes()
    extra = f"{prepared.location.prefix}/extra-race.txt"
    other = dataclasses.replace(prepared, files={**prepared.files, extra: storage.put_bytes(extra, b"other\n")})
    checks: list[str] = []
    real = publish._published_before

    def checked_too_early(*args: Any, **kwargs: Any) -> bytes | None:
        checks.append("check")
        return None if len(checks) == 1 else real(*args, **kwargs)  # the first check saw no manifest yet

    monkeypatch.setattr(publish, "_published_before", checked_too_early)
    with pytest.raises(VersionExists, match="already published with other data"):
        run_publish(other, storage, fleet=[])
    assert Path(manifest_uri).read_bytes() == before and len(checks) == 2
    checks.clear()
    storage.delete(extra)  # the other data's file: a stray in this version's folder, which its verify would name
    same = run_publish(prepared, storage, fleet=[])  # same data, also checking too early: the version stands
    assert Path(manifest_uri).read_bytes() == before and same["manifest"] == manifest_uri
    assert verify_version(manifest_uri).problems == []


def test_a_publish_killed_before_its_manifest_is_completed_by_the_rerun(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shards and the report are uploaded, then the task dies before the manifest lands: the version is not
    there for anyone; the rerun publishes it whole, and it verifies clean."""
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 30)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    create = storage.create

    def killed_at_the_manifest(key: str, data: bytes) -> str:
        if key.endswith("manifest.json"):
            raise ConnectionResetError("the task died here")
        return create(key, data)

    monkeypatch.setattr(storage, "create", killed_at_the_manifest)
    with pytest.raises(ConnectionResetError):
        run_publish(prepared, storage, fleet=[])
    manifest_key, reports = prepared.location.manifest, f"{prepared.location.prefix}/report/"
    assert any(k.endswith("/report.json") for k in storage.list_keys(reports)) and not storage.exists(manifest_key)
    monkeypatch.setattr(storage, "create", create)
    summary = run_publish(prepared, storage, fleet=[])
    result = verify_version(summary["manifest"])
    assert result.problems == [] and summary["records"] == 48 == result.records_checked
    assert set(storage.list_keys(reports)) <= set(result.manifest["files"])  # the killed try's report is gone


def test_the_cli_takes_dataset_and_version_under_a_root(published: tuple[PreparedDataset, LocalStorage, str]) -> None:
    prepared, storage, _ = published
    location = prepared.location
    target = f"{location.dataset}/{location.version}"
    assert main(["verify", target, "--root", storage.root_uri, "--profile", location.profile]) == 0
    assert main(["verify", target]) == 2  # no root: says what to give


def test_the_cli_finds_the_profile_and_names_what_is_missing(
    published: tuple[PreparedDataset, LocalStorage, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`regen verify B1_glaive --root R` without --profile: the one profile under R holding B1_glaive is taken; a
    dataset nothing holds, or no published version, is named with what to give."""
    prepared, storage, _ = published
    location = prepared.location
    assert main(["verify", location.dataset, "--root", storage.root_uri]) == 0  # the latest, its profile found
    assert main(["verify", "B9_nothing", "--root", storage.root_uri]) == 2
    assert "give --profile (no profile there holds B9_nothing)" in capsys.readouterr().err
    assert main(["verify", location.dataset, "--root", storage.root_uri, "--profile", "qwen3.6"]) == 2
    assert "has no published version under" in capsys.readouterr().err


def test_the_cli_says_when_the_s3_api_is_gone_instead_of_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo-s3` prints s3:// manifests; once its S3 API has stopped, verifying one says so in a sentence."""
    from tools.devstack import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert main(["verify", "s3://eagle3-regen/demo/kimi-k2.5-mini/B1_glaive/v1/manifest.json"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("regen verify: cannot reach the S3 API") and "Traceback" not in error


def test_data_that_does_not_read_back_as_written_is_never_published(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """The verifier reads a finished version back before any manifest names it: a damaged file leaves no manifest
    and no latest.json, so neither a trainer nor the nightly skip ever takes the version as published."""
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 30)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    train = Path(storage.uri(prepared.shards[0].keys.split("train")))
    body = train.read_bytes()
    train.write_bytes(body[:100] + bytes([body[100] ^ 1]) + body[101:])  # one bit flipped, the size unchanged
    with pytest.raises(VerificationFailed, match=f"{prepared.shards[0].keys.split('train')}: sha256"):
        run_publish(prepared, storage, fleet=[])
    location = prepared.location
    assert not storage.exists(location.manifest) and not storage.exists(location.latest)
    train.write_bytes(body)
    assert run_publish(prepared, storage, fleet=[])["verified"]["records_checked"] == 48


def test_publish_refuses_data_that_changed_after_it_was_verified(
    published: tuple[PreparedDataset, LocalStorage, str],
) -> None:
    prepared, storage, manifest_uri = published
    verified = verify_contents(prepared, storage)
    before = Path(manifest_uri).read_bytes()
    extra = f"{prepared.location.prefix}/extra.txt"
    other = dataclasses.replace(prepared, files={**prepared.files, extra: storage.put_bytes(extra, b"late\n")})
    try:
        with pytest.raises(ChangedSinceVerified, match="changed after they were verified"):
            run_publish(other, storage, fleet=[], overwrite=True, verified=verified)
        assert Path(manifest_uri).read_bytes() == before
    finally:
        storage.delete(extra)


def test_a_file_written_again_after_it_was_verified_is_never_published(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """The shard manifests still name the sha256 the verifier read, but the file under them was written again (a
    task of an earlier try still writing): with a fresh size, with its size unchanged, or even with the very bytes
    read. Publish refuses each; once verified again, the manifest names exactly the bytes the verifier read."""
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 30)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    verified = verify_contents(prepared, storage)
    train = Path(storage.uri(prepared.shards[0].keys.split("train")))
    body = train.read_bytes()
    for rewritten in (body + b"\0", body[:100] + bytes([body[100] ^ 1]) + body[101:], body):
        train.write_bytes(rewritten)
        with pytest.raises(ChangedSinceVerified, match="changed after they were verified"):
            run_publish(prepared, storage, fleet=[], verified=verified)
        assert not storage.exists(prepared.location.manifest)
    published = run_publish(prepared, storage, fleet=[], verified=verify_contents(prepared, storage))
    result = verify_version(published["manifest"])
    assert result.problems == [] and result.manifest["sizes"][str(train.relative_to(storage.root))] == len(body)


def test_latest_json_pins_the_manifest_by_its_sha256(published: tuple[PreparedDataset, LocalStorage, str]) -> None:
    """latest.json moves only after the manifest landed, and names its sha256: a manifest edited afterwards is caught
    by the CLI, by a trainer given the sha256, and by the nightly skip, which then regenerates the dataset."""
    prepared, storage, manifest_uri = published
    location = prepared.location
    latest = json.loads(storage.get_bytes(location.latest))
    original = Path(manifest_uri).read_bytes()
    assert latest["manifest_sha256"] == hashlib.sha256(original).hexdigest()
    assert latest_published(storage, location.profile, location.dataset) == latest
    args = ["verify", location.dataset, "--root", storage.root_uri, "--profile", location.profile, "--files-only"]
    assert main(args) == 0
    edited = json.loads(original)
    edited["sampling_params"] = {"temperature": 0.0}  # files and records untouched: only the pin can tell
    Path(manifest_uri).write_text(json.dumps(edited, indent=1))
    try:
        assert main(args) == 1
        assert verify_version(manifest_uri).problems == []  # without the pin the edit passes: it is what pins catch
        with pytest.raises(VerificationFailed, match=r"latest\.json says"):
            next(read_training_data(manifest_uri, manifest_sha256=latest["manifest_sha256"]))
        assert latest_published(storage, location.profile, location.dataset) is None
    finally:
        Path(manifest_uri).write_bytes(original)


@pytest.mark.parametrize("whole_root", [True, False], ids=["the-root-copied", "the-version-folder-alone"])
def test_a_copy_is_verified_as_the_copy_it_is(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator, whole_root: bool
) -> None:
    """A trainer copies a version to its own place (the manifest untouched, its `root` naming the original): the
    verifier reads the copy. An untouched copy passes with the original moved away; one byte more in a copy's train
    file fails, whatever the original holds."""
    prepared, storage = prepare_sample(tmp_path / "original", renderer, "B2_opencodeinstruct", 10)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    manifest_uri = run_publish(prepared, storage, fleet=[])["manifest"]
    version = Path(manifest_uri).parent
    copy = tmp_path / "trainer" / "data"
    shutil.copytree(storage.root if whole_root else version, copy)
    copied = copy / (version.relative_to(storage.root) if whole_root else ".") / "manifest.json"
    assert json.loads(copied.read_text())["root"] == str(storage.root)  # the manifest as published
    storage.root.rename(tmp_path / "moved-away")
    clean = verify_version(str(copied))
    assert clean.problems == [] and clean.records_checked > 0
    train = next(p for p in copied.parent.rglob("train/*.parquet"))
    train.write_bytes(train.read_bytes() + b"\0")
    tampered = verify_version(str(copied))
    assert any("train/" in p and "manifest says" in p for p in tampered.problems), tampered.problems
    (tmp_path / "moved-away").rename(storage.root)  # the original, untouched, still verifies
    assert verify_version(manifest_uri).problems == []


def test_token_counts_compare_equal_up_to_trailing_zeros_whichever_is_shorter() -> None:
    """A counts array ends at its last counted id or at the vocabulary: the same counts either way."""
    import numpy as np

    from regen.verify_vocab import same_counts

    assert same_counts(np.array([1, 2, 0, 0]), np.array([1, 2])) and same_counts(
        np.array([1, 2]), np.array([1, 2, 0, 0])
    )
    assert not same_counts(np.array([1, 2, 0, 3]), np.array([1, 2])) and not same_counts(
        np.array([1]), np.array([1, 0, 5])
    )


def test_strays_past_the_fifth_are_counted_not_named(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    for n in range(12):
        storage.put_bytes(f"v1/stray-{n:02d}.txt", b"not listed")
    named = ", ".join(f"v1/stray-{n:02d}.txt" for n in range(5))
    assert unlisted("v1", [], storage) == [
        f"12 files in the version's folder are not listed in the manifest: {named} and 7 more"
    ]


def test_records_with_a_mask_of_another_length_no_prompt_or_no_output_are_named(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    """The structure checked before any comparison, each problem with the records it names."""
    path, manifest = copy_version(tmp_path, published)
    key, rows, schema = train_records(manifest)
    rows[0]["loss_mask"] = rows[0]["loss_mask"][:-1]
    rows[5]["loss_mask"] = [*rows[5]["loss_mask"], 1]
    rows[1]["prompt_len"] = 0
    rows[2]["prompt_len"] = len(rows[2]["input_ids"])  # all prompt: no output
    rows[3]["prompt_len"] = len(rows[3]["input_ids"]) - 1  # one output id: still a record
    rows[4].update(input_ids=[], loss_mask=[], prompt_len=0)  # neither
    rows[6]["prompt_len"] = -1
    rows[7]["prompt_len"] = 1  # a one-id prompt: still a record
    rewrite(path, manifest, key, rows, schema)
    assert verify_version(str(path)).problems == [
        f"{key}: 2 records whose mask length differs ({rows[0]['id']}, {rows[5]['id']})",
        f"{key}: 4 records with no prompt or no output ({rows[1]['id']}, {rows[2]['id']}, {rows[4]['id']}, "
        f"{rows[6]['id']})",
    ]


def test_a_held_out_file_that_breaks_the_structure_still_has_its_split_counted(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    """Only a train file that breaks the structure goes uncounted (its token counts cannot be trusted); the records
    of another split's file were read, so its split's count is compared all the same."""
    path, manifest = copy_version(tmp_path, published)
    shard = manifest["shards"][0]
    train, rows, schema = train_records(manifest)
    rows = rows[:3]
    rows[0]["prompt_len"] = 0
    key = shard["validation"] = train.replace("/train/", "/validation/")
    (Path(manifest["root"]) / key).parent.mkdir()
    shard["validation_records"], manifest["splits"]["validation"] = 3, 4
    rewrite(path, manifest, key, rows, schema)
    assert verify_version(str(path)).problems == [
        f"{key}: 1 records with no prompt or no output ({rows[0]['id']})",
        "validation/ holds 3 records, manifest says 4",
    ]


def test_a_dataset_two_profiles_hold_is_verified_with_the_profile_given(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str], capsys: pytest.CaptureFixture[str]
) -> None:
    prepared, storage, _ = published
    root, dataset = tmp_path / "root", prepared.location.dataset
    shutil.copytree(storage.root, root)
    (root / "qwen3.6" / dataset / "v1").mkdir(parents=True)
    (root / "qwen3.6" / dataset / "v1" / "manifest.json").write_text("{}")
    assert main(["verify", dataset, "--root", str(root)]) == 2
    assert f"give --profile (profiles holding {dataset}: kimi-k2.5-mini, qwen3.6)" in capsys.readouterr().err


def test_a_record_kept_as_ok_must_end_with_an_eos_id(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    path, manifest = copy_version(tmp_path, published)
    key, rows, schema = train_records(manifest)
    rows[1]["input_ids"][-1] = 39  # an ordinary token where the EOS was
    rewrite(path, manifest, key, rows, schema)
    problems = verify_version(str(path)).problems
    assert f"{key}: 1 records kept as ok that do not end with an EOS id ({rows[1]['id']})" in problems, problems


def test_a_split_file_holding_more_or_fewer_records_than_its_shard_says_is_named(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    path, manifest = copy_version(tmp_path, published)
    shard = manifest["shards"][0]
    held = shard["records"]
    for said in (held - 1, held + 1):
        shard["records"] = said
        path.write_text(json.dumps(manifest))
        problems = verify_version(str(path)).problems
        assert f"{shard['train']}: {held} records, manifest says {said}" in problems, problems


def test_the_shards_records_are_summed_against_the_manifests_either_way(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    path, manifest = copy_version(tmp_path, published)
    held = manifest["records"]
    for said in (held - 1, held + 1):
        manifest["records"] = said
        path.write_text(json.dumps(manifest))
        assert f"shards hold {held} records, manifest says {said}" in verify_version(str(path)).problems


def test_a_whole_version_is_summed_up_without_problems(published: tuple[PreparedDataset, LocalStorage, str]) -> None:
    manifest_uri = published[2]
    manifest = json.loads(Path(manifest_uri).read_text())
    assert verify_published(manifest_uri) == {
        "manifest": manifest_uri,
        "dataset": manifest["dataset"],
        "version": manifest["version"],
        "records": manifest["records"],
        "files": len(manifest["files"]),
        "bytes": sum(manifest["sizes"].values()),
        "records_checked": manifest["splits"]["train"] + manifest["splits"]["truncated"],
    }


def test_a_missing_split_file_is_named_missing_and_nothing_else_about_it(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    path, manifest = copy_version(tmp_path, published)
    shard = manifest["shards"][0]
    (Path(manifest["root"]) / shard["train"]).unlink()
    assert verify_version(str(path)).problems == [f"{shard['train']}: missing"]  # nor its split counted short


def test_ids_at_and_far_past_the_vocabulary_are_both_outside_it(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    path, manifest = copy_version(tmp_path, published)
    key, rows, schema = train_records(manifest)
    vocab = manifest["token_roles"]["vocab_size"]
    rows[0]["input_ids"][2], rows[1]["input_ids"][2] = vocab, vocab + 1000
    rewrite(path, manifest, key, rows, schema)
    assert verify_version(str(path)).problems == [
        f"{key}: 2 records with ids outside the vocabulary of {vocab} ({rows[0]['id']}, {rows[1]['id']})"
    ]


def test_a_shard_listing_no_raw_file_has_its_records_not_compared_and_said_so(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    path, manifest = copy_version(tmp_path, published)
    shard = manifest["shards"][0]
    del manifest["files"][shard["raw"]], manifest["sizes"][shard["raw"]]
    del shard["raw"]
    path.write_text(json.dumps(manifest))
    said = (
        f"{shard['train']}: no prompts/ and raw/ listed for {shard['shard']}: records not compared with what was sent"
    )
    assert said in verify_version(str(path)).problems


def test_a_version_named_under_a_root_is_that_version_not_the_latest(
    published: tuple[PreparedDataset, LocalStorage, str], capsys: pytest.CaptureFixture[str]
) -> None:
    prepared, storage, _ = published
    location = prepared.location
    target = f"{location.dataset}/v999"  # no such version: the latest would verify clean
    assert main(["verify", target, "--root", storage.root_uri, "--profile", location.profile]) != 0
    assert "v999" in capsys.readouterr().err


def test_a_shards_file_missing_from_the_manifests_files_is_named(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    for kind in ("train", "raw", "prompts"):
        path, manifest = copy_version(tmp_path / kind, published)
        shard = manifest["shards"][0]
        del manifest["files"][shard[kind]], manifest["sizes"][shard[kind]]
        path.write_text(json.dumps(manifest))
        said = f"{shard[kind]}: part of {shard['shard']} but not listed in the manifest's files"
        assert said in verify_version(str(path), records=False).problems


def test_a_split_file_of_more_than_256_records_is_compared_by_its_count_not_its_identity(
    tmp_path: Path, published: tuple[PreparedDataset, LocalStorage, str]
) -> None:
    """Python keeps one object for each small int only: a count past 256 read from the file and the manifest's are two
    objects of one value."""
    path, manifest = copy_version(tmp_path, published)
    key, rows, schema = train_records(manifest)
    many = (rows * (300 // len(rows) + 1))[:300]
    shard = manifest["shards"][0]
    manifest["records"] += len(many) - shard["records"]
    manifest["splits"]["train"] += len(many) - shard["records"]
    shard["records"] = len(many)
    rewrite(path, manifest, key, many, schema)
    problems = verify_version(str(path)).problems
    assert not [said for said in problems if "manifest says" in said], problems
    shard["records"] += 1
    manifest["records"] += 1
    path.write_text(json.dumps(manifest))
    assert f"{key}: 300 records, manifest says 301" in verify_version(str(path)).problems
