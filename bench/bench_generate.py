"""Generation engine benchmarks against the SGLang-protocol simulator on loopback.

    .venv/bin/python bench/bench_generate.py              # all: throughput, client CPU, memory
    .venv/bin/python bench/bench_generate.py throughput   # fraction of capacity at 64, 256, 1024 in flight
    .venv/bin/python bench/bench_generate.py cpu          # client CPU per 1,000 requests vs a bare aiohttp loop
    .venv/bin/python bench/bench_generate.py stage        # the whole generate stage vs a bare aiohttp loop
    .venv/bin/python bench/bench_generate.py checkpoints  # flushing answers every second vs once, 1,024 in flight

Throughput: the simulator serves `in_flight` running slots with a fixed service time (fixed answer length, a fixed
decode time per token), so its capacity is in_flight / service_time requests per second and its busy fraction
(/sim/stats: slot-seconds over slots x window) is the throughput as a fraction of capacity. The run is the real
`run_generate` (checkpoints included), fed enough prompts for 8 full waves. Peak client memory (max RSS) is printed
for each level. CPU: process CPU seconds per 1,000 requests with 2k-token prompts and 1k-token answers, for the bare
loop (aiohttp, json) and for this project's client, measured in the same run, alternating, best of three. Stage: the
whole `run_generate` (reading the prompts, checkpoints, the raw file) against a bare aiohttp loop that sends the same
requests and decodes the answers, alternating, best of three: throughput (answers per wall second) and CPU seconds.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regen.chat import ChatRenderer  # noqa: E402
from regen.config import Sampling  # noqa: E402
from regen.layout import DatasetLocation  # noqa: E402
from regen.manifest import ShardManifest  # noqa: E402
from regen.profiles import lookup  # noqa: E402
from regen.sglang.client import SGLangClient  # noqa: E402
from regen.sglang.fleet import EndpointPool  # noqa: E402
from regen.stages.generate.generate import GenerateSettings, run_generate  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402
from tools.devstack import start_simulator  # noqa: E402

PROFILE = "kimi-k2.5-mini"  # the simulator's default; prompts end with its generation suffix, as rendered ones do
GENERATION_SUFFIX = list(ChatRenderer(lookup(PROFILE)).roles.generation_suffix)
SAMPLING = {**Sampling(max_new_tokens=4096).as_params()}


def prompts(n: int, tokens: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(100, 1000) for _ in range(tokens - len(GENERATION_SUFFIX))] + GENERATION_SUFFIX for _ in range(n)
    ]


def write_shard(folder: Path, n: int, prompt_tokens: int) -> tuple[LocalStorage, ShardManifest]:
    storage = LocalStorage(folder)
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "bench", "v1")
    key = location.shard(0).prompts
    # Built in Arrow, not as Python lists, so the client's peak memory is not the benchmark's own.
    rng = np.random.default_rng(0)
    body = rng.integers(100, 1000, size=(n, prompt_tokens), dtype=np.int32)
    body[:, -len(GENERATION_SUFFIX) :] = GENERATION_SUFFIX
    offsets = pa.array(np.arange(0, n * prompt_tokens + 1, prompt_tokens, dtype=np.int32))
    prompt_ids = pa.ListArray.from_arrays(offsets, pa.array(body.reshape(-1)))
    table = pa.table({"id": [f"s{i:07d}" for i in range(n)], "prompt_ids": prompt_ids})
    path = folder.parent / f"{folder.name}-prompts.parquet"
    pq.write_table(table, path)
    digest = storage.put_file(key, path)
    return storage, ShardManifest(location, 0, key, digest, n)


def throughput_level(in_flight: int, waves: int = 10) -> dict[str, Any]:
    """One level, in this process: run_generate against a simulator with `in_flight` running slots.

    Answer lengths vary (50-150 tokens per part) so completions do not arrive in lock-step waves. The steady-state
    fraction is the simulator's busy slot-seconds between two reads, after the first requests are in and before the
    last ones drain, over the slot-seconds available; the whole-run fraction includes ramp-up and drain.
    """
    decode_ms = {64: 2.5, 256: 5.0, 1024: 20.0}[in_flight]
    service_s = (2 * 100 + 2) * decode_ms / 1000  # mean answer: two parts of 100 tokens, </think>, EOS
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_simulator(
            Path(tmp),
            "--max-running",
            str(in_flight),
            "--decode-ms-per-token",
            str(decode_ms),
            "--min-tokens",
            "50",
            "--max-tokens",
            "150",
        )
        try:
            storage, shard = write_shard(Path(tmp) / "root", in_flight * waves, 2000)
            settings = GenerateSettings([sim.url], SAMPLING, concurrency=in_flight)  # default checkpoint cadence
            reads: list[dict[str, Any]] = []
            window = (1.5 * service_s, (waves - 2) * service_s)
            timers = [threading.Timer(t, lambda: reads.append(sim.stats())) for t in window]
            started = time.monotonic()
            for timer in timers:
                timer.start()
            run_generate(shard, storage, settings)
            elapsed = time.monotonic() - started
            whole = sim.stats()
        finally:
            sim.stop()
    first, last = reads
    steady = (last["busy_slot_seconds"] - first["busy_slot_seconds"]) / (in_flight * (last["now"] - first["now"]))
    return {
        "in_flight": in_flight,
        "capacity_req_s": round(in_flight / service_s, 1),
        "steady_fraction_of_capacity": round(steady, 4),
        "whole_run_fraction": round(whole["utilization"], 4),
        "answered": whole["answered"],
        "wall_s": round(elapsed, 1),
        "client_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


async def bare_loop(url: str, batch: list[list[int]], concurrency: int) -> None:
    """The floor: aiohttp posting the same JSON and decoding the answer, nothing else."""
    queue = iter(batch)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            for i, prompt in enumerate(queue):
                body = {"input_ids": prompt, "sampling_params": SAMPLING, "rid": f"bare-{id(prompt)}-{i}"}
                async with session.post(f"{url}/generate", json=body) as resp:
                    await resp.json()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def lean_loop(url: str, batch: list[list[int]], concurrency: int) -> None:
    """The leanest floor: aiohttp with the bodies encoded and decoded by msgspec, as the client does, and nothing
    else (no retries, no fleet bookkeeping, no checks): what the client adds is the difference."""
    encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder()
    headers = {"Content-Type": "application/json"}
    queue = iter(batch)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            for i, prompt in enumerate(queue):
                body = encoder.encode({"input_ids": prompt, "sampling_params": SAMPLING, "rid": f"lean-{i}"})
                async with session.post(f"{url}/generate", data=body, headers=headers) as resp:
                    decoder.decode(await resp.read())

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def httpx_loop(url: str, batch: list[list[int]], concurrency: int) -> None:
    """The same floor with httpx, the other mature asyncio HTTP client: the library choice is measured here."""
    import httpx

    queue = iter(batch)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=None) as session:

        async def worker() -> None:
            for i, prompt in enumerate(queue):
                body = {"input_ids": prompt, "sampling_params": SAMPLING, "rid": f"httpx-{id(prompt)}-{i}"}
                (await session.post(f"{url}/generate", json=body)).json()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def client_loop(url: str, batch: list[list[int]], concurrency: int) -> None:
    queue = iter(batch)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        pool = EndpointPool([url], session)
        client = SGLangClient(pool, session)

        async def worker() -> None:
            for i, prompt in enumerate(queue):
                await client.generate(prompt, SAMPLING, f"client-{i}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        await pool.close()


def cpu_seconds(loop: Any, url: str, batch: list[list[int]]) -> float:
    started = time.process_time()
    asyncio.run(loop(url, batch, 64))
    return time.process_time() - started


def cpu_benchmark(requests: int = 1000) -> dict[str, Any]:
    batch = prompts(requests, 2000, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_simulator(Path(tmp), "--min-tokens", "500", "--max-tokens", "500", "--max-running", "1024")
        try:
            loops = {
                "bare_aiohttp": bare_loop,
                "lean_aiohttp_msgspec": lean_loop,
                "bare_httpx": httpx_loop,
                "regen_client": client_loop,
            }
            runs: dict[str, list[float]] = {name: [] for name in loops}
            for _ in range(3):
                for name, loop in loops.items():
                    runs[name].append(cpu_seconds(loop, sim.url, batch))
        finally:
            sim.stop()
    per_1000 = {name: round(min(values) * 1000 / requests, 3) for name, values in runs.items()}
    return {
        "cpu_s_per_1000_requests": per_1000,
        "ratio_client_to_bare_aiohttp": round(per_1000["regen_client"] / per_1000["bare_aiohttp"], 3),
        "ratio_client_to_lean_aiohttp_msgspec": round(per_1000["regen_client"] / per_1000["lean_aiohttp_msgspec"], 3),
        "ratio_httpx_to_aiohttp": round(per_1000["bare_httpx"] / per_1000["bare_aiohttp"], 3),
    }


def stage_benchmark(requests: int = 2000, rounds: int = 3) -> dict[str, Any]:
    """run_generate against the bare loop, same simulator, same prompts; a fresh storage root per stage run."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_simulator(
            Path(tmp),
            "--min-tokens",
            "250",
            "--max-tokens",
            "250",
            "--max-running",
            "64",
            "--decode-ms-per-token",
            "0.5",
        )
        try:
            storage, shard = write_shard(Path(tmp) / "prompts-root", requests, 2000)
            table = pq.read_table(storage.uri(shard.prompts_key))
            batch = table.column("prompt_ids").to_pylist()
            runs: dict[str, list[tuple[float, float]]] = {"bare_aiohttp": [], "generate_stage": []}
            for round_ in range(rounds):
                runs["bare_aiohttp"].append(_timed(lambda: asyncio.run(bare_loop(sim.url, batch, 64))))
                fresh = LocalStorage(Path(tmp) / f"stage-{round_}")
                fresh.put_file(shard.prompts_key, Path(storage.uri(shard.prompts_key)))
                settings = GenerateSettings([sim.url], SAMPLING, concurrency=64)
                runs["generate_stage"].append(_timed(lambda: run_generate(shard, fresh, settings)))  # noqa: B023
        finally:
            sim.stop()
    return {"requests": requests, **side_by_side(requests, runs, "bare_aiohttp", "generate_stage")}


