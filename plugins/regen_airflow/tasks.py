"""What every eagle3-regen task needs from Airflow: storage credentials from a connection, and the rule that an error a
retry cannot mend fails the task at once."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow.sdk import AssetAlias

AWS_CONN_ID = "aws_default"
# One asset per dataset (its URI is where the dataset's versions live), announced through this alias when a version
# is published: a training DAG is scheduled on the alias (every dataset) or on one dataset's asset.
PUBLISHED_DATASETS = AssetAlias("eagle3_regen_datasets")


def s3_client_for(uri: str) -> Any:
    """The S3 client when `uri` is on S3; None for a local path (no connection needed)."""
    return s3_client() if uri.startswith("s3://") else None


def run_s3_client(run: dict[str, Any]) -> Callable[[], Any]:
    """A run's tasks' S3 client factory: the retry settings plan froze in the run spec, not the config file now."""
    return functools.partial(s3_client, run.get("s3") or {})  # a run planned before the spec had it: the defaults


def s3_client(settings: dict[str, Any] | None = None) -> Any:
    """boto3 S3 client from the `aws_default` connection (credentials and endpoint_url live there, never in code),
    retrying S3's transient faults as `settings` (a run's `s3`; None: the config's `defaults.s3`, for plan and the
    page, which run outside a run) say; the connection's own `config_kwargs`, where it has any, win."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    from regen.config import S3Config, load_config
    from regen.storage import s3_client_config

    s3 = S3Config(**settings) if settings is not None else load_config().defaults.s3
    retries = s3_client_config(s3.retry_mode, s3.max_attempts)
    hook = S3Hook(aws_conn_id=AWS_CONN_ID)  # one connection lookup: its config read, then the client made
    own = hook.conn_config.botocore_config
    return hook.get_client_type(region_name=hook.region_name, config=retries.merge(own) if own else retries)


def run_api_keys(
    run: dict[str, Any], params: Mapping[str, Any] | None = None, config_endpoints: Sequence[Any] = ()
) -> Any:
    """A run's fleet API keys, from the connection plan froze in the run spec, and the logins of its endpoint URLs:
    the run spec in XCom holds `***` in their place, so they come from the run's `params` (its conf) and from
    `config_endpoints` (the deployment's, as the DAG file parsed them), never from XCom."""
    return sglang_api_keys(run.get("sglang_conn_id") or "sglang_default", params, config_endpoints)


def sglang_api_keys(
    conn_id: str | None = None, params: Mapping[str, Any] | None = None, config_endpoints: Sequence[Any] | None = None
) -> Any:
    """The fleet's API keys (servers started with --api-key) from the Airflow connection `conn_id` (a run's
    `sglang_conn_id`; None: the config's `defaults.sglang_conn_id`, for the page): its password is the key of every
    endpoint, its extra's `api_keys` ({"http://host:port": key}) those of single endpoints. No such connection: no
    key is sent (servers without --api-key need none). With them, the logins of endpoint URLs
    (`http://user:pass@host`) from `config_endpoints` (None: the config's) and from the run's `params`
    (regen.endpoints)."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    from regen.config import load_config
    from regen.endpoints import run_logins
    from regen.sglang.auth import ApiKeys

    if conn_id is None or config_endpoints is None:  # outside a run (the page): the config as it is now
        defaults = load_config().defaults
        conn_id = conn_id or defaults.sglang_conn_id
        config_endpoints = defaults.endpoints if config_endpoints is None else config_endpoints
    logins = run_logins(list(config_endpoints), (params or {}).get("endpoints"))
    source = f"the Airflow connection {conn_id!r} (password: every endpoint's key; extra api_keys: per endpoint)"
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        mask_known_secrets()
        return ApiKeys(source=f"{source}, which does not exist", logins=logins)
    per_endpoint = conn.extra_dejson.get("api_keys") or {}
    keys = ApiKeys(conn.password, per_endpoint if isinstance(per_endpoint, dict) else {}, source, logins)
    mask_known_secrets()
    return keys


def mask_known_secrets() -> None:
    """The logins and API keys this process knows (regen.redaction) given to Airflow's own secrets masker too: it
    scrubs what Airflow logs itself (a failed task's traceback), where the project's log filter does not reach."""
    from airflow.sdk.log import mask_secret

    from regen.redaction import known_secrets

    for secret in known_secrets():
        mask_secret(secret)


def worker_task_slots() -> int:
    """The tasks this machine's worker may run at once, each of which may start a tokenizer pool: a Celery worker's
    `[celery] worker_concurrency`, the LocalExecutor's `[core] parallelism` (the most of those configured)."""
    from airflow.configuration import conf

    executors = conf.get("core", "executor", fallback="LocalExecutor")
    slots = [1]
    if "CeleryExecutor" in executors:
        slots.append(conf.getint("celery", "worker_concurrency", fallback=16))
    if "LocalExecutor" in executors:
        slots.append(conf.getint("core", "parallelism", fallback=32))
    return max(slots)


@contextmanager
def final_errors_fail_now(prefix: str = "") -> Iterator[None]:
    """What a retry cannot mend (regen.errors.FinalError) fails the task at once with its message; the rest is
    retried by the task's policy. Every task that does the pipeline's work runs in it: the task log's handlers, set up
    by Airflow by now, get the log filter that scrubs secrets (regen.redaction)."""
    from airflow.sdk.exceptions import AirflowFailException

    from regen.errors import FinalError
    from regen.redaction import install_log_redaction

    install_log_redaction()
    try:
        yield
    except FinalError as e:
        raise AirflowFailException(f"{prefix}{e}") from e
