"""The live metrics (regen.metrics, issue 56) of a real run: the DAG through a real scheduler against the simulator,
each task try pushing its series to a real Pushgateway that a real Prometheus scrapes (tools/prometheus_stack.py, with
the project's recording rules). After the run: every query of the Grafana dashboard finds its series, and the counters'
totals are the run report's.

Before it, a night whose Pushgateway does not listen: as green as one without metrics. It also publishes a version of
B1 whose answers' lengths the run then predicts from (a first version's predictions, from the samples' reference
answers, are all one length: no rank correlation, no Spearman series).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from regen.layout import run_report_key, version_from_run_id
from tools.devstack import Stack, free_port, wait_until
from tools.prometheus_stack import RULES, PrometheusStack

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana" / "eagle3-regen.json"
DATASETS = ("B1_glaive", "B2_opencodeinstruct")  # 36 and 48 prompts: two shards each, in shards of 24
# Slow enough (about 20 s of generation) that the 1 s pushes and scrapes see the work under way, with answers the
# validate stage rejects, 503s that are retried and each answer's slot time (--enable-metrics: server-side
# utilisation).
FLEET = (
    *("--decode-ms-per-token", "20", "--max-running", "8", "--enable-metrics"),
    *("--defect-rate", "0.1", "--http-503-rate", "0.05"),
)
WHOLE_RUN = "1h"  # a range past any run here: last_over_time over it is each series' last value, deleted or not
# Grafana's own variables, as a dashboard over the last hour would fill them in.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": WHOLE_RUN}


def grafana_regex(value: str) -> str:
    """A variable's value in a `=~"$var"` matcher, escaped as Grafana's Prometheus data source does: a regex literal
    inside a PromQL string (a run id has `+`, `.` and `:`)."""
    return re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", value)


def dashboard_queries(run_id: str) -> list[tuple[str, str]]:
    """Every panel's queries, (panel title, PromQL), with the dashboard's variables filled in for one run."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$run", grafana_regex(run_id))
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: a variable left in {expr}"
            queries.append((panel["title"], expr))
    return queries


def write_config(path: Path, storage: Path, metrics: dict[str, Any]) -> None:
    """The project's config, its datasets by absolute path, storing under `storage`, with this `metrics` section."""
    project = ROOT / "config" / "regen.yaml"
    config = yaml.safe_load(project.read_text())
    for dataset in config["datasets"].values():
        dataset["paths"] = [str((project.parent / p).resolve()) for p in dataset["paths"]]
    config["defaults"].update(storage_root=str(storage), shard_size=24, retry_delay_s=1)
    config["governance"]["allowed_storage_roots"] = [str(storage)]
    config["metrics"] = metrics
    path.write_text(yaml.safe_dump(config))


class Observed:
    """The stack, Prometheus and the config the stack's tasks read (rewritten between runs)."""

    def __init__(self, stack: Stack, prometheus: PrometheusStack, config: Path, storage: Path) -> None:
        self.stack, self.prometheus, self.config, self.storage = stack, prometheus, config, storage


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    assert RULES.exists(), f"{RULES} is missing: the dashboard's recording rules"
    folder = tmp_path_factory.mktemp("metrics")
    config, storage = folder / "regen.yaml", folder / "storage"
    with PrometheusStack(folder / "prometheus") as prometheus:
        write_config(config, storage, {"pushgateway": prometheus.pushgateway, "push_interval_s": 1})
        groups = [g["name"] for g in prometheus.rule_groups()]
        assert "eagle3_regen.rules" in groups, f"the rules Prometheus loaded from {RULES}: {groups}"
        wait_until("Prometheus scraping the Pushgateway", prometheus.targets_up, 30)
        with pytest.MonkeyPatch.context() as patched:
            patched.setenv("REGEN_CONFIG", str(config))
            with Stack(folder / "airflow", purpose="metrics", simulator_args=list(FLEET)) as stack:
                yield Observed(stack, prometheus, config, storage)


def pushed_groups(pushgateway: str, run_id: str) -> list[dict[str, str]]:
    groups = requests.get(f"{pushgateway}/api/v1/metrics", timeout=10).json()["data"]
    return [g["labels"] for g in groups if g["labels"].get("run") == run_id]


