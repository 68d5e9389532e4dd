"""Every storage key the pipeline reads or writes, in one place (docs/data.md, "Storage layout", shows it whole).

    {profile}/{dataset}/latest.json            the last published version, with its manifest's sha256
    {profile}/{dataset}/{version}/
      prompts/prepare.json                     prepare's record of the version's shards (its presence: prepared)
      prompts/parts/index.json                 a dataset prepared in parts: its parts, deduplicated (until finished)
      prompts/parts/part-00003.parquet         a part's prompts to tokenize; part-00003.json: the shards it wrote
      prompts/shard-00042.parquet              id, source_index, source, messages, tools, meta, prompt_ids
      raw/shard-00042/part-*.jsonl             checkpoints written while generating (resume reads them)
      raw/shard-00042/progress.json            the generating task's numbers at its last checkpoint
      raw/shard-00042.jsonl.zst                every answer of the shard, exactly as the server sent it
      raw/shard-00042.generation.json          how generating went (requests, retries, server seconds)
      train/shard-00042.parquet                training records (and .jsonl when configured); validation/ and
                                               truncated/ alike
      rejected/prepare.jsonl                   rejected rows, each with its reason; rejected/shard-00042-{stage}.jsonl
      rejected/prepare-part-00003.jsonl        the prompts a prepare part's tokenizing rejected
      reports/shard-00042-verdicts.parquet     validate's verdict on every answer
      reports/shard-00042-token-freq.parquet   the ids under the train split's loss mask, counted at export
      reports/shard-00042.json                 the shard's final manifest (its presence: the shard is finished)
      reports/shard-00042.generate.json        its manifest after generate (and .validate.json): the next stage's input
      report/{writer}/report.json, .html, *.png the dataset report, in its publisher's own folder (the manifest
                                               names the writer: of two publishers, the loser's is never named)
      vocab/token_freq.parquet, d2t.npy, t2d.npy  the shards' counts summed, and the draft vocabulary (regen.vocab)
      vocab/specforge.pt                       d2t and t2d as SpecForge loads them (the training hand-off writes it)
      fleet-losses.jsonl                       the answers the fleet lost, as publish last counted them
      manifest.json                            written last: its presence means the version is complete
      writer.json                              the run writing the version, renewed while it writes (regen.claims)
    {profile}/runs/{version}.json              the run's report (a later run of the version: {version}--{run}.json)
    {profile}/.write-check-*                   plan's probe write, deleted at once

Stages take their keys from here and never from each other. Profile, dataset and version names become folders of
every key, so each is checked: one that could climb out of the root is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # starts with a letter or digit: never `.` or `..`
VERSION_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
MANIFEST = "manifest.json"
SPLITS = ("train", "validation", "truncated")
VOCAB_FILES = ("token_freq.parquet", "d2t.npy", "t2d.npy")  # a version's vocab/ folder (regen.vocab)
STAGES_PASSED_ON = ("generate", "validate")  # a shard's stages whose manifest the next stage's task reads
REPORT_FILES = ("report.json", "report.html")
REPORT_PLOTS = (
    "lengths.png",
    "verdicts.png",
    "vocab.png",
)  # the plots report.html shows (regen.stages.publish.dataset_report draws them)
# Files of a version's folder (keys relative to it) besides those its manifest lists: the bookkeeping that makes each
# stage idempotent, the claim, the fleet's losses as publish last counted them, and the hand-off's SpecForge copy of
# the listed vocab/d2t.npy and t2d.npy (torch's bytes, written after the version verified). Anything else the manifest
# does not list is a stray the verifier names.
BOOKKEEPING = re.compile(
    r"(manifest\.json|writer\.json|fleet-losses\.jsonl|prompts/prepare\.json|raw/shard-\d+\.generation\.json"
    r"|reports/shard-\d+(\.generate|\.validate)?\.json|vocab/specforge\.pt)"
)
# What a version's page may be asked to serve to a signed-in user: the manifest and the dataset report, nothing else.
VIEWABLE_FILES = (MANIFEST, *REPORT_FILES, *REPORT_PLOTS)


def version_from_run_id(run_id: str) -> str:
    """A storage-safe version that stays the same for every retry and clear of one DAG run."""
    version = VERSION_UNSAFE.sub("-", run_id).strip("-._")
    if not version:
        raise ValueError(f"run id {run_id!r} gives an empty version")
    return version[:128]


# Names the layout itself uses beside a dataset's or a version's folder: a dataset `runs` would be the run reports'
# folder, a version `latest.json` the dataset's pointer (and `latest` reads as one).
RESERVED = {"dataset": frozenset({"runs"}), "version": frozenset({"latest", "latest.json"})}


def checked_name(part: str, name: str) -> str:
    if not SAFE_NAME.match(name):
        raise ValueError(f"{part} {name!r} cannot name a storage folder: use letters, digits, '_', '.', '-'")
    if name in RESERVED.get(part, ()):
        raise ValueError(f"{part} {name!r} is a name the storage layout uses itself: choose another")
    return name


def dataset_prefix(profile: str, dataset: str) -> str:
    """Where every version of one dataset lives."""
    return f"{checked_name('profile', profile)}/{checked_name('dataset', dataset)}"


def latest_key(profile: str, dataset: str) -> str:
    return f"{dataset_prefix(profile, dataset)}/latest.json"


def run_report_key(profile: str, version: str, run: str | None = None) -> str:
    """The run report of the version's first run; a later run of the version (a Resume) writes its own beside it,
    named after the run."""
    suffix = f"--{checked_name('run', version_from_run_id(run))}" if run else ""
    return f"{checked_name('profile', profile)}/runs/{checked_name('version', version)}{suffix}.json"


def write_check_key(profile: str, token: str) -> str:
    return f"{checked_name('profile', profile)}/.write-check-{token}"


VERDICTS_SUFFIX = "-verdicts.parquet"  # a shard's verdicts, in the version's reports/ folder
TOKEN_COUNTS_SUFFIX = "-token-freq.parquet"  # and its train split's token counts


def report_writer(manifest: Mapping[str, Any]) -> str | None:
    """The publisher whose report a manifest names (None: a version published before reports had writers)."""
    writer = (manifest.get("report") or {}).get("writer")
    return str(writer) if writer else None


def is_report_file(key: str) -> bool:
    """The dataset report's files beside the manifest: drawn again on every publish (plots are not byte-stable)."""
    name = key.rsplit("/", 1)[-1]
    return name in REPORT_FILES or name.endswith(".png")


