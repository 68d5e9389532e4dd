"""Does a published dataset version hold what its manifest says, and is every record what the pipeline promises?

`verify_version` streams every file the manifest names and checks its sha256 and size. Then it reads every record of
the train, validation and truncated splits and checks the invariants a trainer relies on:
- `input_ids` is the prompt that was sent followed by the server's `output_ids` (from the version's prompts/ and
  raw/);
- the loss mask is 0 over the prompt and 1 over the output;
- every id is inside the vocabulary;
- a kept (`ok`) record ends with an EOS id;
- each split holds the records the manifest counts (every shard's train/ file, and each split in all);
- each record is on its source prompt's side (regen.holdout), and each shard's token counts and the version's
  vocab/ files are those of a count of its train records (regen.verify_vocab);
and it names every file in the version's folder that the manifest does not list (bookkeeping aside).

`verify_manifest` does the same for a manifest not written yet: the DAG's verify_dataset task reads a finished
version back before publish writes its manifest, so no manifest names data that was not read back whole.
`python -m regen verify` runs it from a shell, and `read_training_data` checks every file it reads before it yields a
batch. A manifest found through `latest.json` is itself checked against the sha256 recorded there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from regen.errors import FinalError
from regen.layout import BOOKKEEPING, MANIFEST, SPLITS, DatasetLocation, latest_key
from regen.reasons import OK
from regen.storage import Storage, get_json, is_not_found, open_storage
from regen.verify_vocab import count_train_file, has_vocab, vocab_problems, wrong_sides
from regen.vocab import add_counts

log = logging.getLogger(__name__)
MAX_PROBLEMS_PER_FILE = 5  # beyond these, a file's problems are counted, not listed


class VerificationFailed(FinalError):
    """A published version does not match its manifest: do not train on it."""


@dataclass
class Verification:
    manifest_uri: str
    manifest: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    bytes_read: int = 0
    records_checked: int = 0
    bad_files: set[str] = field(default_factory=set)  # missing or not as listed: nothing is compared with them
    split_records: Counter[str] = field(default_factory=Counter)  # records read, per split
    counted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ids under train's loss mask

    def summary(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest_uri,
            "dataset": self.manifest.get("dataset"),
            "version": self.manifest.get("version"),
            "records": self.manifest.get("records"),
            "files": len(self.manifest.get("files", {})),
            "bytes": self.bytes_read,
            "records_checked": self.records_checked,
            "problems": self.problems,
        }

    def check(self, label: str, withheld: str = "") -> None:
        """Raises VerificationFailed naming every problem (after `withheld`: what is not done because of them); logs
        what was read when there is none."""
        if self.problems:
            raise VerificationFailed(f"{label}: {withheld}{len(self.problems)} problems: " + "; ".join(self.problems))
        log.info(
            "verified %s: %d files (%d bytes), %d records checked",
            label,
            len(self.manifest.get("files", {})),
            self.bytes_read,
            self.records_checked,
        )


def manifest_uri_of(
    target: str, root: str | None = None, profile: str | None = None, s3_client: Any = None
) -> tuple[str, str | None]:
    """The manifest a target names, and the sha256 it must have (known when it is found through latest.json).
    A target is a manifest URI, `dataset/version`, or `dataset` alone for its latest version, under root/profile;
    without a profile, the one profile under the root that holds the dataset."""
    if target.endswith(MANIFEST):
        return target, None
    parts = target.strip("/").split("/")
    if len(parts) not in (1, 2) or root is None or not all(parts):
        raise ValueError(f"{target!r}: give a manifest URI, or dataset[/version] with --root")
    storage = open_storage(root, s3_client)
    profile = profile or _the_profile_holding(storage, root, parts[0])
    if len(parts) == 2:
        return storage.uri(DatasetLocation(root, profile, parts[0], parts[1]).manifest), None
    key = latest_key(profile, parts[0])
    if not storage.exists(key):
        raise ValueError(f"{storage.uri(key)} is not there: {parts[0]} has no published version under {root}/{profile}")
    latest = get_json(storage, key)
    return latest["manifest"], latest.get("manifest_sha256")


def _the_profile_holding(storage: Storage, root: str, dataset: str) -> str:
    holding = [p for p in storage.folders("") if dataset in storage.folders(f"{p}/")]
    if len(holding) == 1:
        return holding[0]
    where = f"profiles holding {dataset}: {', '.join(holding)}" if holding else f"no profile there holds {dataset}"
    raise ValueError(f"{root}: give --profile ({where})")


def read_manifest(
    manifest_uri: str, s3_client: Any = None, sha256: str | None = None
) -> tuple[dict[str, Any], Storage]:
    """The manifest, and the storage of the copy it was read from, where its files are looked for (`root` is only
    a record of where it was published: a trainer's copy in another root, or of the version's folder alone, is
    verified as the copy it is). With `sha256`, the manifest must have it."""
    folder, name = manifest_uri.rsplit("/", 1)
    here = open_storage(folder, s3_client)
    body = here.get_bytes(name)
    if sha256 is not None and (actual := hashlib.sha256(body).hexdigest()) != sha256:
        raise VerificationFailed(f"{manifest_uri}: sha256 {actual}, but latest.json says {sha256}")
    manifest = json.loads(body)
    location = DatasetLocation(manifest["root"], manifest["profile"]["name"], manifest["dataset"], manifest["version"])
    return manifest, cast(Storage, VersionFolder(here, location.prefix))


class VersionFolder:
    """A version's files where its manifest lies: the manifest's keys (relative to the root it was published in,
    `{profile}/{dataset}/{version}/...`) are read relative to the manifest's own folder."""

    KEYED = frozenset(
        "uri exists get_bytes get_file size iter_chunks open content_id stamp list_keys folders glob".split()
    )

    def __init__(self, storage: Storage, prefix: str) -> None:
        self.storage, self.prefix = storage, prefix.rstrip("/") + "/"
        self.root_uri = storage.root_uri

    def _key(self, key: str) -> str:
        return key[len(self.prefix) :] if key.startswith(self.prefix) else key

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.storage, name)
        if name not in self.KEYED:
            return method
        return lambda key, *args, **kwargs: method(self._key(key), *args, **kwargs)