def run_dag(stack: Stack, conf: dict[str, Any], watch: Any = None) -> tuple[str, str]:
    """A run triggered and waited for (`watch` called every second meanwhile): its id and state."""
    run_id = stack.trigger({"endpoints": [stack.simulator], "skip_unchanged": False, **conf})

    def finished() -> str | None:
        if watch is not None:
            watch(run_id)
        state = stack.call("GET", f"/dags/eagle3_regen/dagRuns/{run_id}")["state"]
        return state if state in ("success", "failed") else None

    return run_id, str(wait_until(f"run {run_id}", finished, 600, poll_s=1))


@pytest.fixture(scope="module")
def night_without_pushgateway(observed: Observed) -> dict[str, Any]:
    """A run of B1's first rows with `metrics.pushgateway` at a port where nothing listens."""
    closed = f"http://127.0.0.1:{free_port()}"
    write_config(observed.config, observed.storage, {"pushgateway": closed, "push_interval_s": 1})
    try:
        run_id, state = run_dag(observed.stack, {"datasets": ["B1_glaive"], "limit": 12})
    finally:
        write_config(
            observed.config, observed.storage, {"pushgateway": observed.prometheus.pushgateway, "push_interval_s": 1}
        )
    return {"run_id": run_id, "state": state, "pushgateway": closed}


@pytest.fixture(scope="module")
def run(observed: Observed, night_without_pushgateway: dict[str, Any]) -> dict[str, Any]:
    """A green run, watched from before its start until Prometheus saw its Pushgateway groups go."""
    stack, prometheus = observed.stack, observed.prometheus
    seen: list[dict[str, str]] = []  # the groups the Pushgateway held while the run was under way

    def watch(run_id: str) -> None:
        seen.extend(g for g in pushed_groups(prometheus.pushgateway, run_id) if g not in seen)

    started = time.time()
    run_id, state = run_dag(stack, {"datasets": list(DATASETS)}, watch)
    assert state == "success", f"run {state}: {stack.task_states(run_id)}\n{stack.failures(run_id)}"
    # The report task deleted the run's groups at its end: its series live on in Prometheus alone.
    wait_until("the run's Pushgateway groups deleted", lambda: not pushed_groups(prometheus.pushgateway, run_id), 30)
    time.sleep(3)  # scraped again: the run's series are stale now
    config = yaml.safe_load(observed.config.read_text())["defaults"]
    key = run_report_key(config["profile"], version_from_run_id(run_id))
    return {
        "run_id": run_id,
        "started": started,
        "ended": time.time(),
        "report": json.loads((observed.storage / key).read_text()),
        "states": stack.task_states(run_id),
        "groups": seen,
    }


def totals(prometheus: PrometheusStack, run: dict[str, Any], metric: str, *by: str) -> dict[tuple[str, ...], float]:
    """A metric's last values over the run, summed over every try, task and map index: {by's values: total}."""
    expr = f'sum by ({", ".join(by)}) (last_over_time({metric}{{run="{run["run_id"]}"}}[{WHOLE_RUN}]))'
    return {
        tuple(s["metric"].get(k, "") for k in by): float(s["value"][1]) for s in prometheus.query(expr, run["ended"])
    }


def over_run(prometheus: PrometheusStack, run: dict[str, Any], expr: str) -> list[dict[str, Any]]:
    """A query evaluated every second of the run: each series with at least one value."""
    return [s for s in prometheus.query_range(expr, run["started"], run["ended"]) if s["values"]]


def test_a_run_whose_pushgateway_does_not_listen_is_green(
    observed: Observed, night_without_pushgateway: dict[str, Any]
) -> None:
    """Metrics are a hint: a Pushgateway that is down costs a task one warning in its log, nothing more."""
    night = night_without_pushgateway
    assert night["state"] == "success", observed.stack.task_states(night["run_id"])
    log = observed.stack.task_log(night["run_id"], "process_shard.generate_shard", 0)
    assert f"metrics: pushing to {night['pushgateway']} failed" in log


