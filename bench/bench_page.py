"""The Drafter data page: a cold load against listing the bucket alone, in the same run.

    .venv/bin/python bench/bench_page.py                                  # 100, 1,000 and 10,000 versions, both
    .venv/bin/python bench/bench_page.py --versions 1000 --backends s3
    .venv/bin/python bench/bench_page.py --versions 1000 --before ffacb48   # and the page as it was at a commit

One dataset of N versions shaped like the pipeline's, newest first by their run ids (hourly scheduled runs):
published ones (manifest.json of `--shards` shards with every file's sha256 and size, report.json with its
histograms, the dataset's latest.json naming the newest), three being generated (prepare.json and 8 shards:
finished, generated, generating with a progress file, waiting) and three abandoned alike, one of each among the
newest twenty. The abandoned ones are written first, the others a few seconds later, and the page's clock is set a
day (its abandoned_after_s) after a moment between the two writes: the same set-up serves S3, whose LastModified
cannot be set back. Written to a local directory and to an S3 API on loopback (moto
server, its own process). Then, best of three:
- a cold load: the catalog's scan of page 0 with no cache, and the page rendered. Requests counted: on S3 every HTTP
  request botocore sends (LIST pages included), locally the files read and folders listed. HTML bytes, and JSON
  bytes of /api/datasets + /api/runs;
- of it, the one LIST a load cannot avoid: the dataset's version folders (S3: a request per 1,000 versions);
- a reload after the page's 10 s cache expired, published versions' summaries kept (the plugin's steady state);
- the listing of every object under the root: what any page that looks at the bucket pays at least;
and the cold load's ratio to the listing. `--before COMMIT` also times the page's code at that commit (its
catalog read every version, twice: for the datasets and for the runs in progress).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regen.layout import DatasetLocation, dataset_prefix, latest_key, version_from_run_id  # noqa: E402
from regen.storage import LocalStorage, S3Storage, Storage  # noqa: E402
from regen.ui.caches import PublishedSummaries  # noqa: E402
from regen.ui.catalog import Catalog, Limits  # noqa: E402
from regen.ui.page import page  # noqa: E402
from tools.devstack import BIN, free_port, wait_until  # noqa: E402

PROFILE, DATASET = "kimi-k2.5-mini", "B1_glaive"
UNPUBLISHED, SHARDS_UNPUBLISHED = 3, 8
NEWEST = datetime(2026, 12, 1, 2, tzinfo=UTC)
GAP_S = 3.0  # between the abandoned versions' writes and the others': S3's LastModified has whole seconds


def sha(i: int) -> str:
    return f"{i:064x}"


def manifest(location: DatasetLocation, published_at: str, shards: int) -> dict[str, Any]:
    """A manifest as publish writes it: the shards, every file with its sha256 and size (what makes it grow)."""
    keys = [location.shard(s) for s in range(shards)]
    files = [k for shard in keys for k in (shard.prompts, shard.raw, shard.generation, shard.verdicts, shard.report)]
    files += [shard.split("train") for shard in keys]
    files += [location.report_file(name) for name in ("report.json", "report.html")]
    counts = {"total": 2000 * shards, "kept": 1990 * shards, "dropped": 10 * shards}
    return {
        "dataset": location.dataset,
        "profile": {"name": PROFILE, "tokenizer": "builtin:kimi-k2.5-mini", "chat_template_sha256": sha(7)},
        "token_roles": {"eos_ids": [100001, 100002], "vocab_size": 163840, "role_ids": [100003, 100004, 100005]},
        "version": location.version,
        "published_at": published_at,
        "run_id": f"scheduled__{published_at}",
        "prepare": {**counts, "dropped_by_reason": {"duplicate": 6 * shards, "prompt_too_long": 4 * shards}},
        "stages": {s: {**counts, "dropped_by_reason": {"text_mismatch": shards}} for s in ("generate", "validate")},
        "records": 1980 * shards,
        "splits": {"train": 1970 * shards, "truncated": 10 * shards},
        "retokenize_drift": {"sampled": 100, "drifted": 3, "rate": 0.03},
        "cost": {"prompt_tokens": 4_000_000 * shards, "cached_share": 0.61, "currency": "USD"},
        "verified": {"bytes": 2_500_000_000 * shards, "records_checked": 1980 * shards},
        "shards": [{"shard": k.name, "prompts": k.prompts, "num_prompts": 2000, "records": 1980} for k in keys],
        "files": {key: sha(i) for i, key in enumerate(files)},
        "sizes": {key: 125_000_000 + i for i, key in enumerate(files)},
    }


def report(shards: int) -> dict[str, Any]:
    bins = 40
    histogram = {"edges": [i * 100.0 for i in range(bins + 1)], "counts": [(i * 37) % 211 for i in range(bins)]}
    return {
        "answered": 2000 * shards,
        "verdicts": {"ok": 1970 * shards, "truncated": 10 * shards, "text_mismatch": shards},
        "tokens": {"prompt": 4_000_000 * shards, "output": 1_500_000 * shards},
        "lengths": {name: {"mean": 900.0, "p50": 850.0, "p90": 2100.0, "p99": 3900.0} for name in ("prompt", "output")},
        "histograms": {"prompt": histogram, "output": histogram},
        "truncation_rate": {"length": 0.005},
        "tool_call_rate": 0.31,
        "retokenize_drift": {"sampled": 100, "drifted": 3, "rate": 0.03},
    }


def unpublished(location: DatasetLocation, now: float) -> dict[str, bytes]:
    """A version being made: prepare's record; shards 0-3 finished, 4 generated, 5-6 generating, 7 waiting."""
    shards = [{"shard": s, "num_prompts": 2000, "prompts_key": location.shard(s).prompts} for s in range(8)]
    files = {location.prepared: json.dumps({"shards": shards, "prepared_at": "2026-12-01"}).encode()}
    for s in range(SHARDS_UNPUBLISHED):
        keys = location.shard(s)
        files[keys.prompts] = b"P" * 1000
        if s <= 4:
            files[keys.raw] = b"R" * 1000
        if s <= 3:
            files[keys.report] = b"{}"
        if s in (5, 6):
            files[f"{keys.checkpoints}part-00000.jsonl"] = b"{}\n" * 100
            progress = {"done": 900, "answered": 900, "started_at": now - 600, "updated_at": now, "in_flight": 64}
            files[keys.progress] = json.dumps({**progress, "concurrency": 64, "retries_by_cause": {}}).encode()
    return files


