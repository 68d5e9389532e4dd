"""The documents tasks hand each other (XCom) and keep beside the data read back into their types: what was written
comes back equal, a field of the wrong type or a missing one is refused naming it, and what an earlier version
wrote still reads."""

from __future__ import annotations

import json

import pytest

from regen.layout import DatasetLocation
from regen.manifest import GenerationReport, PreparedDataset, ShardManifest, StageStats
from regen.stages.prepare.parts import PartEntry, PartsIndex

LOCATION = DatasetLocation("/root", "kimi-k2.5-mini", "B1_glaive", "v1")
SHARD = ShardManifest(
    LOCATION,
    3,
    "kimi-k2.5-mini/B1_glaive/v1/prompts/shard-00003.parquet",
    "ab" * 32,
    20,
    stats={"generate": StageStats(20, 19, {"server_rejected": 1})},
    generation=GenerationReport(1.0, 2.5, 21, 20, 30.25, 4000, {"timeout": 1}),
)


def through_json(data: dict[str, object]) -> dict[str, object]:
    return dict(json.loads(json.dumps(data)))


def test_a_shard_manifest_comes_back_equal_from_its_json() -> None:
    assert ShardManifest.from_dict(through_json(SHARD.to_dict())) == SHARD
    prepared = PreparedDataset(LOCATION, [SHARD], StageStats(20, 20), 0, {"name": "p"}, {}, rows_read=21)
    assert PreparedDataset.from_dict(through_json(prepared.to_dict())) == prepared


@pytest.mark.parametrize(
    "change,named",
    [
        pytest.param({"num_prompts": "20"}, r"Expected `int`, got `str` - at `\$\.num_prompts`", id="wrong-type"),
        pytest.param(
            {"stats": {"generate": {"total": 1, "kept": None}}},
            r"Expected `int`, got `null` - at `\$\.stats\[\.\.\.\]\.kept`",
            id="nested",
        ),
        pytest.param({"location": {**vars(LOCATION), "dataset": "../up"}}, "cannot name a storage folder", id="unsafe"),
    ],
)
def test_a_shard_manifest_of_the_wrong_shape_is_refused_naming_the_field(change: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ShardManifest.from_dict({**through_json(SHARD.to_dict()), **change})


def test_what_an_earlier_version_wrote_still_reads() -> None:
    shard = {**through_json(SHARD.to_dict()), "a_field_of_a_later_version": 1}
    assert ShardManifest.from_dict(shard) == SHARD
    prepared = through_json(PreparedDataset(LOCATION, [], StageStats(7, 7), 0, {}, {}).to_dict())
    del prepared["rows_read"], prepared["inputs"], prepared["decontamination"]
    assert PreparedDataset.from_dict(prepared).rows_read == 7  # before rows_read: a prompt a row
    index = PartsIndex((PartEntry("k", "s", 8, 0),), 8, StageStats(8, 8), 8, 0, {}, {}, 4, {}, {}, {}, None)
    written = through_json(index.to_dict())
    written["to_tokenise"] = written.pop("to_tokenize")  # the spelling before 2026-12
    del written["decontamination"]  # before decontamination
    assert PartsIndex.from_dict(written) == index
