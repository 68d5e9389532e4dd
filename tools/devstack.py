"""The local stack, real parts only: Airflow (scheduler, dag-processor, api-server, triggerer; LocalExecutor on
PostgreSQL), the SGLang-protocol simulator, and optionally an S3 HTTP API (moto server). Used by `make demo` and the
e2e tests.

    python tools/devstack.py demo [--s3] [--limit N]     run eagle3_regen end to end and print where results are
    python tools/devstack.py ui [--port 8080] [--s3]      the stack with its UI, up until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlparse

import requests

from regen.config import load_config

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DAG_ID = "eagle3_regen"
ADMIN = ("admin", "admin")
CELERY_REDIS_DB = 7  # the broker's database on the machine's Redis; each stack's keys under a prefix of its own
# Stacks of two checkouts on one machine (or a demo beside a test run) share PostgreSQL and Redis: each stack's
# database and broker keys are named after its purpose and its checkout, and only those are ever dropped.
CHECKOUT = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]


def worker_hostname() -> str:
    """Airflow's hostname_callable for the local Celery workers: every worker runs on this one host, so each reports
    its own name instead."""
    return os.environ.get("REGEN_WORKER_NAME") or socket.getfqdn()


def moto_client(endpoint: str, max_attempts: int | None = None) -> Any:
    """A boto3 client of a moto server (or of the fault proxy in front of one), with moto's test credentials;
    `max_attempts`: botocore's retries, else botocore's defaults."""
    import boto3

    from regen.storage import s3_client_config

    config = None if max_attempts is None else s3_client_config("standard", max_attempts)
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=config,
    )


_HANDED_OUT: set[int] = set()  # ports this process gave servers that may not listen yet


def free_port() -> int:
    """A free loopback port for a server to listen on, maybe much later (an api-server binds its port after half a
    minute of starting) or again after a kill. Below the kernel's ephemeral range: a port there, free when handed
    out, may meanwhile become any process's next outgoing connection's, and the server then fails to bind it. In a
    stripe of its own for each pytest-xdist worker, so that two workers never hand out the same one; never one
    handed out before in this process, as a server that starts slowly does not listen on its port yet."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = min(10_000, low // 2)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    stripe = (low - first) // workers
    ports = range(first + worker * stripe, first + (worker + 1) * stripe)
    for port in random.SystemRandom().sample(ports, min(200, len(ports))):  # not the tests' seeded draw
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port left in {ports.start}-{ports.stop - 1}")


def wait_until(what: str, check: Any, timeout_s: float, poll_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (requests.RequestException, OSError) as e:
            last = e
        time.sleep(poll_s)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f}s (last error: {last!r})")


