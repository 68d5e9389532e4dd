"""What every eagle3-regen task needs from Airflow: storage credentials from a connection, and the rule that an error a
retry cannot mend fails the task at once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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


def s3_client() -> Any:
    """boto3 S3 client from the `aws_default` connection (credentials and endpoint_url live there, never in code),
    retrying S3's transient faults as the config's `defaults.s3` says; the connection's own `config_kwargs`, where
    it has any, win."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    from regen.config import load_config
    from regen.storage import s3_client_config

    settings = load_config().defaults.s3
    retries = s3_client_config(settings.retry_mode, settings.max_attempts)
    hook = S3Hook(aws_conn_id=AWS_CONN_ID)  # one connection lookup: its config read, then the client made
    own = hook.conn_config.botocore_config
    return hook.get_client_type(region_name=hook.region_name, config=retries.merge(own) if own else retries)


def sglang_api_keys(params: Mapping[str, Any] | None = None) -> Any:
    """The fleet's API keys (servers started with --api-key) from the Airflow connection `defaults.sglang_conn_id`:
    its password is the key of every endpoint, its extra's `api_keys` ({"http://host:port": key}) those of single
    endpoints. No such connection: no key is sent (servers without --api-key need none). With them, the logins of
    endpoint URLs (`http://user:pass@host`) from the config and from the run's `params`: the run spec a task gets
    through XCom holds `***` in their place (regen.endpoints)."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    from regen.config import load_config
    from regen.endpoints import run_logins
    from regen.sglang.auth import ApiKeys

    defaults = load_config().defaults
    conn_id, logins = defaults.sglang_conn_id, run_logins(defaults.endpoints, (params or {}).get("endpoints"))
    source = f"the Airflow connection {conn_id!r} (password: every endpoint's key; extra api_keys: per endpoint)"
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return ApiKeys(source=f"{source}, which does not exist", logins=logins)
    per_endpoint = conn.extra_dejson.get("api_keys") or {}
    return ApiKeys(conn.password, per_endpoint if isinstance(per_endpoint, dict) else {}, source, logins)


@contextmanager
def final_errors_fail_now(prefix: str = "") -> Iterator[None]:
    """What a retry cannot mend (regen.errors.FinalError) fails the task at once with its message; the rest is
    retried by the task's policy."""
    from airflow.sdk.exceptions import AirflowFailException

    from regen.errors import FinalError

    try:
        yield
    except FinalError as e:
        raise AirflowFailException(f"{prefix}{e}") from e
