"""The small typed documents passed between tasks (XCom) and written beside the data.

They name storage keys, counts and checksums, never records. `to_dict`/`from_dict` give the JSON form XCom carries.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Self

VERSION_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # starts with a letter or digit: never `.` or `..`


def version_from_run_id(run_id: str) -> str:
    """A storage-safe version that stays the same for every retry and clear of one DAG run."""
    version = VERSION_UNSAFE.sub("-", run_id).strip("-._")
    if not version:
        raise ValueError(f"run id {run_id!r} gives an empty version")
    return version[:128]


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
        return cls(total=data["total"], kept=data["kept"], dropped_by_reason=dict(data["dropped_by_reason"]))

    @classmethod
    def merged(cls, parts: list[StageStats]) -> StageStats:
        reasons: Counter[str] = Counter()
        for part in parts:
            reasons.update(part.dropped_by_reason)
        return cls(total=sum(p.total for p in parts), kept=sum(p.kept for p in parts), dropped_by_reason=dict(reasons))


@dataclass(frozen=True)
class GenerationReport:
    """How one shard's generation went, over every try that generated (a killed try counts up to its last
    checkpoint): what the fleet utilisation and the progress lines are computed from."""

    started_at: float  # unix time of the first request of the first try
    finished_at: float
    requests: int  # HTTP requests, retries included
    answered: int  # answers received, including those a killed try never checkpointed and a later try redid
    request_seconds: float  # summed over requests: time the fleet spent on this shard's requests
    output_tokens: int
    retries_by_cause: dict[str, int] = field(default_factory=dict)
    tries: int = 1  # task tries that sent requests

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationReport:
        return cls(**data)

    @classmethod
    def combined(cls, tries: list[GenerationReport]) -> GenerationReport | None:
        if not tries:
            return None
        retries: Counter[str] = Counter()
        for t in tries:
            retries.update(t.retries_by_cause)
        return cls(
            started_at=min(t.started_at for t in tries),
            finished_at=max(t.finished_at for t in tries),
            requests=sum(t.requests for t in tries),
            answered=sum(t.answered for t in tries),
            request_seconds=round(sum(t.request_seconds for t in tries), 3),
            output_tokens=sum(t.output_tokens for t in tries),
            retries_by_cause=dict(retries),
            tries=sum(t.tries for t in tries),
        )


@dataclass(frozen=True)
class DatasetLocation:
    """Where one dataset version lives: {root}/{profile}/{dataset}/{version}/."""

    root: str
    profile: str
    dataset: str
    version: str

    def __post_init__(self) -> None:
        """Each name becomes a folder of every key: one that could climb out (`..`, `/`, an absolute path) or that
        S3 and file systems spell differently is refused, whatever checked it upstream."""
        for part, name in (("profile", self.profile), ("dataset", self.dataset), ("version", self.version)):
            if not SAFE_NAME.match(name):
                raise ValueError(f"{part} {name!r} cannot name a storage folder: use letters, digits, '_', '.', '-'")

    @property
    def prefix(self) -> str:
        return f"{self.profile}/{self.dataset}/{self.version}"

    def key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))


def _shard_name(shard: int) -> str:
    return f"shard-{shard:05d}"


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

    @property
    def name(self) -> str:
        return _shard_name(self.shard)

    def key(self, folder: str, suffix: str) -> str:
        return self.location.key(folder, f"{self.name}{suffix}")

    def with_stage(self, stage: str, stats: StageStats, files: dict[str, str], **fields: Any) -> ShardManifest:
        stats.check()
        return dataclasses.replace(self, stats={**self.stats, stage: stats}, files={**self.files, **files}, **fields)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stats"] = {stage: s.to_dict() for stage, s in self.stats.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardManifest:
        return cls(
            **{
                **data,
                "location": DatasetLocation(**data["location"]),
                "stats": {stage: StageStats.from_dict(s) for stage, s in data["stats"].items()},
                "generation": GenerationReport.from_dict(data["generation"]) if data.get("generation") else None,
            }
        )


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
    inputs: dict[str, Any] = field(default_factory=dict)  # regen.inputs.dataset_inputs: what the version is made from

    def to_dict(self) -> dict[str, Any]:
        return {
            "location": dataclasses.asdict(self.location),
            "shards": [s.to_dict() for s in self.shards],
            "stats": self.stats.to_dict(),
            "rows_read": self.rows_read,
            "duplicates": self.duplicates,
            "profile": self.profile,
            "token_roles": self.token_roles,
            "files": self.files,
            "inputs": self.inputs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedDataset:
        return cls(
            location=DatasetLocation(**data["location"]),
            shards=[ShardManifest.from_dict(s) for s in data["shards"]],
            stats=StageStats.from_dict(data["stats"]),
            duplicates=data["duplicates"],
            profile=data["profile"],
            token_roles=data["token_roles"],
            files=data.get("files", {}),
            rows_read=data.get("rows_read", data["stats"]["total"]),
            inputs=data.get("inputs", {}),
        )