def verify_version(
    manifest_uri: str, s3_client: Any = None, records: bool = True, manifest_sha256: str | None = None
) -> Verification:
    """Every problem found, none raised: files that are missing, altered, truncated or not listed, record counts,
    and (with `records`) every record's invariants. `manifest_sha256`: what the manifest must hash to."""
    try:
        manifest, storage = read_manifest(manifest_uri, s3_client, manifest_sha256)
    except VerificationFailed as e:
        return Verification(manifest_uri, {}, problems=[str(e)])
    result = verify_manifest(manifest, storage, records, manifest_uri)
    result.problems += _unlisted(manifest, storage)
    return result


def _unlisted(manifest: dict[str, Any], storage: Storage) -> list[str]:
    location = DatasetLocation(manifest["root"], manifest["profile"]["name"], manifest["dataset"], manifest["version"])
    return unlisted(location.prefix, manifest["files"], storage)


def unlisted(
    prefix: str, listed: Collection[str], storage: Storage, allowed: Callable[[str], bool] | None = None
) -> list[str]:
    """The files in a version's folder (`prefix`) that are not `listed` (its bookkeeping and `allowed` keys aside), as
    one problem. The one check of strays, for `regen verify` and for the DAG's verify before publish alike."""
    folder = prefix.rstrip("/") + "/"
    strays = []
    for name in storage.list_keys(folder):  # a VersionFolder lists relative to the version's folder, a root not
        key = name if name.startswith(folder) else f"{folder}{name}"
        relative = key[len(folder) :]
        if key not in listed and not BOOKKEEPING.fullmatch(relative) and not (allowed and allowed(key)):
            strays.append(key)
    if not strays:
        return []
    more = f" and {len(strays) - MAX_PROBLEMS_PER_FILE} more" if len(strays) > MAX_PROBLEMS_PER_FILE else ""
    named = ", ".join(strays[:MAX_PROBLEMS_PER_FILE])
    return [f"{len(strays)} files in the version's folder are not listed in the manifest: {named}{more}"]


def verify_manifest(
    manifest: dict[str, Any], storage: Storage, records: bool = True, manifest_uri: str = ""
) -> Verification:
    """`verify_version` over a manifest given whole, written or not; its keys are relative to `storage`."""
    import pyarrow as pa

    result = Verification(manifest_uri, manifest)
    files, sizes = manifest["files"], manifest.get("sizes", {})
    shards = manifest["shards"]
    for shard in shards:
        for key in (shard.get("train"), shard.get("raw"), shard.get("prompts")):
            if key and key not in files:
                result.problems.append(f"{key}: part of {shard['shard']} but not listed in the manifest's files")
    counted = {shard["train"]: shard["records"] for shard in shards}
    if (held := sum(counted.values())) != manifest["records"]:
        result.problems.append(f"shards hold {held} records, manifest says {manifest['records']}")
    counted |= {shard["validation"]: shard["validation_records"] for shard in shards if shard.get("validation")}
    with tempfile.TemporaryDirectory(prefix="regen-verify-") as tmp:
        for key in sorted(files):
            keep = Path(tmp) / Path(key).name if records and _is_split(key) else None
            if _check_file(storage, key, files[key], sizes.get(key), keep, result) and keep is not None:
                try:  # listed whole (its sha256 the manifest's) yet no Parquet file of records: named, not a crash
                    _check_records(storage, manifest, key, keep, counted.get(key), result)
                except pa.ArrowException as e:  # not KeyError: a manifest's missing field is no file's fault
                    result.problems.append(f"{key}: unreadable as a file of records ({type(e).__name__}: {e!s:.200})")
                    result.bad_files.add(key)
                keep.unlink()
    splits = (manifest.get("splits") or {}) if records else {}  # a draft manifest has none yet
    for split, expected in splits.items():
        whole = not any(f"/{split}/" in key for key in result.bad_files)  # a bad file is named already
        if split in SPLITS and whole and (held := result.split_records[split]) != expected:
            result.problems.append(f"{split}/ holds {held} records, manifest says {expected}")
    if records and has_vocab(manifest, result.bad_files):
        result.problems += vocab_problems(manifest, storage, result.counted)
    return result


