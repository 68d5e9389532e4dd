"""A real Pushgateway and a real Prometheus scraping it, on free ports in a folder of their own: the live metrics of a
run (regen.metrics) as an operator's Prometheus sees them, with the project's recording rules and alerts
(monitoring/prometheus/rules.yml) loaded. Used by the metrics e2e test, and by hand:

    python tools/prometheus_stack.py [--folder DIR]     both up until Ctrl-C; point `metrics.pushgateway` at the first

The binaries are Debian's (packages prometheus and prometheus-pushgateway): `bash tools/prerequisites.sh prometheus`.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from tools.devstack import Started, free_port, stop_processes

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "monitoring" / "prometheus" / "rules.yml"
PROMETHEUS, PUSHGATEWAY = "prometheus", "prometheus-pushgateway"
SCRAPE_S = 1  # scrape and rule evaluation interval: a test sees a push within seconds


class MissingBinary(RuntimeError):
    """Prometheus or the Pushgateway is not installed."""


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise MissingBinary(f"{name} is not on PATH; run: bash tools/prerequisites.sh prometheus")
    return found


def prometheus_config(pushgateway: str, rules: Path | None) -> dict[str, Any]:
    """Prometheus scraping the Pushgateway at `pushgateway` (host:port) every second, keeping the pushed labels (job,
    run, task, map_index, try: honor_labels), and evaluating `rules` every second."""
    return {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)] if rules is not None else [],
        "scrape_configs": [
            {"job_name": "pushgateway", "honor_labels": True, "static_configs": [{"targets": [pushgateway]}]}
        ],
    }


class QueryError(RuntimeError):
    """Prometheus refused a query (a PromQL error): its own message."""


@dataclass
class PrometheusStack(Started):
    folder: Path  # the config, the TSDB and both logs
    # The recording rules and alerts loaded: the project's when it has them; None: none.
    rules: Path | None = field(default_factory=lambda: RULES if RULES.exists() else None)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pushgateway_port, self.prometheus_port = free_port(), free_port()
        self.pushgateway = f"http://127.0.0.1:{self.pushgateway_port}"  # what `metrics.pushgateway` points at
        self.prometheus = f"http://127.0.0.1:{self.prometheus_port}"

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.folder / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self, name: str, lines: int = 20) -> str:
        path = self.folder / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _wait_ready(self, name: str, url: str, timeout_s: float = 60) -> None:
        deadline, last = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"{name} exited {self.processes[name].returncode}:\n{self.log(name)}")
            try:
                resp = requests.get(f"{url}/-/ready", timeout=2)
                if resp.ok:
                    return
                last = f"HTTP {resp.status_code}"
            except requests.RequestException as e:
                last = repr(e)
            time.sleep(0.2)
        raise TimeoutError(f"{name} not ready after {timeout_s:.0f}s (last: {last}):\n{self.log(name)}")

    def start(self) -> PrometheusStack:
        prometheus, pushgateway = binary(PROMETHEUS), binary(PUSHGATEWAY)
        config = self.folder / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(f"127.0.0.1:{self.pushgateway_port}", self.rules)))
        try:
            self._spawn("pushgateway", [pushgateway, f"--web.listen-address=127.0.0.1:{self.pushgateway_port}"])
            self._spawn(
                "prometheus",
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.folder / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                ],
            )
            self._wait_ready("pushgateway", self.pushgateway)
            self._wait_ready("prometheus", self.prometheus)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_processes(list(self.processes.values()))
        self.processes.clear()

    # --- Prometheus's HTTP API ---
    def _api(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET /api/v1/<path>, or POST with `params` (a query: PromQL may be longer than a URL)."""
        url = f"{self.prometheus}/api/v1/{path}"
        resp = requests.post(url, data=params, timeout=30) if params else requests.get(url, timeout=30)
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        if body.get("status") != "success":
            what = f"{params['query']!r}" if params else path
            raise QueryError(f"{what}: {body.get('errorType')}: {body.get('error') or resp.text}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query (now, or at the unix time `at`): its series (scalars and strings as one)."""
        data = self._api("query", {"query": promql, **({"time": at} if at is not None else {})})
        return (
            data["result"] if data["resultType"] in ("vector", "matrix") else [{"metric": {}, "value": data["result"]}]
        )

    def query_range(self, promql: str, start: float, end: float, step_s: float = 1) -> list[dict[str, Any]]:
        """A range query: each series with its `values`."""
        return list(self._api("query_range", {"query": promql, "start": start, "end": end, "step": step_s})["result"])

    def value(self, promql: str, at: float | None = None) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's series as {sorted labels: value}."""
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in self.query(promql, at)}

    def targets_up(self) -> bool:
        """Prometheus has scraped the Pushgateway successfully."""
        return any(t["health"] == "up" for t in self._api("targets")["activeTargets"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self._api("rules")["groups"])


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    parser = argparse.ArgumentParser(prog="prometheus_stack.py")
    parser.add_argument("--folder", type=Path, default=None, help="where the TSDB and logs go (default: a temp folder)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        folder = args.folder or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="regen-prometheus-")))
        try:
            running = stack.enter_context(PrometheusStack(folder))
        except MissingBinary as e:
            print(e, file=sys.stderr)
            return 2
        print(f"Pushgateway {running.pushgateway} (config: metrics: {{pushgateway: {running.pushgateway}}})")
        print(f"Prometheus  {running.prometheus}; rules: {running.rules or 'none'}; logs in {folder}")
        print("Ctrl-C stops both.", flush=True)
        try:
            while all(p.poll() is None for p in running.processes.values()):
                time.sleep(2)
            print(f"a component stopped; see {folder}/*.log")
            return 1
        except KeyboardInterrupt:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
