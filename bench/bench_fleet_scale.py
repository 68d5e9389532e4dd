"""Fleet-scale concurrency: ONE worker process's generate path holding a whole fleet's slots in flight.

    .venv/bin/python bench/bench_fleet_scale.py [--endpoints 64] [--slots 256] [--decode-ms-per-token 15]
        [--requests 49152] [--margin 1.0] [--hosts 8] [--skip-baseline] [--quick]

The client is the real `run_generate` (checkpoints, progress, the raw file) in a process of its own, one shard task
whose concurrency is the in-flight budget (endpoints x slots x --margin: 16,384 by default), over the real
`SGLangClient` and `EndpointPool` on generate's own aiohttp session. The fleet is `--endpoints` simulators (the
real app and engine of `regen.simulator`, each with `--slots` running slots and seconds-long answers: ~200 tokens at
`--decode-ms-per-token`), several per host process (`--hosts` processes, each serving its ports on one uvloop event
loop with a deep accept backlog) so neither the client's nor the servers' sockets crowd one process's fd limit.

Measured server-side, as bench_fleet.py does: utilization = the simulators' busy slot-seconds (time integral of
running requests, /sim/stats) over slots x window, for the steady window (from when the servers first hold ~all of
the in-flight budget until the last prompt is sent) and for the whole run (first request to last answer). Client
side: the client process's CPU seconds per answer (getrusage, run_generate only), answers per wall second, peak
in flight (generate's own count, as its progress.json reports it) and peak open file descriptors (/proc/PID/fd).
The baseline in the same run is the same client at a small fleet (4 endpoints x the same slots, same answers), whose
CPU per answer the full run's is compared with: what fleet scale itself costs the client per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_generate import SAMPLING, write_shard  # noqa: E402
from regen.manifest import ShardManifest  # noqa: E402
from regen.stages.generate.generate import GenerateSettings, run_generate  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402
from tools.devstack import free_port, wait_until  # noqa: E402

BACKLOG = 4096  # a whole endpoint's connections may arrive at once; aiohttp's default backlog is 128
PROMPT_TOKENS = 256  # the fleet's concurrency is measured here; prompt size is bench_generate.py's


# --- the fleet: several simulated endpoints per host process ----------------------------------------------------


async def serve(ports: list[int], simulator_args: list[str]) -> None:
    """Each port its own simulator (state, app, engine), as `python -m regen.simulator --port N` builds it."""
    from aiohttp import web

    from regen.simulator.__main__ import build_state, parse_args
    from regen.simulator.app import build_app

    runners = []
    for port in ports:
        state = build_state(parse_args([*simulator_args, "--port", str(port)]))
        runner = web.AppRunner(build_app(state), access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=BACKLOG).start()
        runners.append(runner)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


def serve_main(argv: list[str]) -> None:
    import uvloop  # the servers stand in for GPUs: their CPU is the harness's, kept low on a shared machine

    ports, simulator_args = [int(p) for p in argv[0].split(",")], argv[1:]
    uvloop.run(serve(ports, simulator_args))


@dataclass
class Fleet:
    urls: list[str]
    hosts: list[subprocess.Popen[bytes]]
    slots: int
    http: requests.Session = field(default_factory=requests.Session)

    def stats(self, timeout_s: float = 600) -> list[dict[str, Any]]:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda url: self.http.get(f"{url}/sim/stats", timeout=timeout_s).json(), self.urls))

    def cpu_s(self) -> float:
        return sum(sum(psutil.Process(h.pid).cpu_times()[:2]) for h in self.hosts)


@contextlib.contextmanager
def fleet(endpoints: int, slots: int, decode_ms: float, hosts: int) -> Iterator[Fleet]:
    ports = [free_port() for _ in range(endpoints)]
    simulator_args = ["--max-running", str(slots), "--decode-ms-per-token", str(decode_ms)]
    simulator_args += ["--min-tokens", "50", "--max-tokens", "150"]  # two parts: ~200 tokens an answer
    groups = [ports[i::hosts] for i in range(min(hosts, endpoints))]
    processes = [
        subprocess.Popen([sys.executable, __file__, "serve", ",".join(map(str, group)), *simulator_args])
        for group in groups
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url in urls:
            wait_until("simulator", lambda: requests.get(f"{url}/health", timeout=1).ok, 120, 0.2)  # noqa: B023
        yield Fleet(urls, processes, slots)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


# --- the client: run_generate in a process of its own ------------------------------------------------------------


def client_main(argv: list[str]) -> None:
    """`client ROOT IN_FLIGHT URL...`: one shard through run_generate; its CPU and wall time as JSON on stdout."""
    root, in_flight, urls = Path(argv[0]), int(argv[1]), argv[2:]
    shard = ShardManifest.from_dict(json.loads((root / "shard.json").read_text()))
    settings = GenerateSettings(urls, SAMPLING, concurrency=in_flight)
    usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    done = run_generate(shard, LocalStorage(root / "storage"), settings)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    stats = done.stats["generate"]
    result = {"cpu_s": cpu, "wall_s": time.monotonic() - wall, "kept": stats.kept, "dropped": stats.dropped}
    print(json.dumps(result), flush=True)


def prepare_client(folder: Path, requests_: int) -> Path:
    """The prompts' shard, written before the client starts (not in its CPU); where its progress.json will be."""
    folder.mkdir(parents=True)
    storage, shard = write_shard(folder / "storage", requests_, PROMPT_TOKENS)
    (folder / "shard.json").write_text(json.dumps(shard.to_dict()))
    return Path(storage.uri(shard.keys.progress))