def test_every_task_try_pushed_its_own_group_and_the_report_deleted_them(
    observed: Observed, run: dict[str, Any]
) -> None:
    ran = {(task, str(index)) for task, index, state in run["states"] if state == "success"}
    pushed = {(g["task"], g["map_index"]) for g in run["groups"]}
    assert pushed <= ran  # no group of a task that did not run
    # Every task that ran was seen pushing, but maybe report: its groups go as it ends.
    assert {(t, i) for t, i in ran if t != "report"} - pushed == set(), run["groups"]
    assert all(g["job"] == "eagle3_regen" and int(g["try"]) >= 1 for g in run["groups"]), run["groups"]
    assert pushed_groups(observed.prometheus.pushgateway, run["run_id"]) == []


def test_every_dashboard_query_finds_the_run(observed: Observed, run: dict[str, Any]) -> None:
    queries = dashboard_queries(run["run_id"])
    assert len(queries) >= 20
    empty = [f"{title}: {expr}" for title, expr in queries if not over_run(observed.prometheus, run, expr)]
    assert empty == [], "dashboard queries that found nothing over the run:\n" + "\n".join(empty)


def test_counters_add_up_to_the_run_report(observed: Observed, run: dict[str, Any]) -> None:
    prometheus, report = observed.prometheus, run["report"]
    datasets = {d["dataset"]: d for d in report["datasets"]}
    assert sorted(datasets) == sorted(DATASETS) and report["unpublished"] == []

    answers = totals(prometheus, run, "eagle3_regen_answers_total", "dataset")
    assert answers == {(name,): d["stages"]["generate"]["kept"] for name, d in datasets.items()}
    tokens = totals(prometheus, run, "eagle3_regen_output_tokens_total", "dataset")
    assert tokens == {(name,): sum(g["output_tokens"] for g in d["generation"]) for name, d in datasets.items()}
    assert sum(tokens.values()) == report["fleet_usage"]["output_tokens"] == report["cost"]["output_tokens"]
    assert sum(totals(prometheus, run, "eagle3_regen_prompt_tokens_total").values()) == report["cost"]["prompt_tokens"]
    requests_by_outcome = totals(prometheus, run, "eagle3_regen_requests_total", "outcome")
    assert sum(requests_by_outcome.values()) == report["fleet_usage"]["requests"]
    assert requests_by_outcome[("answered",)] >= sum(answers.values())
    assert requests_by_outcome.get(("http_503",), 0) > 0, requests_by_outcome  # the fleet's 503s, retried
    seconds = sum(totals(prometheus, run, "eagle3_regen_request_seconds_total").values())
    assert seconds == pytest.approx(report["cost"]["request_seconds"], abs=0.01)

    expected: dict[tuple[str, ...], float] = {}
    for name, d in datasets.items():
        expected |= {(name, "prepare", reason): n for reason, n in d["prepare"]["dropped_by_reason"].items()}
        for stage, stats in d["stages"].items():
            expected |= {(name, stage, reason): n for reason, n in stats["dropped_by_reason"].items()}
    rejections = totals(prometheus, run, "eagle3_regen_rejections_total", "dataset", "stage", "reason")
    assert rejections == expected
    assert any(stage == "validate" for _, stage, _ in rejections)  # the fleet's defects, caught

    planned = totals(prometheus, run, "eagle3_regen_planned_answers", "dataset")
    assert planned == {(name,): d["stages"]["generate"]["total"] for name, d in datasets.items()}
    shards = totals(prometheus, run, "eagle3_regen_planned_shards", "dataset")
    assert shards == {("B1_glaive",): 2, ("B2_opencodeinstruct",): 2}
    done = totals(prometheus, run, "eagle3_regen_shards_done_total", "dataset", "stage")
    assert done == {(name, stage): 2 for (name,) in shards for stage in ("generate", "validate", "export")}
    settled = totals(prometheus, run, "eagle3_regen_settled_answers", "dataset")
    assert settled == planned  # one try per shard: each shard's answers settled once
    in_flight = totals(prometheus, run, "eagle3_regen_requests_in_flight", "task", "map_index", "dataset")
    assert in_flight and set(in_flight.values()) == {0}  # every request ended

    assert totals(prometheus, run, "eagle3_regen_datasets_published_total", "dataset") == {(n,): 1 for n in datasets}
    spearman = totals(prometheus, run, "eagle3_regen_length_prediction_spearman", "dataset")
    assert ("B1_glaive",) in spearman  # its lengths predicted from the night before's version
    assert spearman == {
        (name,): pytest.approx(d["length_prediction"]["spearman"])
        for name, d in datasets.items()
        if isinstance((d.get("length_prediction") or {}).get("spearman"), int | float)
    }
    # The answers the fleet miscounted on every attempt (the simulator's count_mismatch defect): lost, and allowed.
    losses = totals(prometheus, run, "eagle3_regen_fleet_losses_total", "dataset")
    assert losses == {(name,): 0 for name in datasets} | {(e["dataset"],): e["lost"] for e in report["fleet_losses"]}


