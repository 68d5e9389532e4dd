"""The small typed documents passed between tasks (XCom) and written beside the data.

They name storage keys, counts and checksums, never records. `to_dict`/`from_dict` give the JSON form XCom carries;
msgspec reads it into the types, so a required field missing or a field of the wrong type is refused naming it
(msgspec.ValidationError, a ValueError), and a field this version does not know is read past.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Self

import msgspec

from regen.layout import DatasetLocation, ShardKeys, is_report_file


@dataclass
class StageStats:
    """Counts of one stage over one unit of work; `total == kept + dropped` always holds."""

    total: int = 0
    kept: int = 0
    dropped_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by_reason.values())

    def keep(self) -> None:
        self.total += 1
        self.kept += 1

    def drop(self, reason: str) -> None:
        self.total += 1
        self.dropped_by_reason[reason] = self.dropped_by_reason.get(reason, 0) + 1

    def check(self) -> None:
        if self.total != self.kept + self.dropped:
            raise AssertionError(
                f"stats do not add up: total {self.total} != kept {self.kept} + dropped {self.dropped}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "kept": self.kept,
            "dropped": self.dropped,
            "dropped_by_reason": dict(sorted(self.dropped_by_reason.items())),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return msgspec.convert(data, cls)  # `dropped` is derived: read past

    @classmethod
    def merged(cls, parts: list[StageStats]) -> StageStats:
        reasons: Counter[str] = Counter()
        for part in parts:
            reasons.update(part.dropped_by_reason)
        return cls(total=sum(p.total for p in parts), kept=sum(p.kept for p in parts), dropped_by_reason=dict(reasons))


@dataclass(frozen=True)
class GenerationReport:
    """How one shard's generation went, over every try that generated (a killed try counts up to its last
    checkpoint): what the fleet utilization and the progress lines are computed from."""

    started_at: float  # unix time of the first request of the first try
    finished_at: float
    requests: int  # HTTP requests, retries included
    answered: int  # answers received, including those a killed try never checkpointed and a later try redid
    request_seconds: float  # summed over requests: time the fleet spent on this shard's requests
    output_tokens: int
    retries_by_cause: dict[str, int] = field(default_factory=dict)
    tries: int = 1  # task tries that sent requests
    prompt_tokens: int = 0  # of the answers received, as the server counted them (meta_info)
    cached_tokens: int = 0  # of those, what the server's prefix cache held (meta_info.cached_tokens): not prefilled
    ejections: int = 0  # endpoints ejected by the outlier detection (regen.sglang.fleet)
    # Server-side: the seconds the answers held a running slot (e2e_latency less queue_time, which SGLang sends with
    # --enable-metrics), and how many answers said so.
    slot_seconds: float = 0.0
    slot_timed: int = 0
    hints_off: dict[str, str] = field(default_factory=dict)  # hint -> why it failed (regen.hints): for the run report

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationReport:
        return msgspec.convert(data, cls)

    @classmethod
    def combined(cls, tries: list[GenerationReport]) -> GenerationReport | None:
        """One report over several tries (or shards): the window from the first request to the last answer, and
        every count summed."""
        if not tries:
            return None
        retries: Counter[str] = Counter()
        hints_off: dict[str, str] = {}
        for t in tries:
            retries.update(t.retries_by_cause)
            hints_off = t.hints_off | hints_off  # the first try's why of a hint that failed in several
        window: dict[str, Any] = {
            "started_at": min(t.started_at for t in tries),
            "finished_at": max(t.finished_at for t in tries),
        }
        sums: dict[str, Any] = {
            f.name: sum(getattr(t, f.name) for t in tries)
            for f in dataclasses.fields(cls)
            if f.name not in {*window, "retries_by_cause", "hints_off"}
        }
        sums = {name: round(total, 3) if isinstance(total, float) else total for name, total in sums.items()}
        return cls(**window, **sums, retries_by_cause=dict(retries), hints_off=hints_off)


@dataclass(frozen=True)
class ShardManifest:
    """One shard as it moves through generate, validate and export; each stage fills in its own fields."""

    location: DatasetLocation
    shard: int
    prompts_key: str
    prompts_sha256: str
    num_prompts: int
    raw_key: str | None = None
    train_key: str | None = None
    stats: dict[str, StageStats] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # key -> sha256 of what this shard wrote
    generation: GenerationReport | None = None  # None when the shard was already generated by an earlier attempt
    num_answers: int | None = None  # answers the shard asks for, when not one per prompt: on-policy turns
    # The longest answer prepare expects of it (an on-policy conversation: its turns' together), in tokens, where it
    # dealt the rows by length: the shard's place in the run's order across datasets (regen.pipeline.shards)
    longest_expected: int | None = None
    split_records: dict[str, int] = field(default_factory=dict)  # export's records per split ({}: exported before)

    @property
    def train_records(self) -> int:
        """Its train split's records (exported before validation/ existed: every kept record)."""
        return self.split_records.get("train", self.stats["export"].kept)

    @property
    def keys(self) -> ShardKeys:
        return self.location.shard(self.shard)

    @property
    def name(self) -> str:
        return self.keys.name

    def with_stage(self, stage: str, stats: StageStats, files: dict[str, str], **fields: Any) -> ShardManifest:
        stats.check()
        return dataclasses.replace(self, stats={**self.stats, stage: stats}, files={**self.files, **files}, **fields)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stats"] = {stage: s.to_dict() for stage, s in self.stats.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardManifest:
        return msgspec.convert(data, cls)


