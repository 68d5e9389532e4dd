"""The deployment's configuration file: datasets, run defaults and model profiles. Validated when loaded; errors say
what to fix.

`REGEN_CONFIG` points at the file (each deployment has its own); the default is the project's `config/regen.yaml`.
Relative dataset paths, tokenizer directories and chat-template files are resolved against the config file's folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from regen.errors import FinalError, did_you_mean
from regen.governance import default_endpoint_patterns, endpoint_address, endpoint_allowed, storage_root_within
from regen.layout import RESERVED
from regen.profiles import Profile, builtin_profiles, lookup
from regen.storage import S3Config

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "regen.yaml"


class ConfigError(FinalError, ValueError):
    pass


class Sampling(BaseModel):
    """Every sampling parameter is sent explicitly: unset ones would come from the model's generation_config."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_new_tokens: int = Field(2048, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0.0, le=1.0)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("top_k must be -1 (all tokens) or at least 1")
        return value

    def as_params(self) -> dict[str, float | int | bool]:
        return {
            **self.model_dump(),
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            "min_new_tokens": 0,
            "n": 1,
            "ignore_eos": False,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
        }


SourceFormat = Literal["auto", "openai_messages", "sharegpt", "glaive", "input_output", "alpaca", "prompt"]


class HubDataset(BaseModel):
    """A Hugging Face dataset: a hub `id` (streamed) or a `path` written by `Dataset.save_to_disk`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str | None = None
    path: str | None = None
    subset: str | None = None
    split: str = "train"
    revision: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> HubDataset:
        if (self.id is None) == (self.path is None):
            raise ValueError("hf: give exactly one of 'id' (a hub dataset) or 'path' (a dataset saved to disk)")
        if self.path is not None and (self.subset is not None or self.revision is not None):
            raise ValueError("hf: 'subset' and 'revision' apply to a hub 'id', not to a dataset saved to disk")
        return self


class DatasetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    paths: list[str] | None = Field(None, min_length=1)
    hf: HubDataset | None = None
    format: SourceFormat = "auto"
    # final: the last assistant turn; every_assistant_turn: each, with the dataset's history; on_policy: each, with the
    # answers regenerated for the turns before it (regen.on_policy)
    turns: Literal["final", "every_assistant_turn", "on_policy"] = "final"
    # Each prompt answered at each temperature (null: the run's), samples_per_prompt times, each with its own seed.
    samples_per_prompt: int = Field(1, ge=1, le=64)
    temperatures: list[float] | None = Field(None, min_length=1)
    # A tool result's turn header: the `name` the data gives, or none (as OpenAI-SDK clients send them, rendered
    # `tool`), which is what production renders; from_call: named after the function of the call it answers, for
    # datasets whose clients send names that the rows left out.
    tool_result_names: Literal["as_given", "from_call"] = "as_given"
    description: str = ""

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if (self.paths is None) == (self.hf is None):
            raise ValueError("a dataset needs exactly one source: 'paths' (files, globs, s3:// URIs) or 'hf'")
        if self.temperatures is not None:
            if any(t < 0 for t in self.temperatures):
                raise ValueError(f"temperatures {self.temperatures}: each must be 0 or more")
            if len(set(self.temperatures)) != len(self.temperatures):
                raise ValueError(f"temperatures {self.temperatures}: each once (samples_per_prompt repeats them)")
        return self


class ExportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    jsonl: bool = Field(False, description="also write each split as JSON Lines (input_ids, loss_mask)")
    review_text: bool = Field(False, description="add a decoded `text` column for people reviewing samples")


class ValidationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    render_check_fraction: float = Field(0.01, gt=0.0, le=1.0, description="prompts per shard re-rendered at validate")
    render_check_minimum: int = Field(16, ge=1)
    retokenize_fraction: float = Field(0.05, ge=0.0, le=1.0, description="records whose re-tokenisation is measured")
    retokenize_minimum: int = Field(16, ge=0, description="and at least this many per shard")


class CostConfig(BaseModel):
    """What generation costs: GPU-hours come from the fleet (each server's tp_size x dp_size GPUs, from its server
    info) and the time requests held its running slots; with a price, the report gives the cost per 1M training
    tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu_hour_price: float | None = Field(None, ge=0, description="price of one GPU-hour; null: GPU-hours only")
    currency: str = "USD"
    gpus_per_endpoint: int | None = Field(
        None, ge=1, description="when a server does not report tp_size/dp_size (a router's worker out of reach)"
    )


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    profile: str = "kimi-k2.5-mini"
    endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:30000"], min_length=1)
    storage_root: str = "var/storage"
    shard_size: int = Field(2000, ge=1)
    # Concurrency is set for the fleet: `shard_tasks` shard tasks generate at once (the sglang_fleet pool's slots),
    # each holding an equal share of `in_flight`, so one shard's tail still leaves the others feeding the servers.
    in_flight: int = Field(256, ge=1, description="requests in flight across the fleet")
    shard_tasks: int = Field(4, ge=1, description="shard tasks generating at once: the sglang_fleet pool's slots")
    request_timeout_s: float = Field(3600.0, gt=0)
    max_attempts: int = Field(5, ge=1)
    fleet_wait_s: float = Field(120.0, gt=0, description="how long a shard waits for an evicted fleet to come back")
    checkpoint_s: float = Field(
        1.0, gt=0, le=60, description="finished answers are flushed this often: a killed task redoes at most these"
    )
    checkpoint_every: int = Field(1024, ge=1, description="or as soon as this many wait (bounds the buffer)")
    tokenize_workers: int | None = Field(None, ge=1, description="prepare's tokeniser processes; null: all cores")
    # A dataset with more prompts is tokenised in parts of about this many (whole shards), one mapped prepare_part
    # task each, so that workers share it: its one reader still dedupes every row.
    prepare_part_prompts: int = Field(50_000, ge=1, description="prompts per prepare part, in whole shards")
    sampling: Sampling = Sampling()
    export: ExportConfig = ExportConfig()
    validation: ValidationConfig = ValidationConfig()
    s3: S3Config = S3Config()
    cost: CostConfig = CostConfig()
    schedule: str | None = Field(None, description="cron or preset for nightly runs; null: triggered runs only")
    # Airflow's retries for transient faults (user errors never retry); the delay doubles each try, up to 10 min.
    task_retries: int = Field(3, ge=0)
    retry_delay_s: float = Field(30.0, gt=0)
    verify_poll_s: float = Field(
        30.0, gt=0, description="how often the triggerer asks whether a dataset's own shards finished (no slot held)"
    )
    # Mapped shard tasks per stage in one run. Beyond it, consecutive shards are grouped, several per task, handled
    # in turn: the scheduler's work per loop grows with a run's task instances (bench/bench_scheduler.py), and Airflow
    # maps at most [core] max_map_length (1024) anyway.
    shard_task_limit: int = Field(256, ge=1, le=1024)

    sglang_conn_id: str = Field(
        "sglang_default",
        description="Airflow connection with the fleet's API key (servers started with --api-key): its password for "
        "every endpoint, its extra's api_keys {base URL: key} per endpoint; no such connection: no key is sent",
    )

    @field_validator("endpoints")
    @classmethod
    def _base_urls(cls, endpoints: list[str]) -> list[str]:
        for url in endpoints:
            endpoint_address(url)  # a ValueError says what is wrong with it
        return [url.rstrip("/") for url in endpoints]


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
    email_to: list[str] = Field(default_factory=list)
    smtp_conn_id: str = "smtp_default"


class RegenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    defaults: Defaults = Defaults()
    alerts: AlertsConfig = AlertsConfig()
    governance: Governance = Governance()
    datasets: dict[str, DatasetConfig] = Field(min_length=1)
    # Target models beside the built-in kimi-k2.5 and kimi-k2.5-mini: a second model is an entry here, not code.
    profiles: dict[str, Profile] = Field(default_factory=dict)
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
        outside = [url for url in self.defaults.endpoints if not endpoint_allowed(url, self.allowed_endpoints)]
        if outside:
            raise ValueError(f"defaults.endpoints {outside} are outside governance.allowed_endpoints: allow them too")
        if not any(
            storage_root_within(self.resolve(self.defaults.storage_root), r) for r in self.allowed_storage_roots
        ):
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
    def allowed_storage_roots(self) -> list[str]:
        return [self.resolve(root) for root in self.governance.allowed_storage_roots or [self.defaults.storage_root]]

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
