"""What a retry cannot mend is a FinalError (the DAG fails it at once); transient faults never are."""

from __future__ import annotations

import pytest

from regen.config import ConfigError
from regen.errors import FinalError
from regen.run_report import IncompleteRun
from regen.sglang.client import PermanentError, TransientError
from regen.sglang.fleet import FleetUnavailable
from regen.sglang.server_check import ServerMismatch
from regen.stages.prepare.sources import CorruptSource, MissingSource
from regen.stages.publish.publish import IncompleteDataset
from regen.stages.validate import TemplateDrift


@pytest.mark.parametrize(
    "error",
    [ConfigError, MissingSource, CorruptSource, ServerMismatch, TemplateDrift, IncompleteDataset, IncompleteRun],
)
def test_wrong_inputs_and_states_are_final(error: type[Exception]) -> None:
    assert issubclass(error, FinalError)


@pytest.mark.parametrize("error", [TransientError, FleetUnavailable, PermanentError])
def test_faults_of_the_fleet_or_of_one_sample_are_not(error: type[Exception]) -> None:
    """The fleet's faults are retried by Airflow; a sample's 400 is a per-record rejection, never a task failure."""
    assert not issubclass(error, FinalError)


def test_a_missing_source_is_still_a_file_not_found() -> None:
    assert issubclass(MissingSource, FileNotFoundError) and issubclass(ConfigError, ValueError)
