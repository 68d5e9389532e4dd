"""The run's own tasks: plan (every choice checked before any work), the fleet check, and the run's report. And the
profile at work, built once per process (`renderer_for`, `preload`)."""

from __future__ import annotations

import functools
import logging
import uuid
from datetime import datetime
from functools import cache
from typing import Any

from regen.chat import ChatRenderer
from regen.config import ConfigError, load_config
from regen.layout import run_report_key, write_check_key
from regen.metrics import current as metrics
from regen.pipeline.run_storage import RunStorage
from regen.profiles import Profile
from regen.run_params import RunSpec
from regen.run_report import sizing_warnings, write_run_report
from regen.sglang.auth import NO_KEYS, ApiKeys
from regen.sglang.server_check import check_fleet
from regen.stages.generate.drain_model import run_figures
from regen.stages.prepare.eval_suites import load_suites
from regen.storage import S3ClientFactory, check_writable
from regen.tokenizers.loading import why_tokenizer_fails

log = logging.getLogger(__name__)


def plan(
    params: dict[str, Any],
    run_id: str,
    s3_client: S3ClientFactory | None = None,
    logical_date: datetime | None = None,
) -> dict[str, Any]:
    """The run's choices, checked in seconds before any work: params, the profile's tokenizer, a storage root that
    takes a write. The one place a run reads the deployment's config: what it uses travels in the run spec. Raises
    ConfigError with what to fix. `logical_date`: the run's, or its run_after when it has none (now, outside
    Airflow)."""
    run = RunSpec.from_params(params, run_id, load_config(), logical_date=logical_date)
    try:
        renderer_for(run)
    except (OSError, ImportError) as e:
        raise ConfigError(why_tokenizer_fails(run.declared_profile.tokenizer_source, e)) from e
    except ValueError as e:  # a token role the tokenizer does not have
        raise ConfigError(str(e)) from e
    load_suites(run.decontamination, run.resolve, s3_client)  # a missing suite or a bad field path: ConfigError
    try:
        storage = RunStorage.open(run, s3_client).storage
        storage.remove_stale_temporaries(run.profile, recursive=False)  # a killed plan's probe, half written
        check_writable(storage, write_check_key(run.profile, uuid.uuid4().hex))
    except PermissionError as e:
        raise ConfigError(f"{e}: give a storage_root this worker can write to") from e
    log.info("plan: %s", run.to_dict())
    metrics().loss_allowance(run.max_server_rejected_share)
    return run.to_dict()


def renderer_for(run: RunSpec) -> ChatRenderer:
    """The run's profile at work, built once per process: its declaration as plan froze it."""
    return _renderer(run.declared_profile.model_dump_json())


@cache
def _renderer(declaration: str) -> ChatRenderer:
    profile = Profile.model_validate_json(declaration)
    log.info("loading profile %s (tokenizer, template) in this process", profile.name)  # not inherited (preload)
    return ChatRenderer(profile)


def preload() -> None:
    """Build the config's default profile at work (the renderer, its decode table, its longest token) in a process
    that forks task processes, so that every task forked after it inherits the renderer and the libraries behind it,
    instead of spending about 2 CPU-seconds on them each. Nothing is sent and nothing is written. A config or
    tokenizer that fails here is left for plan to report, with its own message."""
    try:
        config = load_config()
        renderer = _renderer(config.profile(config.defaults.profile).model_dump_json())
        renderer.max_token_bytes  # noqa: B018 (read from the whole vocabulary once: prepare's bound on text)
    except Exception as e:  # a hint for the log: plan says what to fix
        log.warning("preload skipped (plan will report it): %s", e)
        return
    renderer.decode_in_vocab([0])  # the decode table is built on first use
    import pyarrow.dataset  # noqa: F401 (pyarrow.parquet imports it at the first read, a third of a second)

    log.info("preloaded profile %s", renderer.profile.name)


def check_server(run: RunSpec, api_keys: ApiKeys = NO_KEYS) -> list[dict[str, Any]]:
    fleet = check_fleet(run.endpoints, renderer_for(run), run.sampling, api_keys=api_keys)
    for endpoint in fleet:  # what the fleet can hold: utilisation's and GPU-hours' denominators
        if isinstance(slots := endpoint.get("max_running_requests"), int):
            metrics().fleet_slots.labels(endpoint["url"]).set(slots)
        if isinstance(gpus := endpoint.get("gpus"), int):
            metrics().fleet_gpus.labels(endpoint["url"]).set(gpus)
    for warning in sizing_warnings(run.to_dict(), fleet):  # also in the run report
        log.warning("%s", warning)
    return fleet


def report(
    run: RunSpec,
    published: list[dict[str, Any]],
    fleet: list[dict[str, Any]],
    s3_client: S3ClientFactory | None = None,
) -> dict[str, Any]:
    """The run's summary (regen.run_report), once every dataset was published or failed: the run's claims on its
    versions are released first, so a Resume of what it left may start at once. Red unless every dataset delivered."""
    at = RunStorage.open(run, s3_client)
    for dataset in run.datasets:
        at.release(run.location(dataset))
    at.storage.remove_stale_temporaries(run_report_key(run.profile, run.version).rsplit("/", 1)[0], recursive=False)
    model = functools.partial(run_figures, at.storage, run.to_dict(), published)
    return write_run_report(at.storage, run.to_dict(), run.datasets, published, fleet, run.cost, model)
