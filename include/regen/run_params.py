"""What a run may be given, declared once: `RunParams`. The DAG's trigger form is generated from its JSON schema with
the deployment's defaults filled in (`form`); `RunSpec.from_params` validates a run's params against it once (strictly:
`{"limit": true}` is not a number) and freezes what the run uses, the slice of the config included, so that no task
reads the config file again and a config edited mid-run never changes a running run.

Adding a run setting is a field here and the code that uses it: the form, plan and the run spec follow.
"""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from regen.config import (
    ConfigError,
    CostConfig,
    DatasetConfig,
    DecontaminationConfig,
    ExportConfig,
    RegenConfig,
    S3Config,
    Sampling,
    load_config,
)
from regen.endpoints import Endpoint, EndpointUrl
from regen.errors import did_you_mean
from regen.governance import check_endpoints, check_storage_root
from regen.layout import DatasetLocation, checked_name, version_from_run_id
from regen.profiles import Profile
from regen.storage import StorageRoot, StorageRootField

Section = Literal["What to run", "Servers", "Sampling", "Advanced"]


def _in(
    section: Section,
    title: str,
    description: str,
    unique: bool = False,
    items: dict[str, Any] | None = None,
    **constraints: Any,
) -> Any:
    """A form field: its section, title and description, and pydantic's constraints on its values (ge, gt, le,
    min_length, max_length), which plan enforces and the form's JSON schema carries (minimum, minItems, ...)."""
    extra: dict[str, Any] = {"section": section, **({"uniqueItems": True} if unique else {})}
    if items is not None:
        extra["items"] = items
    return Field(None, title=title, description=description, json_schema_extra=extra, **constraints)