@dataclass(frozen=True)
class Shape:
    """Which of the N versions (index 0 the newest) are being made, and which abandoned."""

    versions: int

    def names(self) -> list[str]:
        runs = (f"scheduled__{(NEWEST - timedelta(hours=i)).isoformat()}" for i in range(self.versions))
        return [version_from_run_id(run_id) for run_id in runs]

    def generating(self) -> set[int]:
        return {0, *(i for i in (self.versions // 2, self.versions - 2) if i > 0)}

    def abandoned(self) -> set[int]:
        return {i for i in (5, self.versions // 3, self.versions - 1) if i > 0} - self.generating()


def build(put: Callable[[str, bytes], None], shape: Shape, shards: int) -> float:
    """The dataset written through `put`; returns a moment after the abandoned versions' writes and before the
    others'."""
    names, now = shape.names(), time.time()
    location = {i: DatasetLocation("", PROFILE, DATASET, name) for i, name in enumerate(names)}

    def version(i: int) -> dict[str, bytes]:
        if i in shape.generating() | shape.abandoned():
            return unpublished(location[i], now)
        at = (NEWEST - timedelta(hours=i)).isoformat()
        body = json.dumps(manifest(location[i], at, shards), indent=1).encode()
        return {location[i].manifest: body, location[i].report_file("report.json"): json.dumps(report(shards)).encode()}

    def write(indices: list[int]) -> None:
        items = [(k, v) for i in indices for k, v in version(i).items()]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda item: put(*item), items))

    write(sorted(shape.abandoned()))
    old_until = time.time()
    time.sleep(GAP_S)
    write([i for i in range(shape.versions) if i not in shape.abandoned()])
    newest_published = min(set(range(shape.versions)) - shape.generating() - shape.abandoned())
    put(latest_key(PROFILE, DATASET), json.dumps({"version": names[newest_published]}).encode())
    return old_until + GAP_S / 2


class Counted:
    """Storage calls made, for local storage: files read or looked for, folders listed (not `uri`, which is no I/O)."""

    def __init__(self, inner: Storage) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if not callable(attribute) or name == "uri":
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attribute(*args, **kwargs)

        return counted


@dataclass
class Backend:
    name: str
    storage: Storage
    requests: Callable[[], int]  # requests (S3) or storage calls (local) so far
    reader: Storage  # what the page reads through (counting, locally)


def load(backend: Backend, limits: Limits, kept: PublishedSummaries | None) -> tuple[float, int, int, int]:
    """One page load: seconds, requests, HTML bytes, JSON bytes."""
    before, start = backend.requests(), time.perf_counter()
    overview = Catalog(backend.reader, PROFILE, limits, kept).overview([DATASET])
    html = page(backend.storage.root_uri, PROFILE, overview)
    seconds = time.perf_counter() - start
    body = len(json.dumps(overview.datasets)) + len(json.dumps(overview.runs))
    return seconds, backend.requests() - before, len(html.encode()), body


def old_load(commit: str) -> Callable[[Backend], tuple[float, int, int, int]]:
    """The page's code at `commit`, loaded from git: a cold load as its plugin made it (datasets, then runs)."""
    modules = {}
    for name, path in (("catalog", "include/regen/catalog.py"), ("drafter_page", "include/regen/drafter_page.py")):
        source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True).stdout
        modules[name] = types.ModuleType(f"before_{name}")
        exec(compile(source, f"{commit}:{path}", "exec"), modules[name].__dict__)

    def timed(backend: Backend) -> tuple[float, int, int, int]:
        before, start = backend.requests(), time.perf_counter()
        rows = modules["catalog"].overview(backend.reader, PROFILE, [DATASET])
        runs = modules["catalog"].in_progress(backend.reader, PROFILE, [DATASET])
        html = modules["drafter_page"].page(backend.storage.root_uri, PROFILE, rows, runs, None)
        body = len(json.dumps(rows)) + len(json.dumps(runs))
        return time.perf_counter() - start, backend.requests() - before, len(html.encode()), body

    return timed


def versions_listing(backend: Backend) -> tuple[float]:
    """The one LIST a load cannot avoid: the dataset's version folders (a request per 1,000 on S3)."""
    start = time.perf_counter()
    backend.storage.folders(dataset_prefix(PROFILE, DATASET) + "/")
    return (time.perf_counter() - start,)


def listing(backend: Backend) -> tuple[float, int]:
    start = time.perf_counter()
    found = backend.storage.list_objects("")
    return time.perf_counter() - start, len(found)


def best(runs: int, measure: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
    return min((measure() for _ in range(runs)), key=lambda result: result[0])


@contextmanager
def moto() -> Iterator[Any]:
    """An S3 API on loopback in a process of its own (it must not share this process's GIL), and its client."""
    import boto3
    import requests

    port = free_port()
    server = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until("moto server", lambda: requests.get(url, timeout=2).status_code < 500, 60)
        yield boto3.client(
            "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
    finally:
        server.terminate()
        server.wait(10)


def local_backend(folder: Path, shape: Shape, shards: int) -> tuple[Backend, float]:
    """A local root and the moment between the abandoned versions' writes and the others'."""

    def put(key: str, body: bytes) -> None:
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)

    between = build(put, shape, shards)
    counted = Counted(LocalStorage(folder))
    return Backend("local", counted.inner, lambda: counted.calls, counted), between  # type: ignore[arg-type]


def s3_backend(client: Any, bucket: str, shape: Shape, shards: int) -> tuple[Backend, float]:
    client.create_bucket(Bucket=bucket)
    storage = S3Storage(bucket, "eagle3", client)
    sent = [0]
    client.meta.events.register("before-send.s3", lambda **_: sent.__setitem__(0, sent[0] + 1))
    between = build(lambda key, body: client.put_object(Bucket=bucket, Key=f"eagle3/{key}", Body=body), shape, shards)
    return Backend("S3 (moto)", storage, lambda: sent[0], storage), between


def measure(backend: Backend, versions: int, between: float, before: Callable[[Backend], Any] | None) -> None:
    limits = Limits(clock=lambda: between + Limits().abandoned_after_s)  # a day after: only the first writes are idle
    kept = PublishedSummaries()
    overview = Catalog(backend.reader, PROFILE, limits, kept).overview([DATASET])  # fills the summaries kept
    shown = [v["state"] for v in overview.datasets[0]["versions"]]
    assert (shown.count("generating"), shown.count("abandoned"), len(shown)) == (1, 1, 20), shown  # what is measured
    seconds, requests, html, body = best(3, lambda: load(backend, limits, None))
    reload_s, reload_requests, _, _ = best(3, lambda: load(backend, limits, kept))
    (folders,) = best(3, lambda: versions_listing(backend))
    floor, objects = best(3, lambda: listing(backend))
    print(
        f"| {versions:,} | {backend.name} | {seconds:.3f} | {folders:.3f} | {requests:,} | {html:,} | {body:,} | "
        f"{reload_s:.3f} ({reload_requests:,}) | {floor:.3f} ({objects:,} objects) | x{seconds / floor:.2f} |",
        flush=True,
    )
    if before is not None:
        old_s, old_requests, old_html, old_body = best(1 if versions > 1000 else 3, lambda: before(backend))
        print(
            f"| {versions:,} | {backend.name}, before | {old_s:.3f} | | {old_requests:,} | {old_html:,} | "
            f"{old_body:,} | | {floor:.3f} | x{old_s / floor:.2f} |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--backends", nargs="+", choices=["local", "s3"], default=["local", "s3"])
    parser.add_argument("--shards", type=int, default=4, help="shards of each published version (its manifest)")
    parser.add_argument("--before", metavar="COMMIT", help="also time the page's code at this commit")
    args = parser.parse_args(argv)
    before = old_load(args.before) if args.before else None
    print(f"$ python bench/bench_page.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(
        "| versions | backend | cold load s | of it, LIST of versions s | requests (S3) / storage calls (local) | "
        "HTML bytes | JSON bytes | reload s (requests), summaries kept | listing s | cold load / listing |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-page-") as tmp, moto() if "s3" in args.backends else _none() as s3:
        for versions in args.versions:
            shape = Shape(versions)
            if "local" in args.backends:
                backend, between = local_backend(Path(tmp) / f"local-{versions}", shape, args.shards)
                measure(backend, versions, between, before)
            if "s3" in args.backends:
                backend, between = s3_backend(s3, f"bench-page-{versions}", shape, args.shards)
                measure(backend, versions, between, before)


@contextmanager
def _none() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
