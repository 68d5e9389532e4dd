"""The config's `defaults` section: a run's settings where its trigger params leave them out (endpoints, storage,
concurrency, retries, sampling, export, validation, cost). The same whatever model profile a run uses."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from regen.endpoints import Endpoint, EndpointUrl
from regen.storage import S3Config


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


class ExportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    jsonl: bool = Field(False, description="also write each split as JSON Lines (input_ids, loss_mask)")
    review_text: bool = Field(False, description="add a decoded `text` column for people reviewing samples")


class ValidationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    render_check_fraction: float = Field(0.01, gt=0.0, le=1.0, description="prompts per shard re-rendered at validate")
    render_check_minimum: int = Field(16, ge=1, description="and at least this many per shard")
    retokenize_fraction: float = Field(0.05, ge=0.0, le=1.0, description="records whose re-tokenization is measured")
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
        description="requests in flight across the fleet, shared by the shard tasks generating at once; at least 3 x "
        "the fleet's running slots (servers x max running requests; check_server warns below, and where a task's "
        "share is more than a shard's rows), 6 x with chain_priority (docs/scaling.md)",
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
        description="per sample for transient faults (connection reset, timeout, any status but 200 and 400, abort, "
        "count mismatch), with exponential backoff and jitter, on another endpoint when there is one; a 400 rejects "
        "the sample once a second endpoint (where there is one) gives it too",
    )
    priority: int | None = Field(
        None,
        description="SGLang's request priority, sent with every /generate; null sends none. For a fleet shared with "
        "live traffic whose servers run --enable-priority-scheduling: with SGLang's default order a larger value is "
        "served first, so give the batch a value below live traffic's. A server without priority scheduling ignores "
        "it, or aborts the request (503) when started with --abort-on-priority-when-disabled (docs/scaling.md)",
    )
    endpoint_affinity: bool = Field(
        True,
        description="an on-policy conversation's next turn goes first to the endpoint that answered its previous "
        "turn, whose prefix cache holds the conversation so far (unless that endpoint is over 25% busier than the "
        "least busy): the history is not prefilled again. Off: every turn to the least busy endpoint",
    )
    chain_priority: bool = Field(
        False,
        description="on a fleet whose every server runs --enable-priority-scheduling (check_server reads it): each "
        "request carries `priority` (0 when null), an on-policy turn's raised by a level for each doubling of the "
        "reference tokens its conversation has left from it on past 128, at most 9, so the conversation with the "
        "most work left is admitted ahead of short work queued before it. Under SGLang's preemption threshold "
        "(10) among the run's own requests; a request without a priority is SGLang's least preferred, so on a "
        "fleet shared with live traffic give that traffic priorities over the batch's by more than 9. Ignored, with "
        "a warning, on a fleet that does not schedule by priority (docs/scaling.md)",
    )
    longest_first: bool = Field(
        True,
        description="send each shard's prompts longest expected answer first, the lengths taken from the dataset's "
        "last published version, else from the rows' reference answers (on-policy: the longest chain of a "
        "conversation's turns first, each turn's length its last answer's, else its reference's), and run the shard "
        "tasks of every dataset in one order, the longest expected work first: a shard task's last minutes then hold "
        "short answers, not the few longest with most of its share of in_flight idle (docs/scaling.md). Only the "
        "order of the requests changes, never the data",
    )
    sample_timeouts: int = Field(
        2,
        ge=1,
        description="a sample whose request timed out this many times while its endpoint answered others is "
        "rejected (sample_timeout) and the shard goes on; such timeouts are not held against the endpoint",
    )
    max_server_rejected_share: float = Field(
        0.02,
        ge=0,
        le=1,
        description="a dataset version whose answers the fleet lost past this share of all of them is not published "
        "(red), naming the servers, the reasons, the answers and the Resume that asks them again: refused "
        "(server_rejected), aborted (server_aborted) or miscounted (count_mismatch) on every attempt, and the later "
        "turns of the on-policy conversations those ended. One alone never fails it; a sample that timed out on "
        "working servers (sample_timeout) and the turns the data ended never count (docs/guarantees.md)",
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
    checkpoint_every: int = Field(
        1024, ge=1, description="or as soon as this many are in a part (bounds a part and the buffer)"
    )
    tokenize_workers: int | None = Field(
        None,
        ge=1,
        description="prepare's tokenizer processes (spawned) for a dataset tokenized in one task; null: the cores "
        "divided by the tasks its worker may run at once ([celery] worker_concurrency, else [core] parallelism); "
        "1: in the task process; datasets under 1,000 prompts always render in-process",
    )
    # A dataset with more prompts is tokenized in parts of about this many (whole shards), one mapped prepare_part
    # task each, so that workers share it: its one reader still dedupes every row.
    prepare_part_prompts: int = Field(
        50_000,
        ge=1,
        description="a dataset with more prompts is tokenized in parts of about this many (whole shards), one "
        "prepare_part task each, on any worker",
    )
    sampling: Sampling = Field(Sampling(), description="the run's sampling, every value sent explicitly")
    export: ExportConfig = Field(ExportConfig(), description="extra output formats (trigger param `export`)")
    # 2%: enough held-out prompts to measure a drafter's acceptance steadily on a dataset of a few thousand prompts
    # and up (100k prompts: 2,000 held out, a million and more scored positions), for 2% of the GPU time (docs/data.md).
    validation_share: float = Field(
        0.02,
        ge=0,
        le=0.5,
        description="share of source prompts held out in validation/, the same ones in every version (regen.holdout); "
        "0: no validation split; at most 0.5",
    )
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

    verify_poll_s: float = Field(
        30.0,
        gt=0,
        description="at most this long between the triggerer's asks whether a dataset's own shards finished (no slot "
        "held): it asks after 1 s, then after half the time it has waited, up to this",
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
