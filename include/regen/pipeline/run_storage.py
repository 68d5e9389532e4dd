"""Where every write of a task comes from: its run's storage, opened once per task on the root plan checked.

A task opens its run's storage once (`RunStorage.open`, the one place a task gets its storage) and passes it through
everything it does: a group's shards, their kept stage manifests, its claims. So one task makes one S3 client, and
every write it makes goes through one `Storage` value, which a crash-point test can wrap (bench/crashpoints.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from regen.claims import held, release
from regen.errors import FinalError
from regen.layout import DatasetLocation, dataset_prefix
from regen.manifest import PreparedDataset
from regen.run_params import RunSpec
from regen.storage import S3ClientFactory, Storage, get_json, open_storage


class NotPrepared(FinalError):
    """A dataset whose prepare never finished has no shards to verify or publish."""


@dataclass(frozen=True)
class RunStorage:
    """A task's storage, opened once on the root plan checked, and what its run does there: hold a version's claim
    while it writes (regen.claims, as this run's try), read what prepare recorded."""

    run: RunSpec
    storage: Storage

    @classmethod
    def open(cls, run: RunSpec, s3_client: S3ClientFactory | None) -> RunStorage:
        if run.storage_root.kind == "s3" and s3_client is not None:
            return cls(run, open_storage(run.storage_root, s3_client()))
        return cls(run, open_storage(run.storage_root))  # the root plan checked, as it parsed it

    @contextmanager
    def writing(self, location: DatasetLocation) -> Iterator[Storage]:
        with held(self.storage, location, self.run.run_id, self.run.try_token):
            yield self.storage

    def remove_stale_temporaries(self, location: DatasetLocation) -> None:
        """What writers killed mid-write left in the version's folder and beside its latest.json (a local root's
        temporary files), removed before the version is read back whole and published."""
        self.storage.remove_stale_temporaries(location.prefix)
        self.storage.remove_stale_temporaries(dataset_prefix(location.profile, location.dataset), recursive=False)

    def release(self, location: DatasetLocation) -> None:
        release(self.storage, location, self.run.run_id, self.run.try_token)

    def prepared(self, dataset: str) -> PreparedDataset:
        key = self.run.location(dataset).prepared
        if not self.storage.exists(key):
            raise NotPrepared(
                f"{dataset}: not prepared ({self.storage.uri(key)} is missing): its prepare_dataset or one of its "
                "prepare_part tasks failed, and says why"
            )
        return PreparedDataset.from_dict(get_json(self.storage, key))