class RunParams(BaseModel):
    """A run's params: each one left out (or null) takes the config's default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    datasets: list[str] | None = _in(
        "What to run", "Datasets", "Which datasets of the deployment's config to regenerate (at least one).",
        min_length=1, unique=True,  # each once: two tasks writing one version would corrupt it
    )  # fmt: skip
    profile: str | None = _in("What to run", "Model profile", "The target model: its tokenizer, template and roles.")
    limit: int | None = _in(
        "What to run",
        "Prompts per dataset",
        "At most this many prompts of each dataset, the first that tokenize, in order (an on-policy conversation is "
        "one prompt; each is then answered samples_per_prompt times at each temperature). Empty = all.",
        ge=1,
    )
    version: str | None = _in(
        "What to run",
        "Version",
        "Empty: this run's id. An earlier run's id (or version) resumes or completes that version.",
        max_length=200,
    )
    skip_unchanged: bool | None = _in(
        "What to run",
        "Skip unchanged datasets",
        "Skip a dataset whose sources, profile, template and sampling are those of its last published version "
        "(nothing is generated, its asset is not updated). Off: sample it again.",
    )
    overwrite_version: bool | None = _in(
        "What to run",
        "Overwrite a published version",
        "A published version is never changed: publishing other data into it fails. On: replace it (readers of "
        "the old one lose it).",
    )
    # The pattern is the form's (refused at trigger); plan's governance check says what is wrong with a URL. A value
    # with an `@` passes the form, whose refusal (Airflow's) would quote it, login and all: plan refuses it redacted.
    endpoints: list[str] | None = _in(
        "Servers",
        "SGLang endpoints",
        "Base URLs of SGLang servers, or one sglang-router URL; within the deployment's governance.allowed_endpoints. "
        "http://***@host stands for the config's login for that host; a login typed here is stored in the run's conf.",
        min_length=1,
        items={"type": "string", "pattern": r"^(https?://[^\s?#]+|[^@]*@[\s\S]*)$"},
    )
    storage_root: str | None = _in(
        "Servers",
        "Storage root",
        "s3://bucket/prefix (credentials from the aws_default connection) or a local directory; within the "
        "deployment's governance.allowed_storage_roots.",
        min_length=1,
    )
    max_new_tokens: int | None = _in(
        "Sampling", "max_new_tokens", "Longest answer, in tokens; longer ones go to the flagged truncated split.",
        ge=1,
    )  # fmt: skip
    temperature: float | None = _in("Sampling", "temperature", "0 = greedy.", ge=0)
    top_p: float | None = _in("Sampling", "top_p", "Nucleus sampling, in (0, 1].", gt=0, le=1)
    top_k: int | None = _in("Sampling", "top_k", "-1 = all tokens, else at least 1.", ge=-1)
    min_p: float | None = _in(
        "Sampling", "min_p", "In [0, 1]. Every sampling value is sent explicitly, never left to the server's defaults.",
        ge=0, le=1,
    )  # fmt: skip
    shard_size: int | None = _in(
        "Advanced",
        "Sample rows per shard",
        "Rows of prompts/ per shard: a prompt answered n times (samples_per_prompt x temperatures) is n rows, an "
        "on-policy conversation one. A new version only: an existing one keeps its shards.",
        ge=1,
    )  # fmt: skip
    in_flight: int | None = _in(
        "Advanced",
        "Requests in flight",
        "Across the whole fleet, shared by the shard tasks that generate at once; set it above the fleet's running "
        "capacity (servers x running slots).",
        ge=1,
    )
    validation_share: float | None = _in(
        "What to run",
        "Validation share",
        "Share of source prompts held out in validation/ (the same prompts in every version: a prompt validated on "
        "is never trained on). 0 = no validation split. A new version only.",
        ge=0,
        le=0.5,
    )
    export: ExportConfig | None = _in(
        "Advanced",
        "Export",
        "jsonl: also write JSON Lines (input_ids, loss_mask) for SpecForge / speculators loaders; review_text: add "
        "a decoded text column for reviewers.",
    )

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (all tokens) or at least 1")
        return value

    @field_validator("datasets")
    @classmethod
    def _each_once(cls, value: list[str] | None) -> list[str] | None:
        twice = sorted({name for name in value or [] if value and value.count(name) > 1})
        if twice:  # two tasks would write one version's keys: parts numbered alike, checkpoints deleted, two publishes
            raise ValueError(f"{twice} are listed more than once: list each dataset once")
        return value


def form(config: RegenConfig, params: type[RunParams] | None = None) -> dict[str, dict[str, Any]]:
    """The trigger form, field by field, as keyword arguments of Airflow's `Param`: each field's JSON schema from
    RunParams, with the deployment's default as its value and the deployment's datasets and profiles as the choices.
    With a schedule every default must validate, so a field with a default is offered without null."""
    schema = (params or RunParams).model_json_schema()
    defaults = _form_defaults(config)
    fields = {}
    for name, prop in schema["properties"].items():
        prop = copy.deepcopy(prop)
        default = defaults.get(name)
        branches = [b for b in prop.pop("anyOf", [prop]) if b.get("type") != "null"]
        [value] = branches  # one non-null type a field
        value = _inline(value, schema.get("$defs", {}))
        if name == "datasets":
            value["items"] = {"type": "string", "enum": list(config.datasets)}
            prop["examples"] = list(config.datasets)  # an array with examples renders as a multi-select
        if name == "profile":
            value["enum"] = config.profile_names
        if default is None:
            value["type"] = ["null", value["type"]]
        prop.pop("default", None)
        fields[name] = {"default": default, **value, **prop}
    return fields


def _inline(value: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """A `$ref` to a nested model replaced by its object schema (the form shows the object)."""
    if "$ref" not in value:
        return value
    model = copy.deepcopy(definitions[value["$ref"].rsplit("/", 1)[-1]])
    properties = {key: {"type": spec["type"]} for key, spec in model["properties"].items()}
    return {"type": "object", "properties": properties, "additionalProperties": False}


def _form_defaults(config: RegenConfig) -> dict[str, Any]:
    d = config.defaults
    return {
        "datasets": list(config.datasets),
        "profile": d.profile,
        "skip_unchanged": True,
        "overwrite_version": False,
        "endpoints": [str(e) for e in d.endpoints],  # redacted: the form is shown, and a run's conf stored
        "storage_root": str(config.storage_root),
        **d.sampling.model_dump(),
        "shard_size": d.shard_size,
        "in_flight": d.in_flight,
        "validation_share": d.validation_share,
        "export": d.export.model_dump(),
    }


def check_fleet_pool(shard_tasks: int, pool_slots: int) -> None:
    """Each shard task holds in_flight / shard_tasks requests, so a pool with fewer slots than shard_tasks starves the
    fleet silently (4 tasks' shares, 2 slots: half of in_flight). More slots are fine: another DAG may share them."""
    if shard_tasks > pool_slots:
        raise ConfigError(
            f"defaults.shard_tasks is {shard_tasks} but the sglang_fleet pool has {pool_slots} slots "
            f"(defaults.fleet_pool_slots): only {pool_slots} shard tasks would generate at once, each with "
            f"1/{shard_tasks} of in_flight. Set shard_tasks to {pool_slots}, or give the pool {shard_tasks} slots "
            f"(`airflow pools set sglang_fleet {shard_tasks} ...`) and fleet_pool_slots: {shard_tasks}"
        )


def _endpoints(given: list[str] | None, config: RegenConfig) -> list[Endpoint]:
    """The run's endpoints: as given (a login typed in stays out of the run spec's JSON), or the config's. A
    redacted one (`http://***@host`, as the form shows the config's) takes the config's login for its origin."""
    if not given:
        return list(config.defaults.endpoints)
    logins = {e.origin: e for e in config.defaults.endpoints if e.login is not None}
    try:
        endpoints = [Endpoint.parse(url) for url in given]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    unknown = [str(e) for e in endpoints if e.needs_login and e.login is None and e.origin not in logins]
    if unknown:
        raise ConfigError(
            f"endpoints {unknown}: '***' stands for the login of the config's endpoint at that address, and the "
            "config's defaults.endpoints has none there: give the URL with its user and password, or without '***@'"
        )
    return [Endpoint(e.base, logins[e.origin].login) if e.needs_login and e.login is None else e for e in endpoints]


class RunSpec(BaseModel):
    """One run: its params over the config's defaults, checked once at plan, and everything of the config its tasks
    use, frozen. It travels between tasks as a small JSON dict (XCom); no task reads the config file again."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    datasets: list[str]
    endpoints: list[EndpointUrl]  # in XCom and the run report redacted; a task gets logins at request time
    storage_root: StorageRootField  # travels as its canonical string (an absolute path, or s3://bucket/prefix)
    profile: str
    limit: int | None
    sampling: dict[str, Any]
    version: str
    shard_size: int
    concurrency: int
    shard_tasks: int = 4  # generating at once, each with `concurrency` requests (a spec planned before: the default)
    request_timeout_s: float
    max_attempts: int
    fleet_wait_s: float
    sample_timeouts: int = 2  # (a spec planned before these existed: the defaults)
    max_server_rejected_share: float = 0.02
    priority: int | None = None
    chain_priority: bool = False
    longest_first: bool = True
    endpoint_affinity: bool = True
    checkpoint_every: int
    checkpoint_s: float
    export: dict[str, bool]
    validation: dict[str, Any]
    validation_share: float = 0.0  # (a spec planned before held-out splits: none)
    skip_unchanged: bool = True
    overwrite_version: bool = False  # publish over a version that exists with other data (never by default)
    run_id: str = ""  # the Airflow run: recorded beside what it writes, so people find the run from the data
    # This try of the run, made at plan: its tasks share the claims on its versions, and the tasks of a run planned
    # again are told apart from those of its earlier try still writing (regen.claims).
    try_token: str = ""  # (a spec planned before tokens existed: its tasks share "")
    # The run's logical date (or, for a run with none, as a manual run may be, when it was due: run_after), UTC ISO:
    # a version it makes is ordered by it among the dataset's versions (latest.json moves only forward).
    logical_date: str = ""  # (a spec planned before dates: its versions are ordered by when they were published)
    # The config's slice, as it was at plan: each dataset as declared (its paths relative to the config's folder, as
    # the inputs digest has always seen them), the profile with its files resolved.
    dataset_configs: dict[str, DatasetConfig] = Field(default_factory=dict)
    config_dir: str = "."
    profile_declaration: Profile | None = None
    tokenize_workers: int | None = None
    prepare_part_prompts: int = 50_000
    shard_task_limit: int = 256
    cost: dict[str, Any] = Field(default_factory=lambda: CostConfig().model_dump())
    # What the Airflow glue needs mid-run, frozen too: a task never reads the config file (ARCHITECTURE.md).
    s3: dict[str, Any] = Field(default_factory=lambda: S3Config().model_dump())
    sglang_conn_id: str = "sglang_default"
    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)

    @classmethod
    def from_params(
        cls,
        params: dict[str, Any],
        run_id: str,
        config: RegenConfig | None = None,
        declared: type[RunParams] = RunParams,
        logical_date: datetime | None = None,
    ) -> RunSpec:
        """Everything the trigger form cannot check, checked here; a bad value raises ConfigError saying what to fix.
        `declared`: the params' declaration (RunParams; a test may extend it). `logical_date`: the run's (or its
        run_after); none given: now."""
        known = declared.model_fields
        unknown = sorted(set(params) - set(known))
        if unknown:  # Airflow 3.3 takes any key at trigger (ParamsDict.deep_merge adds it): refused here
            hints = "".join(did_you_mean(name, known).replace("; did", f"; for {name!r} did") for name in unknown)
            raise ConfigError(f"unknown run parameters {unknown}{hints}; a run takes {sorted(known)}")
        try:
            given = declared.model_validate(params)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'params'}: {err['msg']}" for err in e.errors())
            raise ConfigError(f"invalid run parameters: {problems.replace('Value error, ', '')}") from None
        run = cls._over_defaults(given, run_id, config or load_config())
        when = (logical_date or datetime.now(UTC)).astimezone(UTC)
        return run.model_copy(update={"logical_date": when.isoformat(), "try_token": uuid.uuid4().hex})

    @classmethod
    def _over_defaults(cls, given: RunParams, run_id: str, config: RegenConfig) -> RunSpec:
        d = config.defaults
        datasets = list(given.datasets or config.datasets)
        dataset_configs = {name: config.dataset(name) for name in datasets}
        profile = given.profile or d.profile
        declaration = config.profile(profile)  # known, and its declaration is sound
        endpoints = _endpoints(given.endpoints, config)
        check_endpoints(endpoints, config.allowed_endpoints)
        try:  # parsed once: what is checked here is what every task opens
            storage_root = StorageRoot.parse(given.storage_root or d.storage_root, config.base_dir.resolve())
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_storage_root(storage_root, config.allowed_storage_roots)
        version = version_from_run_id(given.version or run_id)
        try:
            checked_name("version", version)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_fleet_pool(d.shard_tasks, d.pool_slots)
        sampling = {name: value for name in Sampling.model_fields if (value := getattr(given, name)) is not None}
        in_flight = given.in_flight or d.in_flight
        # Every setting the spec shares by name with the defaults is the configured one, unless the run set it here.
        configured = {name: value for name, value in d.model_dump().items() if name in cls.model_fields}
        return cls(
            **{
                **configured,
                "datasets": datasets,
                "endpoints": endpoints,
                "storage_root": storage_root,
                "profile": profile,
                "limit": given.limit,
                "sampling": Sampling(**{**d.sampling.model_dump(), **sampling}).as_params(),
                "version": version,
                "shard_size": given.shard_size or d.shard_size,
                "concurrency": -(-in_flight // d.shard_tasks),
                "export": (given.export or d.export).model_dump(),
                "validation_share": d.validation_share if given.validation_share is None else given.validation_share,
                "skip_unchanged": True if given.skip_unchanged is None else given.skip_unchanged,
                "overwrite_version": bool(given.overwrite_version),
                "run_id": run_id,
                "dataset_configs": dataset_configs,
                "config_dir": str(config.base_dir.resolve()),
                "profile_declaration": declaration,
                "decontamination": config.decontamination,
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def location(self, dataset: str) -> DatasetLocation:
        return DatasetLocation(str(self.storage_root), self.profile, dataset, self.version)

    def dataset(self, name: str) -> DatasetConfig:
        return self.dataset_configs[name]

    def resolve(self, path: str) -> str:
        """A dataset's path as the config's `resolve` gives it: relative to the config's folder; URIs pass through."""
        return RegenConfig.resolve_against(Path(self.config_dir), path)

    @property
    def declared_profile(self) -> Profile:
        assert self.profile_declaration is not None, "a run spec is made by plan, which freezes its profile"
        return self.profile_declaration
