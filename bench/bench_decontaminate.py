"""Decontamination's cost: prepare's CPU with and without eval suites, measured in the same run, and its memory by
dataset size.

    .venv/bin/python bench/bench_decontaminate.py                          # 20,000 rows against 10,000 suite items
    .venv/bin/python bench/bench_decontaminate.py --rows 200000 --items 10000

The real `run_prepare` (read, normalize, decontaminate, dedupe, render with the mini tokenizer, write shards) in one
process (`workers=1`, so that its CPU time is all of prepare's), in a child process per run, over bench_prepare's
generated rows of four real formats. The suites: three JSONL files of `--items` items in all (15 to 150 words, the
same Zipf vocabulary as the prompts, so that common words and phrases are shared), with `--planted` of the items
copied into the dataset, which must all be rejected. Runs alternate baseline and decontaminated, twice, and the
fastest of each is compared (the machine is shared). CPU includes reading the suites and building the index.
Memory: the decontaminated run's peak RSS at `--rows` and at twice as many.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_prepare import SHARD_SIZE, RowMaker, write_dataset  # noqa: E402

from regen.chat import ChatRenderer  # noqa: E402
from regen.config import DatasetConfig, DecontaminationConfig, EvalSuite  # noqa: E402
from regen.layout import DatasetLocation  # noqa: E402
from regen.manifest import PreparedDataset  # noqa: E402
from regen.profiles import lookup  # noqa: E402
from regen.stages.prepare.eval_suites import load_suites  # noqa: E402
from regen.stages.prepare.prepare import PrepareSettings, run_prepare  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402

SUITES = ("mt_bench_like", "gsm8k_like", "mbpp_like")


def write_suites(folder: Path, items: int) -> list[str]:
    """Three suite files of `items` items in all; returns their texts."""
    maker = RowMaker(seed=0)  # the prompts' vocabulary
    maker.rng.seed(1)  # other draws
    texts = [maker.text(15, 150) for _ in range(items)]
    for number, name in enumerate(SUITES):
        with (folder / f"{name}.jsonl").open("w") as f:
            for i in range(number, items, len(SUITES)):
                f.write(json.dumps({"id": f"{name}/{i}", "question": texts[i]}) + "\n")
    return texts


def suites_config(folder: Path) -> DecontaminationConfig:
    suites = [EvalSuite(name=n, path=str(folder / f"{n}.jsonl"), field="question", id_field="id") for n in SUITES]
    return DecontaminationConfig(suites=suites)


def child(folder: Path, source: Path, decontaminate: bool) -> None:
    """One prepare in its own process: its CPU time and peak RSS are prepare's alone (the renderer loaded first)."""
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    renderer.render_ids([{"role": "user", "content": "warm up"}], [])
    started, wall = time.process_time(), time.perf_counter()
    cleaning = load_suites(suites_config(folder)) if decontaminate else None
    with tempfile.TemporaryDirectory(prefix="bench-decontaminate-") as tmp:
        storage = LocalStorage(Path(tmp))
        location = DatasetLocation(storage.root_uri, renderer.profile.name, "bench", "v1")
        config = DatasetConfig(paths=[str(source)])
        prepared = run_prepare(
            config,
            location,
            storage,
            renderer,
            PrepareSettings(shard_size=SHARD_SIZE, limit=None, workers=1, decontamination=cleaning),
        )
    assert isinstance(prepared, PreparedDataset)
    report = {
        "cpu_s": time.process_time() - started,
        "wall_s": time.perf_counter() - wall,
        "rows": prepared.stats.total,
        "kept": prepared.stats.kept,
        "eval_overlap": prepared.stats.dropped_by_reason.get("eval_overlap", 0),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(report))


def run_child(folder: Path, source: Path, decontaminate: bool) -> dict[str, float]:
    command = [sys.executable, __file__, "child", str(folder), str(source), "1" if decontaminate else "0"]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


def dataset(folder: Path, rows: int, texts: list[str], planted: int) -> Path:
    """bench_prepare's rows, then `planted` suite items as prompts (where they stand does not change the cost)."""
    source = folder / f"rows-{rows}.jsonl"
    write_dataset(source, rows)
    with source.open("a") as f:
        for i in range(planted):
            f.write(json.dumps({"prompt": f"Question {i}: {texts[(i * 37) % len(texts)]}"}) + "\n")
    return source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", choices=["bench", "child"], default="bench")
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--planted", type=int, default=100)
    options = parser.parse_args()
    if options.what == "child":
        folder, source, flag = options.args
        child(Path(folder), Path(source), flag == "1")
        return
    with tempfile.TemporaryDirectory(prefix="bench-decontaminate-") as tmp:
        folder = Path(tmp)
        texts = write_suites(folder, options.items)
        source = dataset(folder, options.rows, texts, options.planted)
        print(f"prepare of {options.rows:,} rows (+{options.planted} planted) against {options.items:,} suite items")
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(2):
            for decontaminate in (False, True):
                result = run_child(folder, source, decontaminate)
                runs[decontaminate].append(result)
                label = "decontaminated" if decontaminate else "baseline"
                print(
                    f"  {label:>14}: {result['cpu_s']:.2f} CPU-s ({result['wall_s']:.2f} s wall), {result['kept']:,} "
                    f"kept, {result['eval_overlap']} eval_overlap, peak RSS {result['max_rss_mb']:.0f} MB"
                )
        base = min(r["cpu_s"] for r in runs[False])
        cleaned = min(r["cpu_s"] for r in runs[True])
        print(f"  CPU ratio decontaminated / baseline (fastest of each): {cleaned / base:.3f}")
        double = dataset(folder, 2 * options.rows, texts, options.planted)
        bigger = run_child(folder, double, True)
        print(
            f"  memory: decontaminated peak RSS {min(r['max_rss_mb'] for r in runs[True]):.0f} MB at "
            f"{options.rows:,} rows, {bigger['max_rss_mb']:.0f} MB at {2 * options.rows:,} rows"
        )


if __name__ == "__main__":
    main()