def verify_published(manifest_uri: str, s3_client: Any = None, manifest_sha256: str | None = None) -> dict[str, Any]:
    """Raises VerificationFailed naming every problem; returns the version's identity and counts when all is right."""
    result = verify_version(manifest_uri, s3_client, manifest_sha256=manifest_sha256)
    result.check(manifest_uri)
    return {k: v for k, v in result.summary().items() if k != "problems"}


def read_training_data(
    manifest_uri: str,
    s3_client: Any = None,
    split: str = "train",
    columns: list[str] | None = None,
    manifest_sha256: str | None = None,
) -> Iterator[Any]:
    """The version's records as pyarrow RecordBatches, shard by shard. Each file is checked against the manifest
    (sha256, size) before any of its batches is yielded, and the manifest against `manifest_sha256` (an asset
    event's or latest.json's) when given; a mismatch raises VerificationFailed."""
    import pyarrow.parquet as pq

    manifest, storage = read_manifest(manifest_uri, s3_client, manifest_sha256)
    keys = sorted(key for key in manifest["files"] if _is_split(key) and f"/{split}/" in key)
    with tempfile.TemporaryDirectory(prefix="regen-read-") as tmp:
        for key in keys:
            path = Path(tmp) / "shard.parquet"
            check = Verification(manifest_uri, manifest)
            if not _check_file(storage, key, manifest["files"][key], manifest.get("sizes", {}).get(key), path, check):
                raise VerificationFailed("; ".join(check.problems))
            yield from pq.ParquetFile(path).iter_batches(columns=columns)
            path.unlink()


def _is_split(key: str) -> bool:
    return key.endswith(".parquet") and any(f"/{split}/" in key for split in SPLITS)


def _check_file(
    storage: Storage, key: str, sha256: str, size: int | None, keep: Path | None, result: Verification
) -> bool:
    """Streams the file through sha256 (and into `keep`, to read its records after); True when it matches."""
    digest, length = hashlib.sha256(), 0
    try:
        with keep.open("wb") if keep is not None else contextlib.nullcontext() as out:
            for chunk in storage.iter_chunks(key):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
                length += len(chunk)
    except Exception as e:  # a local file or an S3 object that is not there; anything else is not ours to judge
        if is_not_found(e):
            result.problems.append(f"{key}: missing")
            result.bad_files.add(key)
            return False
        raise
    result.bytes_read += length
    if size is not None and length != size:
        result.problems.append(f"{key}: {length} bytes, manifest says {size}")
    elif digest.hexdigest() != sha256:
        result.problems.append(f"{key}: sha256 {digest.hexdigest()}, manifest says {sha256}")
    else:
        return True
    result.bad_files.add(key)
    return False