class Simulator:
    """A running `python -m regen.simulator`, with the JSONL record of every answer it sent."""

    def __init__(self, url: str, record: Path, process: subprocess.Popen[bytes]) -> None:
        self.url, self.record, self.process = url, record, process

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def stats(self) -> dict[str, Any]:
        return dict(requests.get(f"{self.url}/sim/stats", timeout=10).json())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulator(folder: Path, *args: str, port: int | None = None, env: dict[str, str] | None = None) -> Simulator:
    port = port or free_port()
    record = folder / f"record-{port}.jsonl"
    record.touch()
    process = subprocess.Popen(
        [sys.executable, "-m", "regen.simulator", "--port", str(port), "--record", str(record), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # Up once it answers at all: /health is 503 while it warms up, and open even with --api-key (as SGLang's is).
        wait_until("simulator", lambda: requests.get(f"{url}/health", timeout=1).status_code in (200, 503), 60, 0.2)
    except TimeoutError:
        process.kill()
        raise
    return Simulator(url, record, process)


def stack_name(purpose: str) -> str:
    """`eagle3_regen_<purpose>_<checkout>`: the PostgreSQL database and Redis key prefix of one checkout's stack."""
    return f"eagle3_regen_{purpose}_{CHECKOUT}"


def reset_database(name: str) -> str:
    """A fresh metadata database on the machine's PostgreSQL (trust auth on loopback): this stack's own, by name."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"


def stop_processes(processes: list[subprocess.Popen[bytes]], kill: bool = False) -> None:
    """The components, their process groups, and every process below them: task runners sit in process groups
    of their own (and rename themselves), so they are found as descendants, before their parents go. With
    `kill`, SIGKILL at once: a crash, nothing cleaned up."""
    import psutil

    below: list[psutil.Process] = []
    for process in processes:
        try:
            below += psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL if kill else signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    for child in below:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue


class Started:
    """A set of processes as a context manager: started on entry (`start` returns self), stopped on exit."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Stack(Started):
    home: Path  # AIRFLOW_HOME, logs and the simulator's record live here
    purpose: str = "dev"  # names the stack's database and broker keys, with the checkout (stack_name)
    with_s3: bool = False
    simulator_args: list[str] = field(default_factory=list)
    simulators: int = 1  # SGLang endpoints in the fleet
    pool_slots: int | None = None  # default: the config's fleet_pool_slots, or its shard_tasks
    api_port: int = 0  # 0: a free port
    simulator_port: int | None = None  # the first simulator's; None: a free port
    # The pipeline needs one: each dataset's wait for its own shards is deferred to it (regen_airflow.shard_states).
    with_triggerer: bool = True
    executor: str = "LocalExecutor"  # or CeleryExecutor: Redis on loopback as the broker, `celery_workers` workers
    celery_workers: int = 2
    # Seconds without a supervisor's heartbeat before the scheduler fails (and retries) its task; Airflow's default is
    # 300. A killed supervisor's task runner dies with it (regen_airflow.supervision), so nothing is gained by waiting.
    heartbeat_timeout_s: int = 60
    # With S3: the share of Airflow's S3 requests that fail as S3's do (500, 503 SlowDown, dropped connections), through
    # tools/s3_fault_proxy.py in front of the S3 API. `s3_client()` (what a test reads back with) goes direct.
    s3_fault_rate: float = 0.0
    # The fault proxy in front of S3 even at no fault rate, so that `s3_outage` can make S3 go dark.
    s3_outages: bool = False
    # The Celery broker: the machine's Redis, or (a bench that restarts Redis) one of the stack's own on a free port,
    # saving to disk as Redis does by default, so a restart keeps what was queued.
    own_redis: bool = False
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    fleet: list[Simulator] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.database = stack_name(self.purpose)
        self.api_port, self.s3_port = self.api_port or free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.s3_endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.s3_proxy_port = free_port()
        self.s3_proxied = self.with_s3 and (self.s3_fault_rate > 0 or self.s3_outages)
        self.s3_tasks_endpoint = f"http://127.0.0.1:{self.s3_proxy_port}" if self.s3_proxied else self.s3_endpoint
        self.argv: dict[str, tuple[list[str], dict[str, str]]] = {}  # how each component was started
        self._token: str | None = None
        self.broker_port = free_port() if self.own_redis else 6379

    @property
    def config(self) -> Any:
        return load_config(Path(os.environ.get("REGEN_CONFIG", ROOT / "config" / "regen.yaml")))

    @property
    def slots(self) -> int:
        return self.pool_slots or self.config.defaults.pool_slots

    @property
    def simulator(self) -> str:
        return self.fleet[0].url

    @property
    def record(self) -> Path:
        return self.fleet[0].record

    def env(self) -> dict[str, str]:
        passwords = self.home / "passwords.json"
        passwords.write_text(json.dumps({ADMIN[0]: ADMIN[1]}))
        s3_conn = {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {"endpoint_url": self.s3_tasks_endpoint, "region_name": "us-east-1"},
        }
        return {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.broker_port}/{CELERY_REDIS_DB}",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__GLOBAL_KEYPREFIX": f"{self.database}:",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.sql_conn.replace('+psycopg2', '')}",
            # Room for every pool slot plus the validate/export tasks of finished shards, and no more (2 cores).
            "AIRFLOW__CORE__PARALLELISM": str(self.slots + 2),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN[0]}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sql_conn,
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.api,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": "eagle3-regen-local-stack",
            "AIRFLOW__API__SECRET_KEY": "eagle3-regen-local-stack",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(self.heartbeat_timeout_s),
            "AIRFLOW__SCHEDULER__LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "60",  # as docker-compose.yaml: a restart adopts soon
            # A task's supervisor waits in select() up to this long between heartbeats; when its task exits just
            # before it can be reaped, no socket is left to wake it and it sleeps the whole interval (Airflow 3.3.2's
            # `_monitor_subprocess`), so each task ended up to 5 s late (the default) on the run's critical path.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(s3_conn),
            "REGEN_CONFIG": str(os.environ.get("REGEN_CONFIG", ROOT / "config" / "regen.yaml")),
            "PYTHONUNBUFFERED": "1",
        }

    def _spawn(self, name: str, argv: list[str], **env: str) -> None:
        log = (self.home / f"{name}.log").open("ab")
        self.argv[name] = (argv, env)
        # A process group per component, so stopping it takes its children (gunicorn/uvicorn workers) too.
        self.processes[name] = subprocess.Popen(
            argv, env={**self.env(), **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _start_executor(self) -> None:
        self._spawn("scheduler", [str(BIN / "airflow"), "scheduler"])
        if self.executor != "CeleryExecutor":
            return
        import redis

        broker = redis.Redis(host="127.0.0.1", port=self.broker_port, db=CELERY_REDIS_DB)
        for key in broker.scan_iter(match=f"{self.database}:*"):  # no task left from this stack's last start
            broker.delete(key)
        for n in range(1, self.celery_workers + 1):
            name = f"celery-{n}"
            argv = [str(BIN / "airflow"), "celery", "worker", "--concurrency", "2", "--skip-serve-logs"]
            # Each worker records its own name as the task instances' hostname, so a test sees who ran what.
            self._spawn(
                name,
                [*argv, "--celery-hostname", f"{name}@%h"],
                AIRFLOW__CORE__HOSTNAME_CALLABLE="tools.devstack.worker_hostname",
                REGEN_WORKER_NAME=name,
                PYTHONPATH=str(ROOT),
            )

    def use_executor(self, executor: str) -> None:
        """Restart the scheduler (and workers) on another executor; the metadata DB, API and DAGs stay."""
        stop_processes(
            [self.processes.pop(n) for n in list(self.processes) if n == "scheduler" or n.startswith("celery-")]
        )
        self.executor = executor
        self._start_executor()

    def restart_scheduler(self) -> None:
        """Stop the scheduler and start it again, as a crashed one is restarted: with LocalExecutor its workers and
        the tasks they run go with it (their retries come after the heartbeat timeout); the metadata DB, the API, the
        DAG processor and Celery workers stay."""
        self.restart("scheduler")

    def restart(self, name: str, kill: bool = False) -> None:
        """Stop a component (SIGTERM, or SIGKILL with `kill`: a crash) with every process below it, and start it
        again as it was started."""
        stop_processes([self.processes.pop(name)], kill)
        argv, env = self.argv[name]
        self._spawn(name, argv, **env)

    def answered(self) -> int:
        """Answers the fleet's simulators have sent so far (probes included)."""
        return sum(int(s.stats()["answered"]) for s in self.fleet)

    def wait_for_broker(self) -> None:
        import redis

        def pong() -> bool:
            try:
                return bool(redis.Redis(host="127.0.0.1", port=self.broker_port).ping())
            except redis.ConnectionError:
                return False  # not listening yet, or loading its saved data

        wait_until("Redis", pong, 30, poll_s=0.2)

    def s3_outage(self, seconds: float) -> None:
        """S3 goes dark for the tasks: every request answered 503 for `seconds` (needs `s3_outages`)."""
        requests.post(f"{self.s3_tasks_endpoint}/__outage", params={"seconds": seconds}, timeout=5).raise_for_status()

    def _airflow(self, *args: str) -> None:
        subprocess.run([str(BIN / "airflow"), *args], env=self.env(), check=True, capture_output=True)

    def start(self) -> Stack:
        self.sql_conn = reset_database(self.database)
        self._airflow("db", "migrate")
        self._airflow(
            "pools", "set", "sglang_fleet", str(self.slots), "Shard tasks generating against the SGLang fleet"
        )
        ports = ([self.simulator_port] + [None] * (self.simulators - 1))[: self.simulators]
        self.fleet = [start_simulator(self.home, *self.simulator_args, port=port) for port in ports]
        if self.with_s3:
            self._spawn("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.s3_port)])
        if self.s3_proxied:
            proxy = [str(BIN / "python"), str(ROOT / "tools" / "s3_fault_proxy.py"), "--upstream", self.s3_endpoint]
            self._spawn(
                "s3-faults", [*proxy, "--port", str(self.s3_proxy_port), "--fault-rate", str(self.s3_fault_rate)]
            )
        self._spawn("api-server", [str(BIN / "airflow"), "api-server", "--port", str(self.api_port)])
        if self.own_redis:
            redis = ["redis-server", "--port", str(self.broker_port), "--bind", "127.0.0.1", "--dir", str(self.home)]
            self._spawn("redis", [*redis, "--save", "3600 1 300 100 60 10000"])  # Redis's own default save points
            self.wait_for_broker()
        self._start_executor()
        self._spawn("dag-processor", [str(BIN / "airflow"), "dag-processor"])
        if self.with_triggerer:
            self._spawn("triggerer", [str(BIN / "airflow"), "triggerer"])
        if self.with_s3:
            wait_until("S3 API", lambda: requests.get(self.s3_endpoint, timeout=2).status_code < 500, 60)
        if self.s3_proxied:
            wait_until("S3 fault proxy", lambda: requests.get(f"{self.s3_tasks_endpoint}/__faults", timeout=2).ok, 60)
        wait_until("Airflow API", self._api_up, 120)
        return self

    def _api_up(self) -> bool:
        """The API answers its health check; an api-server that exited will never: say why at once."""
        if (code := self.processes["api-server"].poll()) is not None:
            tail = "".join((self.home / "api-server.log").read_text().splitlines(True)[-20:])
            raise RuntimeError(f"the Airflow api-server exited ({code}) before it answered; its log ends:\n{tail}")
        return requests.get(f"{self.api}/api/v2/monitor/health", timeout=2).ok

    def stop(self) -> None:
        for simulator in self.fleet:
            simulator.stop()
        stop_processes(list(self.processes.values()))
        self.processes.clear()

    def s3_faults(self) -> dict[str, int]:
        """What the fault proxy injected so far, by kind."""
        return dict(requests.get(f"{self.s3_tasks_endpoint}/__faults", timeout=5).json()["injected"])

    def s3_client(self) -> Any:
        return moto_client(self.s3_endpoint)

    # --- the Airflow REST API, as a person's scripts would use it ---
    def _headers(self) -> dict[str, str]:
        if self._token is None:
            resp = requests.post(
                f"{self.api}/auth/token", json={"username": ADMIN[0], "password": ADMIN[1]}, timeout=10
            )
            resp.raise_for_status()
            self._token = resp.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = requests.request(method, f"{self.api}/api/v2{path}", headers=self._headers(), timeout=30, **kwargs)
        resp.raise_for_status()
        return resp.json() if resp.content else None

    def trigger(self, conf: dict[str, Any], timeout_s: float = 180) -> str:
        wait_until(
            "DAG parsed",
            lambda: requests.get(f"{self.api}/api/v2/dags/{DAG_ID}", headers=self._headers(), timeout=5).ok,
            timeout_s,
        )
        self.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
        run = self.call("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
        return str(run["dag_run_id"])

    def wait_for_run(self, run_id: str, timeout_s: float = 600) -> str:
        def finished() -> str | None:
            scheduler = self.processes.get("scheduler")
            if scheduler is not None and (code := scheduler.poll()) is not None:  # no run would move again
                raise RuntimeError(f"run {run_id}: the scheduler exited ({code}): see {self.home / 'scheduler.log'}")
            state = self.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
            return state if state in ("success", "failed") else None

        try:
            return str(wait_until(f"run {run_id}", finished, timeout_s, poll_s=2))
        except TimeoutError as e:  # where it stands, for whoever reads the failure
            raise TimeoutError(f"{e}; its tasks: {self.task_states(run_id)}") from None

    def outcome(self, run_id: str, timeout_s: float = 600) -> dict[str, Any]:
        """A run waited for: its state, its tasks' states, the fleet check_server saw and the run's report."""
        state = self.wait_for_run(run_id, timeout_s)
        return {
            "state": state,
            "states": self.task_states(run_id),
            "fleet": self.xcom(run_id, "check_server"),
            "report": self.xcom(run_id, "report"),
        }

    def task_states(self, run_id: str) -> list[tuple[str, int, str]]:
        """Every task instance's state, in the DAG's order (upstream first), mapped ones by index."""
        items = self.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
        order = self.task_order()
        found = [(t["task_id"], t["map_index"], t["state"]) for t in items["task_instances"]]
        return sorted(found, key=lambda t: (order.get(t[0], len(order)), t[0], t[1]))

    def task_order(self) -> dict[str, int]:
        """task id -> its place in the DAG: a topological order, ties by name."""
        tasks = {
            t["task_id"]: set(t.get("downstream_task_ids") or [])
            for t in self.call("GET", f"/dags/{DAG_ID}/tasks")["tasks"]
        }
        upstream = {task: {u for u, down in tasks.items() if task in down} for task in tasks}
        order: list[str] = []
        while len(order) < len(tasks):
            ready = sorted(t for t in tasks if t not in order and upstream[t] <= set(order))
            if not ready:  # not a DAG after all: the rest by name
                ready = sorted(t for t in tasks if t not in order)
            order.extend(ready[:1])
        return {task: i for i, task in enumerate(order)}

    def failures(self, run_id: str) -> list[str]:
        """Each failed task, in the DAG's order, and why: the failure line its log carries (regen_airflow.alerts)."""
        order = self.task_order()
        items = self.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
        failed = sorted(
            (t for t in items["task_instances"] if t["state"] == "failed"),
            key=lambda t: (order.get(t["task_id"], len(order)), t["map_index"]),
        )
        lines = []
        for t in failed:
            name = f"{t['task_id']}[{t['map_index']}]" if t["map_index"] >= 0 else t["task_id"]
            path = (
                f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{t['task_id']}/logs/{max(1, t.get('try_number') or 1)}"
            )
            content = self.call("GET", path, params={"map_index": t["map_index"], "full_content": True})["content"]
            entries = content.splitlines() if isinstance(content, str) else content
            events = [str(e.get("event", e)) if isinstance(e, dict) else str(e) for e in entries]
            why = next((e for e in events if "eagle3-regen FAILED: " in e), "")
            lines.append(f"{name}: {why.split('eagle3-regen FAILED: ', 1)[-1][:400] or 'see its log'}")
        return lines

    def task_log(self, run_id: str, task_id: str, map_index: int = -1, try_number: int = 1) -> str:
        path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        return json.dumps(self.call("GET", path, params={"map_index": map_index, "full_content": True}))

    def cli(self, *args: str, **env: str) -> str:
        """An `airflow` CLI command against this stack, as an operator on one of its hosts would run it."""
        done = subprocess.run(
            [str(BIN / "airflow"), *args], env={**self.env(), **env}, capture_output=True, text=True, timeout=120
        )
        if done.returncode:
            raise RuntimeError(f"airflow {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def xcom(self, run_id: str, task_id: str, map_index: int = -1) -> Any:
        path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
        return self.call("GET", path, params={"map_index": map_index, "deserialize": True})["value"]


def demo(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the stack's processes are stopped too
    parser = argparse.ArgumentParser(prog="devstack.py demo")
    parser.add_argument("--s3", action="store_true", help="publish to a local S3 API (moto) instead of var/storage")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)
    stack = Stack(
        ROOT / "var" / "airflow",
        purpose="demo",
        with_s3=args.s3,
        simulator_args=["--decode-ms-per-token", "0.2", "--max-running", "64"],
    )
    print("starting Airflow, the SGLang simulator" + (" and an S3 API" if args.s3 else "") + "; logs in var/airflow/")
    with stack:
        print(f"Airflow {stack.api}, simulator {stack.simulator}" + (f", S3 {stack.s3_endpoint}" if args.s3 else ""))
        # The demo always generates (a nightly run would skip datasets unchanged since the last demo).
        conf: dict[str, Any] = {"endpoints": [stack.simulator], "limit": args.limit, "skip_unchanged": False}
        if args.s3:
            stack.s3_client().create_bucket(Bucket="eagle3-regen")
            conf["storage_root"] = "s3://eagle3-regen/demo"
        run_id = stack.trigger(conf)
        print(f"triggered {DAG_ID} run {run_id}; waiting (UI: {stack.api}, user admin / admin)")
        state = stack.wait_for_run(run_id)
        for task_id, map_index, task_state in stack.task_states(run_id):
            print(f"  {task_id}[{map_index}]: {task_state}" if map_index >= 0 else f"  {task_id}: {task_state}")
        summary = stack.xcom(run_id, "report") if state == "success" else None
        failed = stack.failures(run_id) if state != "success" else []
        if args.s3 and summary is not None:  # while its S3 API is up: it stops with the demo
            verified = verify_all(summary, stack.s3_client())
    if summary is None:
        print(f"run {state}: the failed tasks and why (their logs are in var/airflow/logs/):")
        for line in failed:
            print(f"  {line}")
        summary = run_report(stack, run_id, s3=args.s3)  # written even when a dataset failed: what was published
        if summary is None:
            return 1
    print_summary(summary)
    if args.s3 and state == "success":
        print(f"verified on the S3 API before it stopped: {verified}. The s3:// paths above are records only now.")
    return 0 if state == "success" else 1


def verify_all(summary: dict[str, Any], s3_client: Any) -> str:
    """Every published version of the run read back whole against its manifest (regen.verify)."""
    from regen.verify import verify_published

    done = [verify_published(d["manifest"], s3_client) for d in summary["datasets"]]
    return f"{len(done)} versions, {sum(v['records'] for v in done)} records"


def run_report(stack: Stack, run_id: str, s3: bool) -> dict[str, Any] | None:
    """The run report the report task wrote before it failed the run, read from the demo's storage."""
    from regen.layout import run_report_key, version_from_run_id

    config = load_config(Path(os.environ.get("REGEN_CONFIG", ROOT / "config" / "regen.yaml")))
    key = run_report_key(config.defaults.profile, version_from_run_id(run_id))
    try:
        if s3:
            body = stack.s3_client().get_object(Bucket="eagle3-regen", Key=f"demo/{key}")["Body"].read()
        else:
            body = (Path(config.resolve(config.defaults.storage_root)) / key).read_bytes()
    except Exception as e:  # a run that failed before its report: nothing more to show
        print(f"no run report ({e}): nothing was published")
        return None
    return dict(json.loads(body))


def print_summary(summary: dict[str, Any]) -> None:
    """Each published dataset's counts and where its files are, as the run report has them."""
    for dataset in summary["datasets"]:
        prep = dataset["prepare"]
        drift = dataset.get("retokenize_drift") or {}
        generate = dataset["stages"]["generate"]
        print(
            f"{dataset['dataset']}: {prep['rows_read']} rows, {prep['kept']} prompts "
            f"(rejected {prep['dropped_by_reason'] or 'none'}), {generate['total']} answers asked "
            f"(not answered: {generate['dropped_by_reason'] or 'none'}), {dataset['records']} training records, "
            f"{dataset['splits']['truncated']} truncated; validate rejected "
            f"{dataset['stages']['validate']['dropped_by_reason'] or 'none'}; re-tokenization drift "
            f"{drift.get('drifted')} of {drift.get('sampled')} sampled\n"
            f"  manifest: {dataset['manifest']}\n  report:   {dataset['report']}"
        )
    print(f"fleet usage: {summary['fleet_usage']}")
    for warning in summary.get("warnings", []):  # e.g. a fleet that is not the SGLang release proven against
        print(f"warning: {warning}")
    if summary.get("unpublished"):
        print(f"not published: {', '.join(summary['unpublished'])}")
    if "report" in summary:
        print(f"run report: {summary['report']}")


def ui(argv: list[str]) -> int:
    """The stack for people: Airflow's UI on a fixed port, the simulator as the fleet, up until interrupted."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    parser = argparse.ArgumentParser(prog="devstack.py ui")
    parser.add_argument("--port", type=int, default=8080, help="the UI's port on 127.0.0.1")
    parser.add_argument("--s3", action="store_true", help="also run a local S3 API (moto) with a bucket eagle3-regen")
    args = parser.parse_args(argv)
    default_endpoint = urlparse(load_config().defaults.endpoints[0].base)  # the form's default: serve it there
    stack = Stack(
        ROOT / "var" / "airflow",
        purpose="ui",
        with_s3=args.s3,
        simulator_args=["--decode-ms-per-token", "0.2", "--max-running", "64"],
        api_port=args.port,
        with_triggerer=True,
        simulator_port=default_endpoint.port if default_endpoint.hostname == "127.0.0.1" else None,
    )
    with stack:
        if args.s3:
            stack.s3_client().create_bucket(Bucket="eagle3-regen")
        wait_until("DAG parsed", lambda: stack.call("GET", f"/dags/{DAG_ID}"), 120)
        stack.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
        print(f"Airflow UI: {stack.api} (user {ADMIN[0]}, password {ADMIN[1]}); logs in var/airflow/")
        print(f"SGLang simulator: {stack.simulator}")
        if args.s3:
            print(f"S3 API: {stack.s3_endpoint} (connection aws_default), bucket eagle3-regen")
        print("Ctrl-C stops everything.", flush=True)
        try:
            while all(p.poll() is None for p in stack.processes.values()):
                time.sleep(2)
            print("a component stopped; see var/airflow/*.log")
            return 1
        except KeyboardInterrupt:
            return 0


COMMANDS = {"demo": demo, "ui": ui}


def main(argv: list[str]) -> int:
    """A user's mistake (a config or conf to fix) is one short message and exit 2; REGEN_DEBUG=1 shows the traceback."""
    from regen.errors import FinalError

    if not argv or argv[0] not in COMMANDS:
        sys.exit(__doc__)
    try:
        load_config(Path(os.environ.get("REGEN_CONFIG", ROOT / "config" / "regen.yaml")))  # before anything starts
        return COMMANDS[argv[0]](argv[1:])
    except FinalError as e:
        if os.environ.get("REGEN_DEBUG"):
            raise
        print(f"{argv[0]}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