def is_derived_file(key: str) -> bool:
    """Files publish makes from the version's data before its manifest: the report, and vocab/ (the same bytes on
    every try, so a retried publish overwrites what a dying one left)."""
    return is_report_file(key) or is_vocab_file(key)


def is_vocab_file(key: str) -> bool:
    """One of a version's vocab/ files (VOCAB_FILES)."""
    folder, _, name = key.rpartition("/")
    return folder.endswith("/vocab") and name in VOCAB_FILES


@dataclass(frozen=True)
class DatasetLocation:
    """Where one dataset version lives: {root}/{profile}/{dataset}/{version}/."""

    root: str
    profile: str
    dataset: str
    version: str

    def __post_init__(self) -> None:
        """Checked whatever checked the names upstream: an unsafe name never reaches a key."""
        checked_name("profile", self.profile)
        checked_name("dataset", self.dataset)
        checked_name("version", self.version)

    @property
    def prefix(self) -> str:
        return f"{dataset_prefix(self.profile, self.dataset)}/{self.version}"

    def _key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    @property
    def latest(self) -> str:
        return latest_key(self.profile, self.dataset)

    @property
    def manifest(self) -> str:
        return self._key(MANIFEST)

    @property
    def prepared(self) -> str:
        return self._key("prompts", "prepare.json")

    @property
    def fleet_losses(self) -> str:
        """Every answer the fleet lost in the version, as its last publish counted them (regen.fleet_losses)."""
        return self._key("fleet-losses.jsonl")

    @property
    def writer(self) -> str:
        return self._key("writer.json")

    @property
    def prompts_folder(self) -> str:
        return self._key("prompts") + "/"

    @property
    def prepare_rejections(self) -> str:
        return self._key("rejected", "prepare.jsonl")

    @property
    def prepare_parts_folder(self) -> str:
        """Where a dataset prepared in parts keeps them until its shards are recorded, ending in `/`."""
        return self._key("prompts", "parts") + "/"

    @property
    def prepare_index(self) -> str:
        """A dataset prepared in parts: what its one reading of the source found, and its parts."""
        return self._key("prompts", "parts", "index.json")

    def prepare_part(self, part: int, suffix: str = ".parquet") -> str:
        """A part's prompts to tokenize (`.parquet`), or its record of the shards it wrote (`.json`)."""
        return self._key("prompts", "parts", f"part-{part:05d}{suffix}")

    def prepare_part_rejections(self, part: int) -> str:
        return self._key("rejected", f"prepare-part-{part:05d}.jsonl")

    @property
    def report_folders(self) -> str:
        """Where each publisher writes its report (report/{writer}/), ending in `/`."""
        return self._key("report") + "/"

    def report_file(self, name: str, writer: str | None = None) -> str:
        """report.json, report.html or one of its plots, in the folder of the publisher that wrote it (`writer`, as
        the manifest's `report.writer` names it); without one, beside the manifest (versions published before)."""
        return f"{self.report_folders}{checked_name('writer', writer)}/{name}" if writer else self._key(name)

    def viewable_file(self, name: str, writer: str | None = None) -> str:
        """The key of one of the files a person may open from the Drafter data page; any other name is refused.
        `writer`: the manifest's report writer, where the report files are."""
        if name not in VIEWABLE_FILES:
            raise ValueError(f"{name!r} is not one of a version's viewable files ({', '.join(VIEWABLE_FILES)})")
        return self._key(name) if name == MANIFEST else self.report_file(name, writer)

    def vocab_file(self, name: str) -> str:
        """token_freq.parquet, d2t.npy or t2d.npy: the version's draft vocabulary, written at publish."""
        if name not in VOCAB_FILES:
            raise ValueError(f"{name!r} is not one of a version's vocab files ({', '.join(VOCAB_FILES)})")
        return self._key("vocab", name)

    @property
    def specforge_mapping(self) -> str:
        """vocab/specforge.pt: d2t and t2d as SpecForge's trainer loads them, the hand-off's copy (not listed)."""
        return self._key("vocab", "specforge.pt")

    def shard(self, number: int) -> ShardKeys:
        return ShardKeys(self, number)


