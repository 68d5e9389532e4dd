"""The last version's answer lengths as the next version's reader holds them: an SQLite table on local disk
(regen.version_inputs.AnswerLengths) against the dict it replaced, on the same ids.

    .venv/bin/python bench/bench_answer_lengths.py [--samples 1000000] [--report var/bench/answer_lengths.json]

Sample ids as the verdict files give them for a dataset of one sample a prompt (fresh strings: the prompt's id, 20
hex digits, regen.stages.prepare.normalize), 400 a shard, each kept by whoever holds them. Printed for both: the
Python memory they hold (tracemalloc; SQLite's own page cache, 2 MB by default, is not Python's), the time to build
them, a lookup of every id, and the table's file on disk.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report_file import save  # noqa: E402

from regen.version_inputs import AnswerLengths  # noqa: E402

SHARD = 400


def shards(samples: int) -> Iterator[tuple[list[str], list[int]]]:
    for start in range(0, samples, SHARD):
        numbers = range(start, min(samples, start + SHARD))
        yield [hashlib.sha256(str(i).encode()).hexdigest()[:20] for i in numbers], [i % 5000 for i in numbers]


def measure(kind: str, samples: int) -> dict[str, Any]:
    tracemalloc.start()
    started = time.perf_counter()
    lengths: dict[str, int] | AnswerLengths = {} if kind == "dict" else AnswerLengths()
    for ids, tokens in shards(samples):
        if isinstance(lengths, AnswerLengths):
            lengths.add(ids, tokens)
        else:
            lengths.update(zip(ids, tokens, strict=True))
    built = time.perf_counter() - started
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    looking, found = 0.0, 0
    for ids, _ in shards(samples):
        started = time.perf_counter()
        found += sum(lengths.get(sample) is not None for sample in ids)
        looking += time.perf_counter() - started
    on_disk = 0
    if isinstance(lengths, AnswerLengths):
        on_disk = lengths.path.stat().st_size
        lengths.__exit__(None, None, None)
    if found != samples:
        raise SystemExit(f"{kind}: {found} of {samples} ids found")
    return {
        "kind": kind,
        "samples": samples,
        "python_bytes_held": held,
        "bytes_a_sample": round(held / samples, 1),
        "build_s": round(built, 2),
        "lookup_us": round(looking / samples * 1e6, 2),
        "on_disk_bytes": on_disk,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    figures = {kind: measure(kind, args.samples) for kind in ("dict", "table")}
    for kind, f in figures.items():
        print(
            f"{kind:5}: {f['samples']:,} lengths, {f['python_bytes_held'] / 1e6:.1f} MB held in Python "
            f"({f['bytes_a_sample']} bytes a sample), built in {f['build_s']} s, {f['lookup_us']} us a lookup, "
            f"{f['on_disk_bytes'] / 1e6:.1f} MB on disk"
        )
    d, t = figures["dict"], figures["table"]
    print(
        f"table against dict: memory x{t['python_bytes_held'] / d['python_bytes_held']:.4f}, "
        f"build x{t['build_s'] / d['build_s']:.2f}, lookup x{t['lookup_us'] / d['lookup_us']:.1f}"
    )
    save(args.report, {"args": vars(args), **figures})


if __name__ == "__main__":
    main()
