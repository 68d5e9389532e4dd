"""The real sglang-router (PyPI `sglang-router`, a Rust binary) in front of SGLang-protocol workers: one URL for a
fleet, as a production run would use it. Used by the router e2e test; by hand:

    python -m tools.router http://127.0.0.1:30001 http://127.0.0.1:30002 [--port P] [--policy round_robin]

Everything stays on loopback: the router binds 127.0.0.1 (its Prometheus port too, each router its own, since the
default 29000 collides between two routers), reads the profile's tokenizer from a local directory, and its attempt
to fetch each worker's tokenizer by model name goes to a closed loopback port (HF_ENDPOINT) instead of the hub.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import requests

from tools.devstack import free_port, wait_until

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


@dataclass
class Router:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def workers(self) -> list[dict[str, object]]:
        return list(requests.get(f"{self.url}/workers", timeout=5).json()["workers"])

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to its process group (the launcher and the Rust server it runs), SIGKILL if it lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def router_command(
    worker_urls: list[str], port: int, prometheus_port: int, tokenizer_path: Path, policy: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        *worker_urls,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--tokenizer-path",
        str(tokenizer_path),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prometheus_port),
        "--shutdown-grace-period-secs",
        "5",  # in-flight requests get 5 s on SIGTERM (default 180 s)
    ]


def start_router(
    worker_urls: list[str],
    log: Path,
    policy: str = "cache_aware",
    port: int | None = None,
    tokenizer_path: Path | None = None,
    ready_timeout_s: float = 90.0,
    wait_for_workers: bool = True,
) -> Router:
    """A router, returned once every worker is registered and healthy (or, without wait_for_workers, once it answers
    /health): the router answers /health before it has any worker, since it registers them in the background."""
    if tokenizer_path is None:
        from regen.tokenizers.kimi_mini import ensure_mini_tokenizer

        tokenizer_path = ensure_mini_tokenizer()
    port = port or free_port()
    argv = router_command(worker_urls, port, free_port(), tokenizer_path, policy)
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # a closed port: the hub is never asked
    with log.open("ab") as out:  # the child keeps its own descriptor
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    router = Router(f"http://127.0.0.1:{port}", process, log)
    expected = {u.rstrip("/") for u in worker_urls}

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"sglang-router exited with {process.returncode}; see {log}")
        if not wait_for_workers:
            return requests.get(f"{router.url}/health", timeout=5).ok
        healthy = {str(w["url"]).rstrip("/") for w in router.workers() if w.get("is_healthy")}
        return healthy >= expected

    try:
        wait_until(f"sglang-router with workers {sorted(expected)} (log: {log})", ready, ready_timeout_s, poll_s=0.3)
    except BaseException:
        router.stop()
        raise
    return router


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.router", description=__doc__.split("\n\n")[0])
    parser.add_argument("worker_urls", nargs="+")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--policy", choices=POLICIES, default="cache_aware")
    parser.add_argument("--log", type=Path, default=Path("var/router.log"))
    args = parser.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    with start_router(args.worker_urls, args.log, args.policy, args.port) as router:
        print(f"sglang-router at {router.url} in front of {args.worker_urls}; log {args.log}; Ctrl-C stops it")
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches only this process: the router is stopped below
            router.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
