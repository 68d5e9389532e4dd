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

from regen.endpoints import Endpoint, EndpointUrl
from regen.errors import FinalError, did_you_mean
from regen.governance import default_endpoint_patterns, endpoint_allowed, storage_root_within
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
    max_new_tokens: int = Field(
        2048, ge=1, description="longest answer in tokens; a longer one goes to the flagged truncated/ split"
    )
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="nucleus sampling, in (0, 1]")
    top_k: int = Field(-1, description="-1 = all tokens, else at least 1")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="in [0, 1]; every sampling value is sent explicitly")

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
    id: str | None = Field(None, description="a hub dataset, streamed (one of `id` or `path`)")
    path: str | None = Field(None, description="a folder written by `Dataset.save_to_disk`")
    subset: str | None = Field(None, description="the hub dataset's subset (config name)")
    split: str = Field("train", description="the split to read")
    revision: str | None = Field(
        None,
        description="the hub revision to pin; without one the dataset cannot be compared and is regenerated nightly",
    )

    @model_validator(mode="after")
    def _one_source(self) -> HubDataset:
        if (self.id is None) == (self.path is None):
            raise ValueError("hf: give exactly one of 'id' (a hub dataset) or 'path' (a dataset saved to disk)")
        if self.path is not None and (self.subset is not None or self.revision is not None):
            raise ValueError("hf: 'subset' and 'revision' apply to a hub 'id', not to a dataset saved to disk")
        return self


class DatasetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    paths: list[str] | None = Field(
        None,
        min_length=1,
        description="local files, globs or s3:// URIs (globs too): .jsonl/.ndjson, .json (array or JSON Lines), "
        ".parquet, optionally .gz/.zst; read as a stream. One of `paths` or `hf`",
    )
    hf: HubDataset | None = Field(None, description="a Hugging Face dataset instead of `paths`")
    format: SourceFormat = Field(
        "auto",
        description="auto: per row, by its fields (messages, conversations, chat, instruction, input, prompt); "
        "input_output is OpenCodeInstruct's (other columns kept as metadata)",
    )
    turns: Literal["final", "every_assistant_turn", "on_policy"] = Field(
        "final",
        description="final: the last assistant turn is regenerated, history kept; every_assistant_turn: one sample "
        "per assistant turn, with the dataset's conversation up to it; on_policy: every assistant turn, turn by turn, "
        "each after the target's own answers to the turns before it (regen.on_policy)",
    )
    samples_per_prompt: int = Field(
        1,
        ge=1,
        le=64,
        description="each prompt answered this many times at each temperature, every sample with its own id "
        "(`<prompt id>@t<temperature>#<index>`) and a sampling_seed derived from it; 1 with no temperatures keeps the "
        "prompt's id and sends no seed",
    )
    temperatures: list[float] | None = Field(
        None, min_length=1, description="temperatures to answer each prompt at, each once; null: the run's"
    )
    tool_result_names: Literal["as_given", "from_call"] = Field(
        "as_given",
        description="a tool result's turn header: as_given, the name the data gives or `tool` without one (what "
        "production renders for OpenAI-SDK clients); from_call: the function of the call it answers",
    )
    description: str = Field("", description="free text, shown with the dataset")

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


class EvalSuite(BaseModel):
    """An eval suite prompts are cleaned against (regen.datasets.eval_suites): a file's items, or a built-in one."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=DATASET_NAME.pattern, description="how rejections and the manifest name the suite")
    path: str = Field(description="a .jsonl, .json or .parquet file (local, or s3://), or builtin:humaneval")
    field: str = Field("prompt", description="the item's text, a dotted path (turns; conversation.0.content)")
    id_field: str | None = Field(None, description="the item's id, a dotted path; null: its position, #1 on")


class DecontaminationConfig(BaseModel):
    """Prompts holding an eval item are rejected at prepare (`eval_overlap`), compared by hashed word n-grams."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    suites: list[EvalSuite] = Field(default_factory=list, description="none: no prompt is checked")
    ngram: int = Field(13, ge=4, le=64, description="words per n-gram (13, as GPT-3's contamination study)")
    threshold: float = Field(0.5, gt=0.0, le=1.0, description="share of an item's n-grams in a prompt that rejects it")
    min_item_words: int = Field(4, ge=1, description="items with fewer words are left out: too generic to judge by")

    @model_validator(mode="after")
    def _names_once(self) -> DecontaminationConfig:
        names = [suite.name for suite in self.suites]
        if len(set(names)) != len(names):
            raise ValueError(f"decontamination.suites: each name once, got {names}")
        if self.min_item_words > self.ngram:
            raise ValueError("decontamination.min_item_words: at most ngram (shorter items are matched whole)")
        return self


class ExportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    jsonl: bool = Field(False, description="also write each split as JSON Lines (input_ids, loss_mask)")
    review_text: bool = Field(False, description="add a decoded `text` column for people reviewing samples")


class ValidationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    render_check_fraction: float = Field(0.01, gt=0.0, le=1.0, description="prompts per shard re-rendered at validate")
    render_check_minimum: int = Field(16, ge=1, description="and at least this many per shard")
    retokenize_fraction: float = Field(0.05, ge=0.0, le=1.0, description="records whose re-tokenisation is measured")
    retokenize_minimum: int = Field(16, ge=0, description="and at least this many per shard")


