"""The recording rules and alerts of monitoring/prometheus (issue 56) load, pass their promtool unit tests
(rules_test.yml: each alert firing and kept silent, the recording rules on stale and succeeded tries), and read only
series the tasks push. promtool is Debian's (package prometheus): a machine without it fails here, saying what to run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from regen.metrics import TaskMetrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "monitoring" / "prometheus"
RULES = PROMETHEUS / "rules.yml"
RULES_TEST = PROMETHEUS / "rules_test.yml"
SCRAPE = PROMETHEUS / "scrape.yml"


def pushed_series() -> frozenset[str]:
    """The series a task try pushes (regen.metrics), as Prometheus names them: a counter's with _total; plan's
    allowance too, which exists only once plan sets it."""
    task = TaskMetrics()
    task.loss_allowance(0.02)
    return frozenset(
        f"{family.name}_total" if family.type == "counter" else family.name for family in task.registry.collect()
    )


PUSHED_SERIES = pushed_series()
RECORDED = {
    "eagle3_regen:remaining_answers",
    "eagle3_regen:requests_in_flight",
    "eagle3_regen:answers:rate5m",
    "eagle3_regen:eta_seconds",
    "eagle3_regen:eta_timestamp_seconds",
    "eagle3_regen:fleet_utilization",
    "eagle3_regen:fleet_utilization:server_side",
    "eagle3_regen:fleet_loss_share",
    "eagle3_regen:gpu_hours",
}
ALERTS = {"Eagle3RegenStalled", "Eagle3RegenFleetIdle", "Eagle3RegenFleetLosses", "Eagle3RegenPastEta"}
SERIES_NAME = re.compile(r"eagle3_regen_[a-z_]+")


def promtool(*args: str) -> None:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed: run `bash tools/prerequisites.sh prometheus`", pytrace=False)
    done = subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    output = f"$ promtool {' '.join(args)}\n{done.stdout}{done.stderr}"
    print(output)
    assert done.returncode == 0, output


def test_the_rules_load() -> None:
    promtool("check", "rules", str(RULES.relative_to(ROOT)))


def test_the_rules_pass_their_unit_tests() -> None:
    promtool("test", "rules", str(RULES_TEST.relative_to(ROOT)))


def test_the_example_prometheus_config_loads_with_the_rules() -> None:
    promtool("check", "config", str(SCRAPE.relative_to(ROOT)))


def test_the_rules_and_their_tests_read_only_series_the_tasks_push() -> None:
    for path in (RULES, RULES_TEST):
        unknown = sorted(set(SERIES_NAME.findall(path.read_text(encoding="utf-8"))) - PUSHED_SERIES)
        assert not unknown, f"{path.relative_to(ROOT)} names series no task pushes: {unknown}"


def test_every_rule_of_the_spec_is_there_and_every_alert_says_what_to_do() -> None:
    groups = {group["name"]: group["rules"] for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]}
    assert set(groups) == {"eagle3_regen.rules", "eagle3_regen.alerts"}
    assert {rule["record"] for rule in groups["eagle3_regen.rules"]} == RECORDED
    alerts = {rule["alert"]: rule for rule in groups["eagle3_regen.alerts"]}
    assert set(alerts) == ALERTS
    for name, alert in alerts.items():
        assert alert.get("for"), name
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        assert {"summary", "description"} <= set(alert["annotations"]), name
        assert "{{ $labels.run }}" in alert["annotations"]["description"], name
