"""The pipeline's files as the page reads them: typed views holding only the fields it shows, read with a cap on
their size.

msgspec decodes a view straight from the file's bytes and skips every field the view does not name without building
it: a manifest's thousands of file entries (sha256 and size of every file of every shard) cost a scan, not a Python
object each. A field of another type than the view's makes the file unreadable (`UNREADABLE`), which the catalog
turns into a row that says why; fields the page only shows are `Any` and reach the HTML escaped.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from regen.layout import MANIFEST, DatasetLocation, report_writer
from regen.storage import Storage, is_not_found

MIB = 2**20
# Fixed-size documents (report.json, progress.json, latest.json) are a few KB; 4 MiB is far past any of them.
SMALL_FILE_BYTES = 4 * MIB
# manifest.json and prepare.json grow with the shards: about 1.4 KB (manifest: each file's sha256 and size) and
# 0.6 KB (prepare) per shard, so 32 MiB holds about 20,000 shards, 4 x 10^7 prompts at 2,000 a shard.
INDEX_FILE_BYTES = 32 * MIB

# What a file of another schema, or not JSON at all, raises while it is read or its numbers computed: one version's
# row says so, and the page stays up. msgspec's errors are ValueErrors; RecursionError: nesting past its limit.
UNREADABLE = (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError, RecursionError)

View = TypeVar("View", bound=msgspec.Struct)


class TooLarge(ValueError):
    """A file bigger than the page reads: not what the pipeline writes."""


class ManifestView(msgspec.Struct):
    """manifest.json: what a published version's row shows without its report."""

    published_at: Any = None
    run_id: Any = None
    records: int = 0
    splits: dict[str, int] = {}
    stages: dict[str, Any] = {}
    prepare: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    retokenize_drift: Any = None
    verified: Any = None
    cost: Any = None
    report: dict[str, Any] = {}  # its `writer`: whose folder the report files are in (layout.report_file)
    decontamination: dict[str, Any] = {}
    vocab: dict[str, Any] = {}  # the draft vocabulary's sizes and coverage (regen.stages.publish.vocab_files)


class ReportView(msgspec.Struct):
    """report.json: the numbers and plots of a version's answers."""

    answered: Any = 0
    truncation_rate: dict[str, Any] = {}
    tool_call_rate: Any = None
    retokenize_drift: Any = None
    tokens: dict[str, Any] = {}
    lengths: dict[str, Any] = {}
    histograms: dict[str, Any] = {}
    verdicts: dict[str, Any] = {}
    length_prediction: dict[str, Any] = {}  # what ordered its requests, and how well (Spearman)


class PreparedShard(msgspec.Struct):
    shard: int
    num_prompts: int
    num_answers: int | None = None  # on-policy: every turn is an answer

    @property
    def total(self) -> int:
        return self.num_answers or self.num_prompts


class PreparedView(msgspec.Struct):
    """prompts/prepare.json: a version's shards before any is generated."""

    prepared_at: Any = None
    run_id: Any = None
    shards: list[PreparedShard] = []


class ProgressView(msgspec.Struct):
    """raw/shard-N/progress.json: what the generating task wrote at its last checkpoint."""

    done: int
    answered: int
    started_at: float
    updated_at: float
    in_flight: int
    concurrency: int
    retries_by_cause: dict[str, Any] = {}


class LatestView(msgspec.Struct):
    """latest.json: which version is the dataset's last published one."""

    version: str


def read_view(storage: Storage, key: str, view: type[View], cap: int) -> View | None:
    """The file at `key` as `view`, None when it is not there (yet, or any more). At most `cap` bytes are read: a
    bigger file raises TooLarge rather than being fetched whole."""
    try:
        data = storage.read_start(key, cap + 1)
    except Exception as e:
        if is_not_found(e):
            return None
        raise
    if len(data) > cap:
        raise TooLarge(f"{key.rsplit('/', 1)[-1]} is larger than {cap:,} bytes: not read")
    return msgspec.json.decode(data, type=view)


def viewable_key(storage: Storage, location: DatasetLocation, name: str) -> str:
    """The key of a version's file the page may serve: the report's in the folder its manifest names (raises
    ValueError for any other name, or a manifest that names a folder no key may have)."""
    if name == MANIFEST:
        return location.viewable_file(name)
    manifest = read_view(storage, location.manifest, ManifestView, INDEX_FILE_BYTES)
    return location.viewable_file(name, report_writer({"report": manifest.report}) if manifest is not None else None)