@dataclass(frozen=True)
class PreparedDataset:
    location: DatasetLocation
    shards: list[ShardManifest]
    stats: StageStats
    duplicates: int
    profile: dict[str, Any]
    token_roles: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    rows_read: int = 0  # source rows; stats count prompts, several per row with turns: every_assistant_turn
    # regen.version_inputs.dataset_inputs: what the version is made from
    inputs: dict[str, Any] = field(default_factory=dict)
    # regen.stages.prepare.eval_suites: the suites prompts were cleaned against (name, sha256) and each one's rejections
    decontamination: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            **own,
            "location": dataclasses.asdict(self.location),
            "shards": [s.to_dict() for s in self.shards],
            "stats": self.stats.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedDataset:
        return msgspec.convert({"rows_read": data["stats"]["total"], **data}, cls)  # rows_read: as written before it


@dataclass(frozen=True)
class PublishedManifest:
    """manifest.json: a published version. Written last, it names every file of the version with its sha256 and
    size, the shards, the counts of every stage, and what rendered and generated the prompts; the verifier, the
    page (`regen.ui.documents.ManifestView`, the fields it shows) and `regen verify` read it back."""

    dataset: str
    profile: dict[str, Any]  # the chat profile, with its template's and tokenizer's sha256
    token_roles: dict[str, Any]
    version: str
    root: str
    published_at: str
    prepare: dict[str, Any]  # the prepare stage's counts, rows_read and duplicates
    stages: dict[str, dict[str, Any]]  # generate, validate, export: StageStats.to_dict() each
    records: int
    # Fields later versions added have defaults: a manifest written before them still reads (the nightly's answer
    # lengths read the last version's).
    run_id: str | None = None  # None: published before manifests named their run
    splits: dict[str, int] = field(default_factory=dict)  # {}: published before the splits were counted apart
    validation_share: float | None = None  # None: published before validation/ existed (regen.holdout)
    vocab: dict[str, Any] = field(default_factory=dict)  # vocab/'s sizes and coverage; {}: published before it
    report: dict[str, Any] = field(default_factory=dict)  # its writer, and the report's json and html
    retokenize_drift: dict[str, Any] | None = None
    cost: dict[str, Any] = field(default_factory=dict)
    sampling_params: dict[str, Any] | None = None  # exactly what every /generate request sent
    seeds_honoured: bool | None = None  # whether the fleet applied each record's sampling_seed
    inputs: dict[str, Any] = field(default_factory=dict)  # regen.version_inputs: what the version is made from
    decontamination: dict[str, Any] = field(default_factory=dict)  # the suites, with their sha256
    fleet: list[dict[str, Any]] = field(default_factory=list)
    verified: dict[str, Any] = field(default_factory=dict)  # bytes and records read back, and when
    shards: list[dict[str, Any]] = field(default_factory=list)  # regen.stages.publish.publish.shard_entries
    files: dict[str, str] = field(default_factory=dict)  # every file of the version -> sha256
    sizes: dict[str, int] = field(default_factory=dict)  # every file -> bytes

    @property
    def writer(self) -> str | None:
        """The publisher whose report this manifest names (None: published before reports had writers)."""
        return str(self.report["writer"]) if self.report.get("writer") else None

    def data_files(self) -> dict[str, str]:
        """The version's data, without its report (which is drawn again on every publish)."""
        return {k: v for k, v in self.files.items() if not is_report_file(k)}

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, body: bytes | str) -> PublishedManifest:
        """A manifest as written, by this version or an earlier one (fields it lacks take their defaults; fields
        this version does not know are left out), its types checked: a field of the wrong type raises a ValueError
        naming it (msgspec.ValidationError, `... - at $.records`)."""
        return msgspec.json.decode(body, type=cls)
