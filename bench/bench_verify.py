"""Verifier throughput: `verify_version` against `sha256sum` of the same files, in the same run.

    .venv/bin/python bench/bench_verify.py                  # 3,000 records (about 30 MB of shard files)
    .venv/bin/python bench/bench_verify.py --records 1000

One shard is built as the pipeline writes it (prompts/ and raw/ of bench_validate's long records), validated and
exported; a manifest names every file with its sha256 and size. Then, best of three each:
- `sha256sum` over the files (the floor: one pass of hashing, in C);
- the verifier with `--files-only` (streamed through sha256, sizes compared);
- the full verifier (also every record: prompt + output against prompts/ and raw/, mask boundary, vocabulary, EOS).
Each prints MB/s of the version's bytes and its ratio to sha256sum's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_validate import built_shard, records_wanted  # noqa: E402

from regen.stages.export import run_export  # noqa: E402
from regen.stages.publish.publish import shard_entries  # noqa: E402
from regen.stages.validate import ValidateSettings, run_validate  # noqa: E402
from regen.storage import sha256_file  # noqa: E402
from regen.verify import verify_version  # noqa: E402


def best_of(runs: int, fn: object) -> float:
    """The least wall time of a few runs: sha256sum is a child process, whose CPU time process_time() would miss."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    records = records_wanted(argv, __doc__)
    with built_shard(records, "bench-verify-") as (_, renderer, storage, shard):
        shard = run_export(run_validate(shard, storage, renderer, ValidateSettings(retokenize_fraction=0)), storage)
        location = shard.location
        written = [shard.prompts_key, str(shard.raw_key)]  # prepare's and generate's, written by build_shard
        files = {key: sha256_file(Path(storage.uri(key))) for key in written} | shard.files
        manifest = {
            "dataset": location.dataset,
            "version": location.version,
            "root": storage.root_uri,
            "profile": {"name": location.profile},
            "token_roles": renderer.roles.as_record(),
            "records": shard.stats["export"].kept,
            "shards": shard_entries([shard]),
            "files": files,
            "sizes": {key: storage.size(key) for key in files},
        }
        manifest_path = Path(storage.uri(location.manifest))
        manifest_path.write_text(json.dumps(manifest))
        paths = [storage.uri(key) for key in files]
        megabytes = sum(manifest["sizes"].values()) / 1e6
        print(f"$ python bench/bench_verify.py --records {records}")
        print(f"version: {len(files)} files, {megabytes:.1f} MB, {manifest['records']} records")

        floor = best_of(3, lambda: subprocess.run(["sha256sum", *paths], check=True, capture_output=True))
        print(f"  sha256sum               {megabytes / floor:8.1f} MB/s   x1.00")
        files_only = best_of(3, lambda: verify_version(str(manifest_path), records=False))
        print(f"  verify --files-only     {megabytes / files_only:8.1f} MB/s   x{floor / files_only:.2f}")
        problems: list[str] = []
        full = best_of(3, lambda: problems.extend(verify_version(str(manifest_path)).problems))
        print(
            f"  verify (every record)   {megabytes / full:8.1f} MB/s   x{floor / full:.2f}   "
            f"{manifest['records'] / full:,.0f} records/s; problems found: {len(problems)}"
        )
        for problem in sorted(set(problems)):
            print(f"    problem: {problem}")


if __name__ == "__main__":
    main()
