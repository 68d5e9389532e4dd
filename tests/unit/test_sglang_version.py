"""The SGLang release the pipeline is proven against: docker-compose.yaml pins its image, and a fleet that serves
another version, or does not say which, passes the check with a warning in the log and in the run report."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from regen import pipeline
from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.sglang.parity import PROVEN_SGLANG_VERSION, sglang_version_warnings
from regen.sglang.server_check import check_fleet
from tests.conftest import ROOT, Simulator, start_simulator

PROVEN = f"prompts and answers are proven equal to SGLang {PROVEN_SGLANG_VERSION}'s chat layer only"


def test_the_compose_file_runs_the_release_the_pipeline_is_proven_against() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
    image = compose["services"]["sglang"]["image"]
    repository, _, tag = image.partition(":")
    assert repository == "lmsysorg/sglang"
    # v0.5.23 or a CUDA build of it (v0.5.23-cu130); never latest, never another release.
    assert re.fullmatch(rf"v{re.escape(PROVEN_SGLANG_VERSION)}(-cu\d+)?", tag), image


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Simulator]]:
    """A simulator as the demo runs it (the proven version), one reporting an older SGLang, one reporting none."""
    sims = {
        "proven": start_simulator(tmp_path_factory.mktemp("proven")),
        "older": start_simulator(tmp_path_factory.mktemp("older"), "--sglang-version", "0.5.20"),
        "unknown": start_simulator(tmp_path_factory.mktemp("unknown"), "--sglang-version", ""),
    }
    yield sims
    for sim in sims.values():
        sim.stop()


def run_report(fleet: list[dict[str, object]], endpoint: str, root: Path) -> tuple[dict[str, object], Path]:
    """The run report of a run with no dataset left to publish (so it is green) behind this fleet check."""
    run = pipeline.RunSpec.from_params({"endpoints": [endpoint], "storage_root": str(root)}, "version-check")
    run = run.model_copy(update={"datasets": []})
    summary = pipeline.report(run, [], fleet)
    return summary, root / run.profile / "runs" / f"{run.version}.json"


@pytest.mark.parametrize(
    "server,version,warning",
    [
        pytest.param("proven", PROVEN_SGLANG_VERSION, None, id="proven-no-warning"),
        pytest.param("older", "0.5.20", "SGLang 0.5.20 serves this run ({url}); " + PROVEN, id="another-version"),
        pytest.param(
            "unknown",
            None,
            "SGLang of unknown version serves this run ({url}: no version in the server info read from here); "
            + PROVEN,
            id="unknown-version",
        ),
    ],
)
@pytest.mark.usefixtures("tmp_roots_allowed")
def test_the_run_report_warns_when_the_fleet_is_not_the_proven_sglang(
    servers: dict[str, Simulator],
    renderer: ChatRenderer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    server: str,
    version: str | None,
    warning: str | None,
) -> None:
    url = servers[server].url
    with caplog.at_level(logging.INFO, logger="regen"):
        fleet = check_fleet([url], renderer, Sampling().as_params())
        summary, report_file = run_report(fleet, url, tmp_path)
    assert fleet[0]["version"] == version
    served_by = f"SGLang {version}" if version else "an SGLang that does not say its version"
    assert f"{url} serves kimi-k2.5-mini on {served_by}; its probe answer passed" in caplog.messages

    expected = [warning.format(url=url)] if warning else []
    # (the default budget, 256 in flight, is 1 a slot of this simulator's 256: the sizing warning comes too)
    assert [w for w in summary["warnings"] if "serves this run" in w] == expected
    assert json.loads(report_file.read_text())["warnings"] == summary["warnings"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    about_version = [m for m in warned if "serves this run" in m]  # not the unknown vocabulary (test_server_check)
    assert about_version == expected * 2  # once when the fleet is checked, once in the run's summary


def test_a_router_is_judged_by_each_of_its_workers() -> None:
    """A router's own version is sglang-router's, never SGLang's: its workers' are what serve the run. One worker of
    another version or of none warns, naming that worker, even when the others are the proven version."""
    router = {
        "url": "http://router",
        "version": PROVEN_SGLANG_VERSION,  # what fleet_version made of the workers it could read
        "workers": [
            {"url": "http://w1", "version": PROVEN_SGLANG_VERSION},
            {"url": "http://w2", "version": None},  # unreachable from here
            {"url": "http://w3", "version": "0.5.21"},
        ],
    }
    server = {"url": "http://solo", "version": "0.5.21", "workers": []}
    assert sglang_version_warnings([router, server]) == [
        f"SGLang 0.5.21 serves this run (http://router (worker http://w3), http://solo); {PROVEN}",
        "SGLang of unknown version serves this run (http://router (worker http://w2): no version in the server info "
        f"read from here); {PROVEN}",
    ]
    assert sglang_version_warnings([{**router, "workers": router["workers"][:1]}]) == []
    assert sglang_version_warnings([]) == []  # no fleet check passed: nothing was served
