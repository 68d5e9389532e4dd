"""Prepare benchmarks: tokenization throughput on 1 process vs all cores, and peak memory vs dataset size.

    .venv/bin/python bench/bench_prepare.py                    # both, at the default sizes (a few minutes on 2 cores)
    .venv/bin/python bench/bench_prepare.py throughput         # prompts/s, 1 process vs all cores, two tokenizers
    .venv/bin/python bench/bench_prepare.py memory --memory-rows 100000 1000000   # the 1M-row check
    .venv/bin/python bench/bench_prepare.py writer --writer-rows 100000 1000000 --before 8a8cf4e~   # longest first

Throughput: the real `run_prepare` (read, normalize, dedupe, render, write shards) over a generated JSONL dataset
mixing OpenAI-messages-with-tools, Glaive, ShareGPT and OpenCodeInstruct rows (1% duplicates, 0.5% broken lines),
with the mini (Rust) tokenizer, the slow Python tokenizer of `regen.tokenizers.slow_kimi` (same ids, Python cost), the
mini vocabulary in Kimi's remote-code layout (tiktoken, loaded through trust_remote_code as Kimi's is), and the
qwen3.6 profile of config/regen.yaml (Qwen3.6's real vocabulary, Rust). Each is run with `workers=1` (in-process)
and with all cores, in the same process, and the shards of both runs are checked identical. The pool start-up
(spawn + one renderer per worker) is measured on its own. Memory: prepare runs in a child process, at two dataset
sizes, with all cores; the child reports its own peak RSS (the main process: reading, dedupe, shard buffers) and its
workers' largest.

Writer: `ShardWriter` alone (what prepare's tokenizing feeds) over rows of 1,000-token prompts, each run in a child
process that reports its peak RSS, at two sizes: without the last version's answer lengths (a shard written as it
fills: the baseline) and with them (every row waits to be dealt longest first), in the same run; a row's cost is the
peak's growth between the sizes over the rows between them. The lengths are looked up as a run looks them up,
without a dict in memory (a run's are an SQLite table on disk); 10% are unknown. `--before COMMIT` also runs the
writer as it was at that commit, with lengths, at `--before-rows` (it held every row in memory: 10^6 rows would take
about 9 GB).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
import types
import zlib
from collections.abc import Iterator, Mapping
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

from regen.chat import ChatRenderer  # noqa: E402
from regen.config import DatasetConfig, load_config  # noqa: E402
from regen.layout import DatasetLocation  # noqa: E402
from regen.manifest import PreparedDataset  # noqa: E402
from regen.profiles import Profile, lookup  # noqa: E402
from regen.stages.prepare.normalize import Conversation  # noqa: E402
from regen.stages.prepare.prepare import PrepareSettings, run_prepare  # noqa: E402
from regen.stages.prepare.shards import ShardWriter  # noqa: E402
from regen.stages.prepare.tokenize import available_cores, render_ordered  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402
from regen.tokenizers.slow_kimi import ensure_slow_tokenizer  # noqa: E402

SHARD_SIZE = 2000


def tiktoken_profile() -> Profile:
    """The mini vocabulary in Kimi-K2.5's remote-code layout: tiktoken.model and a TikTokenTokenizer module, loaded
    through trust_remote_code as production loads Kimi's (regen.tokenizers.tiktoken_kimi)."""
    from regen.tokenizers.kimi_mini import ensure_tiktoken_tokenizer

    return lookup("kimi-k2.5-mini").replaced(
        name="kimi-k2.5-mini-tiktoken",
        tokenizer=str(ensure_tiktoken_tokenizer()),
        trust_remote_code=True,
    )


def slow_profile() -> Profile:
    return lookup("kimi-k2.5-mini").replaced(
        name="kimi-k2.5-mini-slow",
        tokenizer=str(ensure_slow_tokenizer()),
        trust_remote_code=True,
    )