def _check_records(
    storage: Storage, manifest: dict[str, Any], key: str, path: Path, expected: int | None, result: Verification
) -> None:
    """The records of one split file against the invariants, vectorized over the whole file."""
    import pyarrow.parquet as pq

    split = next(s for s in SPLITS if f"/{s}/" in key)
    columns = ["id", "input_ids", "loss_mask", "prompt_len", "verdict"]
    table = pq.read_table(path, columns=columns + (["side"] if "side" in pq.read_schema(path).names else []))
    problems: list[str] = []
    if expected is not None and table.num_rows != expected:
        problems.append(f"{table.num_rows} records, manifest says {expected}")
    input_ids = table.column("input_ids").combine_chunks()
    mask = table.column("loss_mask").combine_chunks()
    lengths = input_ids.value_lengths().to_numpy(zero_copy_only=False)
    offsets = input_ids.offsets.to_numpy()
    starts = offsets[:-1] - offsets[0]
    values = input_ids.flatten().to_numpy(zero_copy_only=False)  # every record's ids, end to end
    prompt_len = table.column("prompt_len").to_numpy()
    sample_ids = table.column("id").to_pylist()
    roles = manifest["token_roles"]

    def bad(rows: np.ndarray, what: str) -> None:
        if len(rows):
            listed = ", ".join(sample_ids[int(r)] for r in rows[:MAX_PROBLEMS_PER_FILE])
            problems.append(f"{len(rows)} records {what} ({listed})")

    bad(np.flatnonzero(mask.value_lengths().to_numpy(zero_copy_only=False) != lengths), "whose mask length differs")
    bad(np.flatnonzero((prompt_len <= 0) | (prompt_len >= lengths)), "with no prompt or no output")
    row_of_id = np.repeat(np.arange(len(lengths)), lengths)
    outside = (values < 0) | (values >= roles["vocab_size"])
    bad(np.unique(row_of_id[outside]), f"with ids outside the vocabulary of {roles['vocab_size']}")
    if not problems:  # masks are the ids' length: compare them element by element
        position = np.arange(len(values)) - np.repeat(starts, lengths)
        boundary = (position >= np.repeat(prompt_len, lengths)).astype(np.int8)
        masked = mask.flatten().to_numpy(zero_copy_only=False)
        bad(np.unique(row_of_id[masked != boundary]), "whose loss mask is not the prompt boundary")
        last = values[starts + lengths - 1]
        ok = np.asarray(table.column("verdict").to_pylist()) == OK
        bad(np.flatnonzero(ok & ~np.isin(last, roles["eos_ids"])), "kept as ok that do not end with an EOS id")
        rows = (sample_ids, values, starts, lengths, prompt_len)
        # the side each record claims: a truncated/ file's column, else the split it is in
        sides = table.column("side").to_pylist() if "side" in table.column_names else [split] * table.num_rows
        problems += _against_sources(storage, manifest, key, rows, result.bad_files, sides)
    if split == "train" and not problems:
        counts, mismatch = count_train_file(storage, manifest, key, table, result.bad_files)
        result.counted, problems = add_counts(result.counted, counts), problems + mismatch
    elif split == "train":  # a file that breaks the structure is not counted, nor the version's counts compared
        result.bad_files.add(key)
    result.records_checked += table.num_rows
    result.split_records[split] += table.num_rows
    result.problems += [f"{key}: {problem}" for problem in problems]


def _against_sources(
    storage: Storage,
    manifest: dict[str, Any],
    key: str,
    rows: tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    bad_files: set[str],
    sides: list[str],
) -> list[str]:
    """input_ids == the prompt sent (prompts/, or raw/ for an on-policy turn) + the server's output ids (raw/), record
    by record, and each record on its source prompt's side. `rows`: the records' ids, all their input ids end to
    end, where each starts, its length and its prompt's length; `sides`: the side each record claims."""
    from regen.records import read_prompts, read_raw

    sample_ids, values, starts, lengths, prompt_len = rows
    shard_name = Path(key).name.removesuffix(".parquet")
    shard = next((s for s in manifest["shards"] if s["shard"] == shard_name), None)
    if shard is None or not shard.get("prompts") or not shard.get("raw"):
        return [f"no prompts/ and raw/ listed for {shard_name}: records not compared with what was sent"]
    if bad_files & {shard["prompts"], shard["raw"]}:
        return []  # already named as missing or altered: there is nothing sound to compare with
    share = manifest.get("validation_share")  # None: published before validation/, nothing held out
    prompts = read_prompts(storage, shard["prompts"], ["id", "prompt_ids"], sides=bool(share))
    wanted = set(sample_ids)
    sent: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # answer id -> (prompt ids, output ids)
    with tempfile.TemporaryDirectory(prefix="regen-verify-raw-") as tmp:
        for answer in read_raw(storage, shard["raw"], Path(tmp)):
            if answer.id in wanted and answer.id in prompts:
                # Arrays at once, the ints let go answer by answer: a shard's outputs held as Python ints are some
                # 70 MB at once (a 20k version's peak in one process: 404 MB that way, 378 MB this way).
                sent[answer.id] = (prompts.prompt_of(answer), np.asarray(answer.output_ids, dtype=np.int64))
    wrong = wrong_sides(prompts, share, sample_ids, sides) if share else []
    listed = ", ".join(wrong[:MAX_PROBLEMS_PER_FILE])
    problems = [f"{len(wrong)} records not on their source prompt's side ({listed})"] if wrong else []
    differ = []
    for row, sample_id in enumerate(sample_ids):
        start, cut, end = starts[row], starts[row] + prompt_len[row], starts[row] + lengths[row]
        pair = sent.get(sample_id)
        if (
            pair is None
            or not np.array_equal(values[start:cut], pair[0])
            or not np.array_equal(values[cut:end], pair[1])
        ):
            differ.append(sample_id)
    if not differ:
        return problems
    listed = ", ".join(differ[:MAX_PROBLEMS_PER_FILE])
    problems.append(f"{len(differ)} records whose input_ids are not the prompt sent + the server's output ({listed})")
    return problems