def test_the_report_task_worked_out_the_drain_model(run: dict[str, Any]) -> None:
    """The run report's model (regen.stages.generate.drain_model) in the report task as the scheduler runs it: over
    every answer the fleet gave, which validate judged, at the servers' own time a token."""
    report = run["report"]
    model, usage = report["fleet_usage"]["model"], report["fleet_usage"]
    assert not [w for w in report["warnings"] if "drain model" in w], report["warnings"]
    assert model["answers"] == sum(d["stages"]["validate"]["total"] for d in report["datasets"]) > 0
    assert model["predicted"] is not None  # B1's lengths from the night before's version
    assert 0 < model["with_answer_lengths"] <= 1 and usage["server_side"] is not None
    assert model["settings"]["slots"] == usage["slots"] and model["settings"]["decode_ms"] > 0


def test_fleet_and_task_gauges_are_the_reports(observed: Observed, run: dict[str, Any]) -> None:
    prometheus, report, run_id = observed.prometheus, run["report"], run["run_id"]
    fleet = {e["url"]: e for e in report["fleet"]}
    slots = totals(prometheus, run, "eagle3_regen_fleet_slots", "endpoint")
    assert slots == {(url,): e["max_running_requests"] for url, e in fleet.items()}
    assert totals(prometheus, run, "eagle3_regen_fleet_gpus", "endpoint") == {
        (url,): e["gpus"] for url, e in fleet.items()
    }
    # One name per endpoint on every series that has one: the recording rules join on it.
    for metric in ("answers_total", "output_tokens_total", "requests_total", "request_seconds_total"):
        assert set(totals(prometheus, run, f"eagle3_regen_{metric}", "endpoint")) == set(slots), metric
    plan = f'last_over_time(eagle3_regen_fleet_loss_allowance_ratio{{run="{run_id}", task="plan"}}[{WHOLE_RUN}])'
    assert [float(s["value"][1]) for s in prometheus.query(plan, run["ended"])] == [
        pytest.approx(report["run"]["max_server_rejected_share"])
    ]
    # Each task that succeeded said so, in its own group (report's last push may be deleted before a scrape).
    succeeded = totals(prometheus, run, "eagle3_regen_task_succeeded", "task", "map_index")
    ran = {(task, str(index)) for task, index, state in run["states"] if state == "success" and task != "report"}
    assert {key for key, value in succeeded.items() if value == 1} >= ran, succeeded


def test_recording_rules_follow_the_run(observed: Observed, run: dict[str, Any]) -> None:
    prometheus, report, run_id = observed.prometheus, run["report"], run["run_id"]

    def values(rule: str) -> list[float]:
        series = over_run(prometheus, run, f'sum({rule}{{run="{run_id}"}})')
        return [float(v) for _, v in series[0]["values"]] if series else []

    remaining = values("eagle3_regen:remaining_answers")
    planned = sum(d["stages"]["generate"]["total"] for d in report["datasets"])
    assert remaining and max(remaining) == planned and min(remaining) == 0, remaining  # all to do, then none
    assert max(values("eagle3_regen:requests_in_flight")) > 0
    gpu_hours = values("eagle3_regen:gpu_hours")
    assert gpu_hours and max(gpu_hours) == pytest.approx(report["cost"]["gpu_hours"], rel=0.01), gpu_hours
    for rule in ("eagle3_regen:fleet_utilization", "eagle3_regen:fleet_utilization:server_side"):
        busy = [v for v in values(rule) if v == v]  # (NaN: nothing to divide yet)
        assert busy and max(busy) > 0, (rule, busy)