class RowMaker:
    """Deterministic rows of the real formats, words drawn Zipf-like from a fixed vocabulary (as in real text)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.words = ["".join(self.rng.choices(letters, k=self.rng.randint(2, 9))) for _ in range(20_000)]
        self.cum_weights = list(accumulate(1 / (rank + 1) for rank in range(len(self.words))))

    def text(self, low: int, high: int) -> str:
        words = self.rng.choices(self.words, cum_weights=self.cum_weights, k=self.rng.randint(low, high))
        return " ".join(words).capitalize() + "."

    def tool(self, name: str) -> dict[str, Any]:
        properties = {w: {"type": "string", "description": self.text(3, 8)} for w in self.rng.sample(self.words, 3)}
        return {
            "name": name,
            "description": self.text(5, 12),
            "parameters": {"type": "object", "properties": properties},
        }

    def openai(self, i: int) -> dict[str, Any]:
        tool = self.tool(f"tool_{i % 50}")
        call = {"id": "c1", "type": "function", "function": {"name": tool["name"], "arguments": '{"q": "x"}'}}
        messages = [
            {"role": "system", "content": self.text(10, 30)},
            {"role": "user", "content": self.text(20, 80)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": self.text(10, 40)},
            {"role": "assistant", "content": self.text(20, 60)},
        ]
        return {"messages": messages, "tools": [{"type": "function", "function": tool}]}

    def glaive(self, i: int) -> dict[str, Any]:
        system = "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -"
        tool = self.tool(f"fn_{i % 50}")
        chat = (
            f"USER: {self.text(20, 80)}\n\n\nASSISTANT: <functioncall> "
            f'{{"name": "{tool["name"]}", "arguments": \'{{"a": 1}}\'}} <|endoftext|>\n\n\n'
            f'FUNCTION RESPONSE: {{"r": "{self.text(3, 10)}"}}\n\n\nASSISTANT: {self.text(10, 40)} <|endoftext|>\n'
        )
        return {"system": f"{system}\n{json.dumps(tool, indent=4)}\n", "chat": chat}

    def sharegpt(self, i: int) -> dict[str, Any]:
        turns = [{"from": "human" if t % 2 == 0 else "gpt", "value": self.text(15, 60)} for t in range(4)]
        return {"id": f"sg-{i}", "conversations": turns}

    def opencodeinstruct(self, i: int) -> dict[str, Any]:
        return {"id": f"oci-{i}", "input": self.text(30, 120), "output": "ref", "domain": "generic"}

    def lines(self, n: int) -> Iterator[str]:
        makers = (self.openai, self.glaive, self.sharegpt, self.opencodeinstruct)
        previous = ""
        for i in range(n):
            if i % 200 == 7:
                line = '{"messages": [{"role": "user", "content": "trunc'
            elif i % 100 == 3 and previous:
                line = previous  # an exact duplicate
            else:
                line = json.dumps(makers[i % len(makers)](i))
            previous = line
            yield line


def write_dataset(path: Path, rows: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for line in RowMaker().lines(rows):
            f.write(line + "\n")


def prepare_once(
    source: Path, renderer: ChatRenderer, workers: int, folder: Path, name: str
) -> tuple[PreparedDataset, float]:
    storage = LocalStorage(folder)
    location = DatasetLocation(storage.root_uri, renderer.profile.name, name, "v1")
    started = time.perf_counter()
    prepared = run_prepare(
        DatasetConfig(paths=[str(source)]),
        location,
        storage,
        renderer,
        PrepareSettings(shard_size=SHARD_SIZE, limit=None, workers=workers),
    )
    return prepared, time.perf_counter() - started


def pool_startup(renderer: ChatRenderer, workers: int) -> float:
    """Seconds from starting a pool to the first rendered prompt: spawn, imports, one renderer per worker."""
    item = Conversation([{"role": "user", "content": "hello"}], [])
    started = time.perf_counter()
    next(iter(render_ordered([(0, item)], renderer, workers, in_process_below=0)))
    return time.perf_counter() - started


def throughput(rows: dict[str, int]) -> None:
    cores = available_cores()
    print(f"throughput: run_prepare on generated mixed-format rows, 1 process vs {cores} worker processes")
    profiles = (
        ("mini (Rust)", lookup("kimi-k2.5-mini")),
        ("slow (Python)", slow_profile()),
        ("Kimi layout", tiktoken_profile()),
        ("Qwen3.6", load_config().profile("qwen3.6")),
    )
    for label, profile in profiles:
        renderer = ChatRenderer(profile)
        with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
            source = Path(tmp) / "rows.jsonl"
            write_dataset(source, rows[profile.name])
            one, one_s = prepare_once(source, renderer, 1, Path(tmp) / "out", "one")
            many, many_s = prepare_once(source, renderer, cores, Path(tmp) / "out", "many")
            startup = pool_startup(renderer, cores)
        same = [s.prompts_sha256 for s in one.shards] == [s.prompts_sha256 for s in many.shards]
        kept = one.stats.kept
        print(
            f"  {label:14s} {rows[profile.name]:>7,} rows, {kept:,} prompts: "
            f"1 process {kept / one_s:8.0f} prompts/s | {cores} workers {kept / many_s:8.0f} prompts/s | "
            f"speed-up x{one_s / many_s:.2f} (x{one_s / (many_s - startup):.2f} after the pool's start-up of "
            f"{startup:.1f} s) | identical shards: {same}"
        )


def child(source: Path, workers: int) -> None:
    """Runs in its own process so that its peak RSS is prepare's alone."""
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        prepared, seconds = prepare_once(source, renderer, workers, Path(tmp), "memory")
    report = {
        "rows": prepared.stats.total,
        "kept": prepared.stats.kept,
        "seconds": seconds,
        "main_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }
    print(json.dumps(report))


def memory(sizes: list[int]) -> None:
    cores = available_cores()
    print(f"memory: peak RSS of prepare in a child process ({cores} workers), by dataset size")
    results = []
    for rows in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
            source = Path(tmp) / "rows.jsonl"
            write_dataset(source, rows)
            size_mb = source.stat().st_size / 2**20
            command = [sys.executable, __file__, "child", str(source), str(cores)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(output.strip().splitlines()[-1])
        results.append(result)
        print(
            f"  {rows:>9,} rows ({size_mb:,.0f} MB of JSONL, {result['kept']:,} prompts) in {result['seconds']:.0f} s: "
            f"main process {result['main_max_rss_mb']:.0f} MB, largest worker {result['worker_max_rss_mb']:.0f} MB"
        )
    first, last = results[0], results[-1]
    print(
        f"  rows x{last['rows'] / first['rows']:.0f} -> main-process peak RSS "
        f"x{last['main_max_rss_mb'] / first['main_max_rss_mb']:.2f}, "
        f"worker peak RSS x{last['worker_max_rss_mb'] / first['worker_max_rss_mb']:.2f}"
    )


class HashedLengths(Mapping[str, int]):
    """A last version's answer lengths, by sample id, computed from the id (no memory of their own, as a run's
    SQLite table has none in the task): 1-4,000 tokens, unknown for one id in ten."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __getitem__(self, sample_id: str) -> int:
        digest = zlib.crc32(sample_id.encode())
        if digest % 10 == 0:
            raise KeyError(sample_id)
        return 1 + digest % 4000

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        raise NotImplementedError("the writer only looks lengths up")


def writer_rows(rows: int, tokens: int) -> Iterator[tuple[dict[str, Any], list[int]]]:
    """Prompts as prepare's tokenizing hands them to the writer: each its own messages (about 4 characters a token)
    and ids (a list, as a tokenizer returns them)."""
    texts = [RowMaker(seed).text(tokens * 3 // 4, tokens * 3 // 4) for seed in range(8)]
    ids = np.random.default_rng(0).integers(0, 160_000, (64, tokens), dtype=np.int32)
    for number in range(rows):
        messages = json.dumps([{"role": "user", "content": f"{number}. {texts[number % len(texts)]}"}])
        prompt = {
            "sample_id": f"{number:020x}",
            "source_index": number,
            "source": "rows.jsonl",
            "messages": messages,
            "tools": "[]",
            "meta": json.dumps({"id": f"row-{number}"}),
            "later": None,
            "answers": 1,
        }
        yield prompt, ((ids[number % len(ids)] + number) % 160_000).tolist()  # every row's its own


def writer_at(commit: str) -> type[ShardWriter]:
    """ShardWriter as it was at `commit`, loaded from git."""
    path = "include/regen/stages/prepare/shards.py"
    source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True).stdout
    module = types.ModuleType("before_shards")
    exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)
    return module.ShardWriter


def writer_child(mode: str, rows: int, tokens: int, commit: str | None) -> None:
    """Runs in its own process so that its peak RSS is the writer's alone (above what it starts at)."""
    writer_class = writer_at(commit) if commit else ShardWriter
    lengths = HashedLengths(rows) if mode == "lengths" else None
    with tempfile.TemporaryDirectory(prefix="bench-writer-") as tmp:
        storage = LocalStorage(Path(tmp) / "out")
        location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "writer", "v1")
        spill = Path(tmp) / "spill"
        spill.mkdir()
        directory = {} if commit else {"directory": spill}
        writer = writer_class(
            location, storage, SHARD_SIZE, DatasetConfig(paths=["rows.jsonl"]), 0, lengths, **directory
        )
        start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        started, cpu = time.perf_counter(), time.process_time()
        for prompt, prompt_ids in writer_rows(rows, tokens):
            writer.add(prompt, prompt_ids)
        added = time.perf_counter()
        spilled = sum(path.stat().st_size for path in spill.iterdir())
        writer.flush()
        flushed = time.perf_counter()
        written = sum(path.stat().st_size for path in (Path(tmp) / "out").rglob("*.parquet"))
    report = {
        "rows": rows,
        "shards": len(writer.shards),
        "add_seconds": added - started,
        "flush_seconds": flushed - added,
        "cpu_seconds": time.process_time() - cpu,
        "start_rss_mb": start_rss,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "spill_mb": spilled / 2**20,
        "shards_mb": written / 2**20,
    }
    print(json.dumps(report))


def writer_run(mode: str, rows: int, tokens: int, commit: str | None) -> dict[str, Any]:
    command = [sys.executable, __file__, "writer-child", mode, str(rows), str(tokens), *([commit] if commit else [])]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


def writer(sizes: list[int], tokens: int, before: str | None, before_sizes: list[int]) -> None:
    """Each way at two sizes: what a row costs is the peak's growth between them, over the rows between them."""
    print(f"writer: peak RSS of ShardWriter, {tokens:,}-token prompts, each run in a child process")
    ways: list[tuple[str, str, list[int], str | None]] = [
        ("no lengths (baseline)", "none", sizes, None),
        ("with lengths", "lengths", sizes, None),
    ]
    if before:
        ways.append((f"with lengths at {before}", "lengths", before_sizes, before))
    largest = {}
    for label, mode, (small, large), commit in ways:
        results = [writer_run(mode, rows, tokens, commit) for rows in (small, large)]
        for result in results:
            print(
                f"  {label:28s} {result['rows']:>9,} rows, {result['shards']:>3,} shards: peak RSS "
                f"{result['max_rss_mb']:6,.0f} MB | spill file {result['spill_mb']:6,.0f} MB | shards "
                f"{result['shards_mb']:6,.0f} MB | add {result['add_seconds']:4.0f} s, "
                f"flush {result['flush_seconds']:4.0f} s, CPU {result['cpu_seconds']:4.0f} s"
            )
        per_row = (results[1]["max_rss_mb"] - results[0]["max_rss_mb"]) * 2**20 / (large - small)
        print(f"  {label:28s} peak RSS grows {per_row:,.0f} bytes a row from {small:,} to {large:,} rows")
        largest[mode if commit is None else "before"] = results[1]
    base, dealt = largest["none"], largest["lengths"]
    seconds = [r["add_seconds"] + r["flush_seconds"] for r in (dealt, base)]
    print(
        f"  with lengths / without at {sizes[1]:,} rows: peak RSS x{dealt['max_rss_mb'] / base['max_rss_mb']:.2f}, "
        f"time x{seconds[0] / seconds[1]:.2f}, CPU x{dealt['cpu_seconds'] / base['cpu_seconds']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "what", nargs="?", choices=["all", "throughput", "memory", "writer", "child", "writer-child"], default="all"
    )
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--mini-rows", type=int, default=40_000, help="rows for the mini tokenizer's throughput")
    parser.add_argument("--slow-rows", type=int, default=12_000, help="rows for the slow tokenizer's throughput")
    parser.add_argument("--memory-rows", type=int, nargs=2, default=[20_000, 200_000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--writer-rows", type=int, nargs=2, default=[20_000, 200_000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--writer-tokens", type=int, default=1000, help="tokens a prompt, for the writer")
    parser.add_argument("--before", metavar="COMMIT", help="also run the writer as it was at this commit")
    parser.add_argument("--before-rows", type=int, nargs=2, default=[10_000, 50_000], metavar=("SMALL", "LARGE"))
    options = parser.parse_args()
    if options.what == "child":
        child(Path(options.args[0]), int(options.args[1]))
        return
    if options.what == "writer-child":
        mode, rows, tokens, *commit = options.args
        writer_child(mode, int(rows), int(tokens), commit[0] if commit else None)
        return
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    if options.what in ("all", "throughput"):
        throughput(
            {
                "kimi-k2.5-mini": options.mini_rows,
                "kimi-k2.5-mini-slow": options.slow_rows,
                "kimi-k2.5-mini-tiktoken": options.mini_rows,
                "qwen3.6": options.mini_rows,
            }
        )
    if options.what in ("all", "memory"):
        memory(options.memory_rows)
    if options.what in ("all", "writer"):
        writer(options.writer_rows, options.writer_tokens, options.before, options.before_rows)


if __name__ == "__main__":
    main()