@dataclass(frozen=True)
class ShardKeys:
    """The keys of one shard of a version, named by what each holds."""

    location: DatasetLocation
    number: int

    @property
    def name(self) -> str:
        return f"shard-{self.number:05d}"

    def _key(self, folder: str, suffix: str) -> str:
        return self.location._key(folder, f"{self.name}{suffix}")

    @property
    def prompts(self) -> str:
        return self._key("prompts", ".parquet")

    @property
    def checkpoints(self) -> str:
        """The folder of the checkpoint parts, ending in `/`."""
        return self._key("raw", "/")

    @property
    def progress(self) -> str:
        """Where the generating task writes its numbers at every checkpoint, for the UI; gone with the checkpoints."""
        return f"{self.checkpoints}progress.json"

    @property
    def raw(self) -> str:
        return self._key("raw", ".jsonl.zst")

    @property
    def generation(self) -> str:
        return self._key("raw", ".generation.json")

    def rejected(self, stage: str) -> str:
        return self._key("rejected", f"-{stage}.jsonl")

    @property
    def verdicts(self) -> str:
        return self._key("reports", VERDICTS_SUFFIX)

    @property
    def token_counts(self) -> str:
        return self._key("reports", TOKEN_COUNTS_SUFFIX)

    @property
    def report(self) -> str:
        """The shard's final manifest; its presence means the shard is finished."""
        return self._key("reports", ".json")

    def stage_manifest(self, stage: str) -> str:
        """The shard's manifest after `stage` (generate, validate), read by the next stage's task: tasks pass a
        group of shards as a range, whatever its size, and its manifests stay here."""
        if stage not in STAGES_PASSED_ON:
            raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES_PASSED_ON)}")
        return self._key("reports", f".{stage}.json")

    def split(self, split: str, fmt: str = "parquet") -> str:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
        return self._key(split, f".{fmt}")
