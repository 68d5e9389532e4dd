"""The deployment's configuration file: datasets, run defaults and model profiles. Validated when loaded; errors say
what to fix. The file as a whole (`RegenConfig`: its governance and alerts sections, the checks across sections) and
its loading are here; the `defaults` section is regen.config.defaults, `datasets` and `decontamination`
regen.config.datasets.

`REGEN_CONFIG` points at the file (each deployment has its own); the default is the project's `config/regen.yaml`.
Relative dataset paths, tokenizer directories and chat-template files are resolved against the config file's folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# The sections' models live in modules of their own; their names are re-exported here, where callers look for them.
from regen.config.datasets import (
    DATASET_NAME,
    DatasetConfig,
    DecontaminationConfig,
    EvalSuite,
    HubDataset,
    SourceFormat,
)
from regen.config.defaults import CostConfig, Defaults, ExportConfig, Sampling, ValidationConfig
from regen.errors import FinalError, did_you_mean
from regen.governance import default_endpoint_patterns, endpoint_allowed, storage_root_within
from regen.layout import RESERVED
from regen.profiles import Profile, builtin_profiles, lookup
from regen.storage import S3Config, StorageRoot

__all__ = [
    "DATASET_NAME",
    "DEFAULT_CONFIG",
    "AlertsConfig",
    "ConfigError",
    "CostConfig",
    "DatasetConfig",
    "DecontaminationConfig",
    "Defaults",
    "EvalSuite",
    "ExportConfig",
    "Governance",
    "HubDataset",
    "RegenConfig",
    "S3Config",
    "Sampling",
    "SourceFormat",
    "ValidationConfig",
    "config_path",
    "explain",
    "find_profile",
    "load_config",
]

DEFAULT_CONFIG = Path(__file__).resolve().parents[3] / "config" / "regen.yaml"


class ConfigError(FinalError, ValueError):
    pass


class Governance(BaseModel):
    """What a run may choose, decided by the deployment: whoever may trigger a run may publish training data
    (regen.governance). Checked at plan, before anything is written or sent."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    allowed_endpoints: list[str] = Field(
        default_factory=list,
        description="host or host:port patterns, shell-style (`sglang-*.internal:30000`, `10.0.0.*`; no port: any "
        "port); empty: exactly the hosts and ports of defaults.endpoints",
    )
    allowed_storage_roots: list[str] = Field(
        default_factory=list,
        description="roots a run may write under (s3://bucket/prefix, or a folder relative to this file); empty: "
        "defaults.storage_root",
    )


