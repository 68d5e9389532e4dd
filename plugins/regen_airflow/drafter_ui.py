"""The "Drafter data" page in Airflow's UI: a FastAPI app that the API server mounts at /drafter
(eagle3_regen_plugin.py), shown inside the UI from its navigation. Only wiring: the numbers come from
regen.ui.catalog, the HTML from regen.ui.page, the fleet from regen.sglang.fleet_status.

Every endpoint requires a signed-in Airflow user allowed to read eagle3_regen's runs (Airflow's own
`requires_access_dag`); FastAPI plugin apps are not behind Airflow's auth otherwise. Storage is read with the
deployment's credentials on the server, off the event loop; one scan answers the page and its JSON endpoints alike,
and concurrent requests for it await the same read (regen.ui.caches). No credential or storage client reaches the
browser: numbers, storage URIs, and a version's manifest and report served through this app (`/files/...`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, StreamingResponse

from regen.ui.caches import PublishedSummaries, SingleFlight

DAG_ID = "eagle3_regen"
CACHE_S = 10.0  # storage reads behind the page: fresh enough for people, light on the bucket
PAGE = Query(0, ge=0, le=100_000, description="which page of each dataset's other versions, newest first")
CONTENT_TYPES = {".json": "application/json", ".html": "text/html; charset=utf-8", ".png": "image/png"}
# A version's files were written by whoever may write to the bucket, who is not trusted with Airflow's origin: a
# report.html is shown sandboxed (no script runs, and it has no access to the signed-in session), nothing sniffed.
FILE_HEADERS = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}

app = FastAPI(
    title="Drafter data",
    description="eagle3-regen's datasets, versions, runs in progress and fleet",
    dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=DAG_ID))],
    # FastAPI serves its docs and schema outside the app's dependencies, so they would answer anyone: none served.
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)
_reads: SingleFlight[Any] = SingleFlight(CACHE_S)
_published = PublishedSummaries()
T = TypeVar("T")


async def _cached(key: tuple[Any, ...], read: Callable[[], T]) -> T:
    """`read()` in a worker thread (storage calls block), once for every request asking `key` meanwhile, its answer
    kept for CACHE_S seconds."""
    value: T = await _reads.get(key, read)
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

    root = str(config.storage_root)  # parsed once, as a run's root is: what is shown is what is opened
    return open_storage(root, s3_client_for(root))


def _catalog(config: Any, profile: str) -> Any:
    from regen.ui.catalog import Catalog

    return Catalog(_storage(config), profile, published=_published)


async def _overview(profile: str | None, page: int) -> tuple[Any, str, Any]:
    """The one scan behind the page, /api/datasets and /api/runs."""
    config, chosen, names = _where(profile)
    overview = await _cached(("overview", chosen, page), lambda: _catalog(config, chosen).overview(names, page))
    return config, chosen, overview


@app.get("/api/datasets")
async def datasets(profile: str | None = None, page: int = PAGE) -> list[dict[str, Any]]:
    """Each dataset's latest published version in full and page `page` of its other versions."""
    _, _, overview = await _overview(profile, page)
    return list(overview.datasets)


@app.get("/api/runs")
async def runs(profile: str | None = None, page: int = PAGE) -> list[dict[str, Any]]:
    """The unpublished versions among page `page` of each dataset's versions, shard by shard."""
    _, _, overview = await _overview(profile, page)
    return list(overview.runs)


async def _version(profile: str | None, dataset: str, version: str) -> dict[str, Any]:
    return await _of_dataset(profile, dataset, ("version", version), lambda c: c.version(dataset, version))


async def _of_dataset(
    profile: str | None, dataset: str, what: tuple[str, ...], read: Callable[[Any], Any]
) -> dict[str, Any]:
    """`read(catalog)` of a configured dataset, cached; a dataset or version that is not there is a 404."""
    config, chosen, names = _where(profile)
    if dataset not in names:
        raise HTTPException(404, f"unknown dataset {dataset!r}")
    try:
        return dict(await _cached((*what, chosen, dataset), lambda: read(_catalog(config, chosen))))
    except (LookupError, ValueError) as e:
        raise HTTPException(404, str(e)) from e


@app.get("/api/version")
async def version(dataset: str, version: str, profile: str | None = None) -> dict[str, Any]:
    """One version on demand: a published one with its report's numbers and plots, another shard by shard."""
    return await _version(profile, dataset, version)


async def _compare(profile: str | None, dataset: str, before: str, after: str) -> dict[str, Any]:
    return await _of_dataset(profile, dataset, ("compare", before, after), lambda c: c.compare(dataset, before, after))


@app.get("/api/compare")
async def compare(dataset: str, before: str, after: str, profile: str | None = None) -> dict[str, Any]:
    return await _compare(profile, dataset, before, after)


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


@app.get("/files/{profile}/{dataset}/{version}/{name}")
async def version_file(profile: str, dataset: str, version: str, name: str) -> StreamingResponse:
    """A version's manifest, report or plot from the storage root (local or S3), streamed: the page's links. Only
    the names layout.VIEWABLE_FILES lists, of a configured dataset's version; anything else is 404."""
    from regen.layout import DatasetLocation
    from regen.storage import is_not_found
    from regen.ui.documents import viewable_key

    config, chosen, names = _where(profile)
    if dataset not in names:
        raise HTTPException(404, f"unknown dataset {dataset!r}")

    def find() -> tuple[Any, str]:  # the report's files: where the version's manifest says its publisher wrote them
        storage = _storage(config)
        return storage, viewable_key(storage, DatasetLocation("", chosen, dataset, version), name)

    try:
        storage, key = await asyncio.to_thread(find)
    except ValueError as e:
        raise HTTPException(404, str(e)) from e
    chunks = await asyncio.to_thread(lambda: storage.iter_chunks(key))
    try:  # the first chunk here: a file that is not there is a 404, not a broken stream
        first = await asyncio.to_thread(next, chunks, b"")
    except Exception as e:
        if is_not_found(e):
            raise HTTPException(404, f"{dataset} {version} has no {name}") from e
        raise
    return StreamingResponse(
        _stream(first, chunks), media_type=CONTENT_TYPES[name[name.rfind(".") :]], headers=FILE_HEADERS
    )


def _stream(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest  # Starlette iterates a plain iterator in a worker thread


@app.get("/", response_class=HTMLResponse)
async def drafter_page(
    profile: str | None = None,
    page: int = PAGE,
    compare: str | None = None,
    before: str | None = None,
    after: str | None = None,
    dataset: str | None = None,
    version: str | None = None,
) -> str:
    from regen.ui.page import page as render

    config, chosen, overview = await _overview(profile, page)
    comparison, compare_error, detail, detail_error = None, None, None, None
    if compare and before and after:
        try:
            comparison = await _compare(chosen, compare, before, after)
        except HTTPException as e:
            compare_error = str(e.detail)
    if dataset and version:
        try:
            detail = await _version(chosen, dataset, version)
        except HTTPException as e:
            detail_error = str(e.detail)
    root = str(config.storage_root)  # parsed once, as a run's root is: what is shown is what is opened
    return render(root, chosen, overview, page, comparison, compare_error, detail, detail_error)