# --- one run: sample the fleet and the client until the client is done -------------------------------------------


@dataclass
class Sample:
    at: float  # monotonic, system-wide: comparable with the simulators' `now`
    busy: float
    sent: int
    at_servers: int  # running + waiting, summed over the fleet


def sample(fleet_: Fleet) -> Sample | None:
    """None when a simulator's loop is too busy to answer within 10 s (the machine's CPU is the limit then)."""
    try:
        stats = fleet_.stats(timeout_s=10)
    except requests.RequestException:
        return None
    return Sample(
        at=sum(s["now"] for s in stats) / len(stats),
        busy=sum(s["busy_slot_seconds"] for s in stats),
        sent=sum(s["requests"] for s in stats),
        at_servers=sum(s["running"] + s["waiting"] for s in stats),
    )


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        return 0


def in_flight_reported(progress: Path) -> int:
    """Generate's own in-flight count (pool.in_flight), from the progress.json it writes at every checkpoint."""
    try:
        return int(json.loads(progress.read_text())["in_flight"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def steady_utilization(samples: list[Sample], slots: int, in_flight: int, total: int) -> float | None:
    """Busy slot-seconds over slot-seconds from when the servers have received the first `in_flight` requests (the
    ramp is over) until the last prompt is sent (after that the fleet drains); None when there was no such window."""
    ramped = [i for i, s in enumerate(samples) if s.sent >= in_flight]
    feeding = [i for i, s in enumerate(samples) if s.sent < total]
    if not ramped or not feeding or feeding[-1] <= ramped[0]:
        return None
    first, last = samples[ramped[0]], samples[feeding[-1]]
    return (last.busy - first.busy) / (slots * (last.at - first.at))


def one_run(folder: Path, endpoints: int, args: argparse.Namespace, requests_: int) -> dict[str, Any]:
    in_flight = round(endpoints * args.slots * args.margin)
    root = folder / f"run-{endpoints}"
    progress = prepare_client(root, requests_)
    with fleet(endpoints, args.slots, args.decode_ms_per_token, args.hosts) as fleet_:
        started = time.monotonic()
        client = subprocess.Popen(
            [sys.executable, __file__, "client", str(root), str(in_flight), *fleet_.urls], stdout=subprocess.PIPE
        )
        samples, missed, peak_fds, peak_in_flight = [], 0, 0, 0
        try:
            while client.poll() is None:
                if (read := sample(fleet_)) is None:
                    missed += 1
                else:
                    samples.append(read)
                peak_fds = max(peak_fds, open_fds(client.pid))
                peak_in_flight = max(peak_in_flight, in_flight_reported(progress))
                time.sleep(args.sample_s)
        finally:
            client.kill() if client.poll() is None else None
        wall = time.monotonic() - started
        assert client.stdout is not None
        if client.returncode != 0:
            raise SystemExit(f"client failed ({client.returncode})")
        result = json.loads(client.stdout.read().decode().strip().splitlines()[-1])
        stats, servers_cpu = fleet_.stats(), fleet_.cpu_s()
    slots = endpoints * args.slots
    window = max(s["last_end"] for s in stats) - min(s["first_start"] for s in stats)
    steady = steady_utilization(samples, slots, in_flight, requests_)
    answered = sum(s["answered"] for s in stats)
    return {
        "endpoints": endpoints,
        "slots": slots,
        "in_flight": in_flight,
        "requests": requests_,
        "answered": answered,
        "kept": result["kept"],
        "dropped": result["dropped"],
        "utilization_steady": None if steady is None else round(steady, 4),
        "utilization_whole_run": round(sum(s["busy_slot_seconds"] for s in stats) / (slots * window), 4),
        "client_cpu_ms_per_request": round(result["cpu_s"] * 1000 / answered, 3),
        "client_cpu_s": round(result["cpu_s"], 1),
        # what one core given to the client alone would carry, and so the shortest answers (seconds) at which it
        # keeps this run's in-flight budget busy: in_flight / rate
        "client_one_core_requests_per_s": round(answered / result["cpu_s"], 1),
        "shortest_answer_s_one_core": round(in_flight * result["cpu_s"] / answered, 1),
        "requests_per_s": round(answered / result["wall_s"], 1),
        "ideal_requests_per_s": round(slots / mean_service_s(args.decode_ms_per_token), 1),
        "peak_in_flight_client": peak_in_flight,
        "peak_at_servers": max(s.at_servers for s in samples) if samples else 0,
        "peak_client_fds": peak_fds,
        "servers_cpu_s": round(servers_cpu, 1),
        "wall_s": round(wall, 1),
        "stats_reads_missed": missed,  # /sim/stats not answered within 10 s: a simulator's loop was starved
        "cores_the_bench_got": round((result["cpu_s"] + servers_cpu) / wall, 2),  # client + servers, of 2
        "machine_load_1min": round(os.getloadavg()[0], 2),
    }


def mean_service_s(decode_ms: float) -> float:
    return 202 * decode_ms / 1000  # two parts of 100 tokens on average, </think> and EOS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=64)
    parser.add_argument("--slots", type=int, default=256, help="running slots per endpoint")
    parser.add_argument("--decode-ms-per-token", type=float, default=15.0, help="~200-token answers: 15 -> ~3 s")
    parser.add_argument("--requests", type=int, default=None, help="answers in the run (default: 3 x in flight)")
    parser.add_argument(
        "--margin", type=float, default=1.0, help="the shard task's concurrency over the fleet's slots (default: equal)"
    )
    parser.add_argument("--hosts", type=int, default=8, help="simulator host processes (endpoints spread over them)")
    parser.add_argument("--baseline-endpoints", type=int, default=4)
    parser.add_argument("--baseline-requests", type=int, default=None, help="default: 3 x its in-flight budget")
    parser.add_argument("--sample-s", type=float, default=1.0)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--quick", action="store_true", help="8 endpoints x 128 slots, 2 host processes")
    args = parser.parse_args(argv)
    if args.quick:
        args.endpoints, args.slots, args.hosts, args.baseline_endpoints = 8, 128, 2, 2
    return args


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        return serve_main(sys.argv[2:])
    if sys.argv[1:2] == ["client"]:
        return client_main(sys.argv[2:])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the fleet's processes are stopped too
    args = parse_args()
    requests_ = args.requests or round(3 * args.endpoints * args.slots * args.margin)
    with tempfile.TemporaryDirectory(prefix="regen-bench-fleet-scale-") as tmp:
        full = one_run(Path(tmp), args.endpoints, args, requests_)
        print("fleet", json.dumps(full), flush=True)
        if args.skip_baseline:
            return
        small = args.baseline_endpoints * args.slots
        baseline_requests = args.baseline_requests or round(3 * small * args.margin)
        baseline = one_run(Path(tmp), args.baseline_endpoints, args, baseline_requests)
        print("baseline (small fleet)", json.dumps(baseline), flush=True)
    print(
        f"{full['endpoints']}x{args.slots}: utilization {full['utilization_steady']} steady "
        f"({full['utilization_whole_run']} whole run), {full['requests_per_s']} req/s of "
        f"{full['ideal_requests_per_s']} ideal, client {full['client_cpu_ms_per_request']} ms CPU/request vs "
        f"{baseline['client_cpu_ms_per_request']} at {baseline['endpoints']}x{args.slots} (ratio "
        f"{full['client_cpu_ms_per_request'] / baseline['client_cpu_ms_per_request']:.2f}), peak in flight "
        f"{full['peak_in_flight_client']}, peak fds {full['peak_client_fds']}"
    )


if __name__ == "__main__":
    main()
