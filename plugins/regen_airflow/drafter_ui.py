"""The "Drafter data" page in Airflow's UI: a FastAPI app that the API server mounts at /drafter
(eagle3_regen_plugin.py), shown inside the UI from its navigation. Only wiring: the numbers come from regen.catalog,
the HTML from regen.drafter_page, the fleet from regen.sglang.fleet_status.

Every endpoint requires a signed-in Airflow user allowed to read eagle3_regen's runs (Airflow's own
`requires_access_dag`); FastAPI plugin apps are not behind Airflow's auth otherwise. Storage is read with the
deployment's credentials on the server, off the event loop, and cached for a few seconds; no credential or storage
client reaches the browser, only numbers and storage URIs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

DAG_ID = "eagle3_regen"
CACHE_S = 10.0  # storage reads behind the page: fresh enough for people, light on the bucket

app = FastAPI(
    title="Drafter data",
    description="eagle3-regen's datasets, versions, runs in progress and fleet",
    dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=DAG_ID))],
    # FastAPI serves its docs and schema outside the app's dependencies, so they would answer anyone: none served.
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)
_cache: dict[tuple[Any, ...], tuple[float, Any]] = {}


async def _cached(key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
    """`read()` in a worker thread (storage calls block), its answer kept for CACHE_S seconds."""
    hit = _cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < CACHE_S:
        return hit[1]
    value = await asyncio.to_thread(read)
    now = time.monotonic()
    for old in [k for k, (at, _) in _cache.items() if now - at >= CACHE_S]:  # every comparison asked is a key
        del _cache[old]
    _cache[key] = (now, value)
    return value


def _where(profile: str | None) -> tuple[Any, str, list[str]]:
    """The deployment's config, the profile asked for (its default one otherwise) and the configured datasets."""
    from regen.config import load_config

    config = load_config()
    chosen = profile or config.defaults.profile
    if chosen not in config.profile_names:
        raise HTTPException(404, f"unknown profile {chosen!r}")
    return config, chosen, list(config.datasets)


def _storage(config: Any) -> Any:
    """The deployment's storage root, with the aws_default connection's client: made in the worker thread, since
    looking the connection up blocks."""
    from regen.storage import open_storage
    from regen_airflow.tasks import s3_client_for

    root = config.resolve(config.defaults.storage_root)
    return open_storage(root, s3_client_for(root))


@app.get("/api/datasets")
async def datasets(profile: str | None = None) -> list[dict[str, Any]]:
    from regen.catalog import overview

    config, chosen, names = _where(profile)
    rows: list[dict[str, Any]] = await _cached(("datasets", chosen), lambda: overview(_storage(config), chosen, names))
    return rows


@app.get("/api/runs")
async def runs(profile: str | None = None) -> list[dict[str, Any]]:
    from regen.catalog import in_progress

    config, chosen, names = _where(profile)
    found: list[dict[str, Any]] = await _cached(("runs", chosen), lambda: in_progress(_storage(config), chosen, names))
    return found


@app.get("/api/compare")
async def compare(dataset: str, before: str, after: str, profile: str | None = None) -> dict[str, Any]:
    from regen.catalog import compare as compare_versions

    config, chosen, names = _where(profile)
    if dataset not in names:
        raise HTTPException(404, f"unknown dataset {dataset!r}")
    try:
        return dict(
            await _cached(
                ("compare", chosen, dataset, before, after),
                lambda: compare_versions(_storage(config), chosen, dataset, before, after),
            )
        )
    except (LookupError, ValueError) as e:
        raise HTTPException(404, str(e)) from e


@app.get("/api/fleet")
async def fleet() -> list[dict[str, Any]]:
    """Asked on demand (a button on the page), never cached: the point is how the fleet is now."""
    from regen.config import load_config
    from regen.governance import endpoint_allowed
    from regen.sglang.fleet_status import ask_fleet
    from regen_airflow.tasks import sglang_api_keys

    config = load_config()
    keys = await asyncio.to_thread(sglang_api_keys)  # a connection lookup blocks
    allowed = config.allowed_endpoints
    return await ask_fleet(config.defaults.endpoints, api_keys=keys, may_ask=lambda url: endpoint_allowed(url, allowed))


@app.get("/", response_class=HTMLResponse)
async def page(
    profile: str | None = None, compare: str | None = None, before: str | None = None, after: str | None = None
) -> str:
    from regen.catalog import compare as compare_versions
    from regen.catalog import in_progress, overview
    from regen.drafter_page import page as render

    config, chosen, names = _where(profile)
    rows = await _cached(("datasets", chosen), lambda: overview(_storage(config), chosen, names))
    found = await _cached(("runs", chosen), lambda: in_progress(_storage(config), chosen, names))
    comparison, error = None, None
    if compare and before and after:
        try:
            comparison = await _cached(
                ("compare", chosen, compare, before, after),
                lambda: compare_versions(_storage(config), chosen, compare, before, after),
            )
        except (LookupError, ValueError) as e:
            error = str(e)
    return render(config.resolve(config.defaults.storage_root), chosen, rows, found, comparison, error)