class AlertsConfig(BaseModel):
    """A failed task always says which dataset or shard failed and why in its log; with `email_to`, also by mail
    through the Airflow SMTP connection `smtp_conn_id`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    email_to: list[str] = Field(default_factory=list, description="also mail every task failure to these addresses")
    smtp_conn_id: str = Field("smtp_default", description="the Airflow SMTP connection the mail goes through")


class MetricsConfig(BaseModel):
    """Live metrics (regen.metrics, docs/operations.md#metrics): each task pushes its series to a Prometheus
    Pushgateway. None: nothing is pushed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pushgateway: str | None = Field(
        None, pattern=r"^https?://[^/\s]+/?$", description="the Pushgateway's URL, e.g. http://pushgateway:9091"
    )
    push_interval_s: float = Field(5.0, gt=0, le=60, description="a running task pushes this often")


class RegenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    defaults: Defaults = Field(Defaults(), description="a run's settings where its params leave them out")
    alerts: AlertsConfig = Field(AlertsConfig(), description="failure mail")
    metrics: MetricsConfig = Field(MetricsConfig(), description="live metrics for Prometheus (a Pushgateway)")
    governance: Governance = Field(Governance(), description="what a run may choose: checked at plan")
    decontamination: DecontaminationConfig = Field(
        DecontaminationConfig(), description="eval suites whose items no prompt may hold: checked at prepare"
    )
    datasets: dict[str, DatasetConfig] = Field(
        min_length=1, description="the datasets the trigger form offers, by name (a storage key)"
    )
    profiles: dict[str, Profile] = Field(
        default_factory=dict,
        description="target models beside the built-in kimi-k2.5 and kimi-k2.5-mini: a second model is an entry here",
    )
    base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _names_are_safe(self) -> RegenConfig:
        for name in self.datasets:
            if not DATASET_NAME.match(name):
                raise ValueError(
                    f"dataset name {name!r}: use letters, digits, '_', '.', '-' (it becomes a storage key)"
                )
            if name in RESERVED["dataset"]:
                raise ValueError(f"dataset name {name!r} is a folder the storage layout uses itself: choose another")
        for name, profile in self.profiles.items():
            if name in builtin_profiles():
                raise ValueError(f"profile {name!r} is built in; give yours another name")
            if profile.name not in ("", name):
                raise ValueError(f"profiles.{name}: its name is the key it is declared under, not {profile.name!r}")
            Profile.model_validate({**profile.model_dump(), "name": name})  # a name that is a safe storage key
        outside = [str(e) for e in self.defaults.endpoints if not endpoint_allowed(e, self.allowed_endpoints)]
        if outside:
            raise ValueError(f"defaults.endpoints {outside} are outside governance.allowed_endpoints: allow them too")
        if not any(storage_root_within(self.storage_root, r) for r in self.allowed_storage_roots):
            raise ValueError("defaults.storage_root is outside governance.allowed_storage_roots: allow it too")
        if self.defaults.profile not in self.profile_names:
            raise ValueError(
                f"defaults.profile: unknown profile {self.defaults.profile!r}; known: {', '.join(self.profile_names)}"
            )
        return self

    @property
    def profile_names(self) -> list[str]:
        return sorted({*builtin_profiles(), *self.profiles})

    def profile(self, name: str) -> Profile:
        """A built-in or declared profile (paths resolved against this file); ConfigError naming the ones there are."""
        declared = {
            key: p.model_copy(update={"name": key}).with_paths(self.resolve) for key, p in self.profiles.items()
        }
        try:
            return lookup(name, declared)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @property
    def allowed_endpoints(self) -> list[str]:
        return list(self.governance.allowed_endpoints) or default_endpoint_patterns(self.defaults.endpoints)

    @property
    def allowed_storage_roots(self) -> list[StorageRoot]:
        """Each parsed once (regen.storage.root), a local one against this file's folder."""
        roots = self.governance.allowed_storage_roots or [self.defaults.storage_root]
        return [StorageRoot.parse(root, self.base_dir.resolve()) for root in roots]

    @property
    def storage_root(self) -> StorageRoot:
        """defaults.storage_root, parsed (a local one against this file's folder)."""
        return StorageRoot.parse(self.defaults.storage_root, self.base_dir.resolve())

    def dataset(self, name: str) -> DatasetConfig:
        try:
            return self.datasets[name]
        except KeyError:
            raise ConfigError(f"unknown dataset {name!r}; the config declares: {', '.join(self.datasets)}") from None

    def resolve(self, path: str) -> str:
        """Dataset paths and a local storage root are relative to the config file; URIs pass through."""
        return self.resolve_against(self.base_dir, path)

    @staticmethod
    def resolve_against(folder: Path, path: str) -> str:
        if "://" in path or Path(path).is_absolute():
            return path
        return str((folder / path).resolve())


def config_path() -> Path:
    return Path(os.environ.get("REGEN_CONFIG", DEFAULT_CONFIG))


def load_config(path: Path | None = None) -> RegenConfig:
    path = path or config_path()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist (set REGEN_CONFIG to your deployment's file)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping with 'defaults' and 'datasets'")
    try:
        return RegenConfig(**raw, base_dir=path.resolve().parent)
    except ValidationError as e:
        problems = "\n".join(f"  {problem}" for problem in explain(e, RegenConfig))
        raise ConfigError(f"config file {path} is invalid:\n{problems}") from None


def explain(error: ValidationError, model: type[BaseModel]) -> list[str]:
    """Each problem of a validation error as one line, `where: what`, with the close field name for a typo
    (`datasets.C1_multiturn.turn: not a field; did you mean 'turns'?`)."""
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "(the file)"
        if problem["type"] == "extra_forbidden":
            known = _fields_at(model, problem["loc"][:-1])
            lines.append(f"{where}: not a field here{did_you_mean(problem['loc'][-1], known)}")
        else:
            lines.append(f"{where}: {problem['msg'].removeprefix('Value error, ')}")
    return lines


def _fields_at(model: Any, path: tuple[Any, ...]) -> list[str]:
    """The field names of the model found at `path` inside `model` (through dicts of models and tagged unions, as
    pydantic's error locations run), or none."""
    candidates = [model]
    for part in path:
        models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if any(part in m.model_fields for m in models):
            candidates = _members(next(m for m in models if part in m.model_fields).model_fields[part].annotation)
        elif tagged := [m for m in models if "format" in m.model_fields and part in _tags(m)]:
            candidates = tagged  # a tagged union's member, named by its tag (`tool_calls.sections`)
        elif dicts := [c for c in candidates if get_origin(c) is dict]:
            candidates = _members(get_args(dicts[0])[1])  # a key of a dict of models (a dataset's name)
        else:
            return []
    return [name for c in candidates if isinstance(c, type) and issubclass(c, BaseModel) for name in c.model_fields]


def _tags(model: type[BaseModel]) -> tuple[Any, ...]:
    """The values a tagged union member's `format` Literal allows (`sections`, `tagged_json`, ...)."""
    return get_args(model.model_fields["format"].annotation)


def _members(annotation: Any) -> list[Any]:
    """The types an annotation admits: through Optional, unions and Annotated."""
    if get_origin(annotation) in (Union, UnionType, Annotated):
        return [member for arg in get_args(annotation) for member in _members(arg)]
    return [annotation]


def find_profile(name: str) -> Profile:
    """A built-in profile, or one the deployment's config declares."""
    return lookup(name) if name in builtin_profiles() else load_config().profile(name)
