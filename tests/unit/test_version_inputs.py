"""The last version's answer lengths, as the next version's reader holds them: a table on local disk by sample id,
gone once the reader is done with it, and gone too when reading them fails."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from regen.config import DatasetConfig
from regen.layout import DatasetLocation, latest_key
from regen.manifest import PublishedManifest
from regen.storage import LocalStorage, write_table
from regen.version_inputs import (
    answer_lengths,
    canonical_digest,
    dataset_inputs,
    latest_of_another_profile,
    latest_published,
    unchanged_since,
)

LAST = DatasetLocation("/unused", "kimi-k2.5-mini", "B1_glaive", "v1")


@pytest.fixture(autouse=True)
def own_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables go to a temp folder of this test's own: other tests' readers make theirs in the shared one."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


def lengths_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("regen-answer-lengths-*"))


def published(storage: LocalStorage, verdicts: dict[str, dict[str, int]]) -> dict[str, str]:
    """A version whose manifest names these verdict files (key -> sample id -> output_len); its latest.json entry."""
    location = DatasetLocation(storage.root_uri, LAST.profile, LAST.dataset, LAST.version)
    files = {}
    for key, lengths in verdicts.items():
        if lengths:
            table = pa.table({"id": list(lengths), "output_len": pa.array(list(lengths.values()), pa.int32())})
            files[key] = write_table(storage, key, table)
        else:
            files[key] = "0" * 64  # named, never written
    manifest = PublishedManifest("B1_glaive", {}, {}, "v1", storage.root_uri, "2026-12-01", {}, {}, 0)
    storage.put_bytes(location.manifest, PublishedManifest(**{**vars(manifest), "files": files}).to_json())
    return {"version": "v1"}


def test_the_lengths_are_read_by_sample_id_into_a_table_removed_on_exit(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    prefix = f"{LAST.profile}/{LAST.dataset}/v1/reports"
    latest = published(
        storage,
        {
            f"{prefix}/shard-00000-verdicts.parquet": {"a#0": 900, "b#0": 12},
            f"{prefix}/shard-00001-verdicts.parquet": {"c#0": 40},
        },
    )
    before = lengths_folders()
    location = DatasetLocation(storage.root_uri, LAST.profile, LAST.dataset, "v2")
    with answer_lengths(storage, latest, location) as lengths:
        assert len(lengths) == 3 and dict(lengths) == {"a#0": 900, "b#0": 12, "c#0": 40}
        assert lengths.get("new#0") is None and "b#0" in lengths
        with pytest.raises(KeyError):
            lengths["new#0"]
        assert len(lengths_folders() - before) == 1  # on disk, not in memory
    assert lengths_folders() == before
    with answer_lengths(storage, None, location) as none:  # a first version: nothing known
        assert len(none) == 0 and not none


def test_a_verdicts_file_that_cannot_be_read_fails_and_leaves_no_table(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    prefix = f"{LAST.profile}/{LAST.dataset}/v1/reports"
    latest = published(
        storage, {f"{prefix}/shard-00000-verdicts.parquet": {"a#0": 1}, f"{prefix}/shard-00001-verdicts.parquet": {}}
    )
    before = lengths_folders()
    location = DatasetLocation(storage.root_uri, LAST.profile, LAST.dataset, "v2")
    with pytest.raises(FileNotFoundError):
        answer_lengths(storage, latest, location)
    assert lengths_folders() == before


def test_a_first_version_borrows_the_newest_version_another_profile_published(tmp_path: Path) -> None:
    """Another target model's last version of the same dataset, the newest by logical date, marked with its profile;
    never this profile's own, nor a version whose manifest is gone, nor a folder that is no profile's name."""
    storage = LocalStorage(tmp_path)

    def publish(profile: str, version: str, logical_date: str, manifest: bool = True) -> None:
        if manifest:
            storage.put_bytes(DatasetLocation(storage.root_uri, profile, "chats", version).manifest, b"{}")
        entry = {"version": version, "logical_date": logical_date, "inputs_digest": profile}
        storage.put_bytes(latest_key(profile, "chats"), json.dumps(entry).encode())

    assert latest_of_another_profile(storage, "kimi-k2.5", "chats") is None
    publish("kimi-k2.5", "v9", "2026-12-05T00:00:00+00:00")  # this profile's own: never borrowed
    assert latest_of_another_profile(storage, "kimi-k2.5", "chats") is None
    publish("kimi-k2", "v2", "2026-12-01T00:00:00+00:00")
    publish("qwen3", "v4", "2026-12-03T00:00:00+00:00")
    publish("glm-4", "v7", "2026-12-04T00:00:00+00:00", manifest=False)  # its manifest is gone
    storage.put_bytes("Not A Profile!/chats/latest.json", b"{}")
    assert latest_of_another_profile(storage, "kimi-k2.5", "chats") == {
        "version": "v4",
        "logical_date": "2026-12-03T00:00:00+00:00",
        "inputs_digest": "qwen3",
        "profile": "qwen3",
    }
    assert latest_of_another_profile(storage, "qwen3", "chats")["profile"] == "kimi-k2.5"  # type: ignore[index]


def test_the_eval_suites_are_an_input_and_what_they_rejected_is_not() -> None:
    """The suites (their names and content) decide what a version holds; the count each rejected follows from them
    and the source, and is not an input of its own."""
    dataset = DatasetConfig.model_validate({"paths": ["chats.jsonl"], "format": "sharegpt"})

    def inputs(suites: dict[str, str], rejected: dict[str, int], ngram: int = 13) -> dict[str, object]:
        settings = {"ngram": ngram, "threshold": 0.5, "min_item_words": 8}  # the record prepare writes, and counts
        record = {**settings, "suites": suites, "rejected_by_suite": rejected}
        return dataset_inputs(dataset, {}, {}, None, {"hf://org/chats": "abc"}, record)

    first = inputs({"gsm8k": "d1"}, {"gsm8k": 3})
    assert first["decontamination"] == {"ngram": 13, "threshold": 0.5, "min_item_words": 8, "suites": {"gsm8k": "d1"}}
    assert inputs({"gsm8k": "d1"}, {"gsm8k": 5})["digest"] == first["digest"]
    assert inputs({"gsm8k": "d2"}, {"gsm8k": 3})["digest"] != first["digest"]
    assert inputs({"gsm8k": "d1"}, {"gsm8k": 3}, ngram=8)["digest"] != first["digest"]


def test_a_latest_entry_whose_manifest_is_not_the_one_published_is_ignored(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    manifest = DatasetLocation(storage.root_uri, "kimi-k2.5", "chats", "v1").manifest
    storage.put_bytes(manifest, b"{}")
    for digest, found in [("f" * 64, False), ("0" * 64, False), (hashlib.sha256(b"{}").hexdigest(), True)]:
        entry = {"version": "v1", "manifest_sha256": digest, "inputs_digest": "x"}
        storage.put_bytes(latest_key("kimi-k2.5", "chats"), json.dumps(entry).encode())
        assert (latest_published(storage, "kimi-k2.5", "chats") == entry) is found


def test_a_nightly_skips_only_on_the_same_digest() -> None:
    for last, now in [("f" * 64, "0" * 64), ("0" * 64, "f" * 64)]:
        assert not unchanged_since({"version": "v1", "inputs_digest": last}, "chats", {"digest": now})
    assert unchanged_since({"version": "v1", "inputs_digest": "a" * 64}, "chats", {"digest": "a" * 64})
    assert not unchanged_since(None, "chats", {"digest": "a" * 64})
    assert not unchanged_since({"version": "v1", "inputs_digest": None}, "chats", {"digest": None})


def test_the_digest_of_the_same_inputs_does_not_depend_on_their_order() -> None:
    assert canonical_digest({"a": 1, "b": [2, {"c": 3, "d": 4}]}) == canonical_digest(
        {"b": [2, {"d": 4, "c": 3}], "a": 1}
    )
    assert canonical_digest({"a": 1}) != canonical_digest({"a": 2})


def test_versions_are_ordered_by_their_instants_whatever_their_zones(tmp_path: Path) -> None:
    """A logical date without a zone is UTC's (an entry written before zones were kept); one with a zone is read as
    that instant: 23:00 at UTC-5 is after midnight UTC of the next day."""
    storage = LocalStorage(tmp_path)
    for profile, version, when in [
        ("kimi-k2", "v1", "2026-12-03T00:00:00"),
        ("qwen3", "v2", "2026-12-02T23:00:00-05:00"),
    ]:
        storage.put_bytes(DatasetLocation(storage.root_uri, profile, "chats", version).manifest, b"{}")
        storage.put_bytes(latest_key(profile, "chats"), json.dumps({"version": version, "logical_date": when}).encode())
    assert latest_of_another_profile(storage, "kimi-k2.5", "chats")["version"] == "v2"  # type: ignore[index]