class CountingStorage(LocalStorage):
    """Local storage that counts checkpoint parts as they are written."""

    parts = 0

    def put_bytes(self, key: str, data: bytes) -> str:
        self.parts += "/part-" in key
        return super().put_bytes(key, data)


def checkpoint_benchmark(requests: int = 3072, in_flight: int = 1024, rounds: int = 3) -> dict[str, Any]:
    """run_generate at 1,024 in flight with answers flushed every second (the default) against the same run with
    one flush at the end (checkpoint_s past the run's length): what checkpointing costs, alternating, best of three."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_simulator(
            Path(tmp),
            *("--min-tokens", "100", "--max-tokens", "200", "--max-running", str(in_flight)),
            *("--decode-ms-per-token", "10"),
        )
        try:
            storage, shard = write_shard(Path(tmp) / "prompts-root", requests, 2000)
            runs: dict[str, list[tuple[float, float]]] = {"flush_at_end": [], "flush_every_1s": []}
            parts: dict[str, int] = {}
            for round_ in range(rounds):
                for name, every_s in (("flush_at_end", 1e9), ("flush_every_1s", 1.0)):
                    fresh = CountingStorage(Path(tmp) / f"{name}-{round_}")
                    fresh.put_file(shard.prompts_key, Path(storage.uri(shard.prompts_key)))
                    settings = GenerateSettings(
                        [sim.url], SAMPLING, concurrency=in_flight, checkpoint_s=every_s, checkpoint_every=10**9
                    )
                    runs[name].append(_timed(lambda: run_generate(shard, fresh, settings)))  # noqa: B023
                    parts[name] = fresh.parts
        finally:
            sim.stop()
    return {
        "requests": requests,
        "in_flight": in_flight,
        "parts_written": parts,
        **side_by_side(requests, runs, "flush_at_end", "flush_every_1s"),
    }


def side_by_side(
    requests: int, runs: dict[str, list[tuple[float, float]]], baseline: str, other: str
) -> dict[str, Any]:
    """Two ways timed alternately (wall and CPU seconds a round): each one's best round, and the ratios against the
    baseline (throughput: above 1 when `other` is faster; CPU: above 1 when it costs more)."""
    best = {name: (min(w for w, _ in values), min(c for _, c in values)) for name, values in runs.items()}
    (base_wall, base_cpu), (wall, cpu) = best[baseline], best[other]
    return {
        "answers_per_s": {baseline: round(requests / base_wall, 1), other: round(requests / wall, 1)},
        "cpu_s": {baseline: round(base_cpu, 3), other: round(cpu, 3)},
        "throughput_ratio": round(base_wall / wall, 3),
        "cpu_ratio": round(cpu / base_cpu, 3),
    }


def _timed(fn: Any) -> tuple[float, float]:
    wall, cpu = time.monotonic(), time.process_time()
    fn()
    return time.monotonic() - wall, time.process_time() - cpu


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what == "level":  # a child process per level, so each peak RSS is its own
        print(json.dumps(throughput_level(int(sys.argv[2]))))
        return
    if what in ("all", "throughput"):
        for in_flight in (64, 256, 1024):
            out = subprocess.run(
                [sys.executable, __file__, "level", str(in_flight)], capture_output=True, text=True, check=True
            )
            print("throughput", out.stdout.strip().splitlines()[-1], flush=True)
    if what in ("all", "cpu"):
        print("cpu", json.dumps(cpu_benchmark()), flush=True)
    if what in ("all", "stage"):
        print("stage", json.dumps(stage_benchmark()), flush=True)
    if what in ("all", "checkpoints"):
        print("checkpoints", json.dumps(checkpoint_benchmark()), flush=True)


if __name__ == "__main__":
    main()
