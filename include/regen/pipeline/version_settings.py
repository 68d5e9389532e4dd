"""What a version is made with, whichever run makes its shards: the settings its first prepare recorded.

A Resume (the page's button sends only the datasets and the version) or a backfill of a red run is planned over
today's config defaults, which may have changed since the version was prepared. Its shards are sampled, split and
exported as the version's inputs say (regen.version_inputs), never as the resuming run's, so every shard of a version
is made alike and its manifest says how: a version prepared at validation_share 0.3 and resumed at the default is
still split at 0.3.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from regen.manifest import PreparedDataset
from regen.run_params import RunSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionSettings:
    sampling: dict[str, Any]  # exactly what every /generate request of the version sends
    validation_share: float
    export: dict[str, bool]

    @classmethod
    def of(cls, prepared: PreparedDataset, run: RunSpec) -> VersionSettings:
        """The version's settings; a version prepared before its inputs were recorded takes the run's."""
        inputs = prepared.inputs
        if "sampling" not in inputs:
            return cls(run.sampling, run.validation_share, run.export)
        export = {name: bool(inputs.get("export", {}).get(name)) for name in run.export}
        settings = cls(inputs["sampling"], float(inputs.get("validation_share", 0.0)), export)
        differ = settings.differences(cls(run.sampling, run.validation_share, run.export))
        if differ:
            log.warning(
                "%s version %s is made with its own settings, not this run's: %s",
                prepared.location.dataset,
                prepared.location.version,
                "; ".join(differ),
            )
        return settings

    def differences(self, other: VersionSettings) -> list[str]:
        """What `other` sets otherwise, each as `name: ours (not theirs)`."""
        ours = {**self.sampling, "validation_share": self.validation_share, **self.export}
        theirs = {**other.sampling, "validation_share": other.validation_share, **other.export}
        return [
            f"{k}: {ours.get(k)} (not {theirs.get(k)})"
            for k in sorted({*ours, *theirs})
            if ours.get(k) != theirs.get(k)
        ]