class CostConfig(BaseModel):
    """What generation costs: GPU-hours come from the fleet (each server's tp_size x dp_size GPUs, from its server
    info) and the time requests held its running slots; with a price, the report gives the cost per 1M training
    tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu_hour_price: float | None = Field(None, ge=0, description="price of one GPU-hour; null: GPU-hours only")
    currency: str = Field("USD", description="the currency of gpu_hour_price, as reported")
    gpus_per_endpoint: int | None = Field(
        None, ge=1, description="when a server does not report tp_size/dp_size (a router's worker out of reach)"
    )


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    profile: str = Field(
        "kimi-k2.5-mini", description="model profile: built in (kimi-k2.5, kimi-k2.5-mini) or declared under profiles"
    )
    endpoints: list[EndpointUrl] = Field(
        default_factory=lambda: [Endpoint("http://127.0.0.1:30000")],
        min_length=1,
        description="SGLang base URLs, or one sglang-router URL; a proxy's login in a URL "
        "(http://user:password@host:port) is sent as basic auth and shown everywhere as http://***@host:port",
    )
    storage_root: str = Field("var/storage", description="s3://bucket/prefix or a directory (relative to this file)")
    shard_size: int = Field(
        2000, ge=1, description="sample rows per shard (a prompt answered n times is n rows); a new version only"
    )
    # Concurrency is set for the fleet: `shard_tasks` shard tasks generate at once (the sglang_fleet pool's slots),
    # each holding an equal share of `in_flight`, so one shard's tail still leaves the others feeding the servers.
    in_flight: int = Field(
        256,
        ge=1,
        description="requests in flight across the fleet, shared by the shard tasks generating at once; set it "
        "above the fleet's running capacity (servers x running slots)",
    )
    shard_tasks: int = Field(
        4,
        ge=1,
        description="shard tasks generating at once, each holding in_flight / shard_tasks requests; at most the "
        "sglang_fleet pool's slots (fleet_pool_slots), or the fleet gets fewer requests than in_flight",
    )
    # A task cannot read a pool (Airflow 3 tasks have no database access), so the deployment declares its size here,
    # the one place tools/devstack.py and docker-compose.yaml create the pool from.
    fleet_pool_slots: int | None = Field(
        None,
        ge=1,
        description="slots of the Airflow pool sglang_fleet (tools/devstack.py and docker-compose.yaml create it with "
        "this many); null: shard_tasks. Plan fails when shard_tasks exceeds it",
    )
    request_timeout_s: float = Field(
        3600.0, gt=0, description="per request; keep it above queueing plus the longest answer"
    )
    max_attempts: int = Field(
        5,
        ge=1,
        description="per sample for transient faults (connection reset, timeout, 408/429/5xx, abort, count mismatch), "
        "with exponential backoff and jitter, on another endpoint when there is one; a 400 rejects the sample",
    )
    fleet_wait_s: float = Field(
        120.0,
        gt=0,
        description="how long a shard waits for a fleet whose every endpoint is ejected, then fails (Airflow "
        "retries it)",
    )
    checkpoint_s: float = Field(
        1.0, gt=0, le=60, description="finished answers are flushed this often: a killed task redoes at most these"
    )
    checkpoint_every: int = Field(1024, ge=1, description="or as soon as this many wait (bounds the buffer)")
    tokenize_workers: int | None = Field(
        None,
        ge=1,
        description="prepare's tokeniser processes (spawned) for a dataset tokenised in one task; null: the cores "
        "divided by the tasks its worker may run at once ([celery] worker_concurrency, else [core] parallelism); "
        "1: in the task process; datasets under 1,000 prompts always render in-process",
    )
    # A dataset with more prompts is tokenised in parts of about this many (whole shards), one mapped prepare_part
    # task each, so that workers share it: its one reader still dedupes every row.
    prepare_part_prompts: int = Field(
        50_000,
        ge=1,
        description="a dataset with more prompts is tokenised in parts of about this many (whole shards), one "
        "prepare_part task each, on any worker",
    )
    sampling: Sampling = Field(Sampling(), description="the run's sampling, every value sent explicitly")
    export: ExportConfig = Field(ExportConfig(), description="extra output formats (trigger param `export`)")
    validation: ValidationConfig = Field(ValidationConfig(), description="the sampled checks at validate")
    s3: S3Config = Field(
        S3Config(),
        description="botocore's retries of every S3 request made in Airflow tasks; the aws_default connection's own "
        "config_kwargs win where they set retries",
    )
    cost: CostConfig = Field(CostConfig(), description="what generation cost, in GPU-hours and money")
    schedule: str | None = Field(None, description="cron or preset for nightly runs; null: triggered runs only")
    task_retries: int = Field(
        3, ge=0, description="Airflow retries per task for transient faults; user errors never retry"
    )
    retry_delay_s: float = Field(30.0, gt=0, description="the first retry's delay, doubling each try up to 10 minutes")
    # The scheduler's work per loop grows with a run's task instances (bench/bench_scheduler.py), and Airflow maps at
    # most [core] max_map_length (1024) anyway.
    shard_task_limit: int = Field(
        256,
        ge=1,
        le=1024,
        description="mapped tasks per shard stage in one run; more shards are grouped, several per task, in turn",
    )

    sglang_conn_id: str = Field(
        "sglang_default",
        description="Airflow connection with the fleet's API key (servers started with --api-key): its password for "
        "every endpoint, its extra's api_keys {base URL: key} per endpoint; no such connection: no key is sent",
    )

    @property
    def pool_slots(self) -> int:
        """The sglang_fleet pool's slots, as the deployment creates the pool."""
        return self.fleet_pool_slots or self.shard_tasks


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


class RegenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    defaults: Defaults = Field(Defaults(), description="a run's settings where its params leave them out")
    alerts: AlertsConfig = Field(AlertsConfig(), description="failure mail")
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
