"""The prefix cache's share of prompt tokens, with and without endpoint affinity, on production-like conversations.

    .venv/bin/python bench/bench_affinity.py [--conversations 400] [--endpoints 4] [--in-flight 64]
                                             [--report var/bench/affinity.json]

`scale_rows.py`'s on-policy conversations (ShareGPT, 2 to 4 user turns, production-shaped text) prepared once, then
generated twice through the real `run_generate`, each time against `--endpoints` fresh simulators (each with SGLang's
radix-cache behaviour: a prompt's longest cached prefix is not prefilled, `meta_info.cached_tokens`): first with
`endpoint_affinity` off (every turn to the least busy endpoint), then on (a turn first to the endpoint that answered
the turn before). Printed for both: the share of prompt tokens the caches held, as the servers counted them, and the
share of later turns that reached the endpoint holding their history. Only the routing differs; the answers, and
so the prompts, are the same (the simulators answer a prompt the same way on any endpoint).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report_file import save  # noqa: E402
from scale_rows import generate  # noqa: E402

from regen.chat import ChatRenderer  # noqa: E402
from regen.config import DatasetConfig, Sampling  # noqa: E402
from regen.layout import DatasetLocation  # noqa: E402
from regen.manifest import PreparedDataset  # noqa: E402
from regen.profiles import lookup  # noqa: E402
from regen.records import read_raw  # noqa: E402
from regen.samples import TURN, sample_of, turn_id  # noqa: E402
from regen.stages.generate.generate import GenerateSettings, run_generate  # noqa: E402
from regen.stages.prepare.prepare import PrepareSettings, run_prepare  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402
from tools.devstack import start_simulator  # noqa: E402


def previous_turn(answer_id: str) -> str:
    return turn_id(sample_of(answer_id), int(answer_id.rpartition(TURN)[2]) - 1)


def one_pass(
    folder: Path, prepared: PreparedDataset, prepared_root: Path, args: argparse.Namespace, affinity: bool
) -> dict[str, Any]:
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    folder.mkdir(parents=True)
    storage = LocalStorage(folder / "root")
    for shard in prepared.shards:  # the same prompts, in a root of this pass's own
        storage.put_file(shard.prompts_key, prepared_root / shard.prompts_key)
    with contextlib.ExitStack() as servers:
        simulator_args = ("--decode-ms-per-token", "1", "--max-running", "32")
        urls = [servers.enter_context(start_simulator(folder, *simulator_args)).url for _ in range(args.endpoints)]
        settings = GenerateSettings(urls, Sampling().as_params(), concurrency=args.in_flight)
        settings = dataclasses.replace(settings, endpoint_affinity=affinity)
        shards = [run_generate(shard, storage, settings, renderer) for shard in prepared.shards]
    answers = {a.id: a for shard in shards for a in read_raw(storage, shard.raw_key or "", folder)}
    later = [a for a in answers.values() if previous_turn(a.id) in answers]
    same = sum(a.endpoint == answers[previous_turn(a.id)].endpoint for a in later)
    prompt = sum(int(a.meta_info.get("prompt_tokens") or 0) for a in answers.values())
    cached = sum(int(a.meta_info.get("cached_tokens") or 0) for a in answers.values())
    return {
        "endpoint_affinity": affinity,
        "turns_answered": len(answers),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 4),
        "later_turns_on_the_previous_turns_endpoint": round(same / len(later), 4) if later else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    with tempfile.TemporaryDirectory(prefix="regen-bench-affinity-") as tmp:
        folder = Path(tmp)
        source = folder / "conversations.jsonl"
        generate(folder / "unused.jsonl", args.conversations, on_policy=source, share=1.0)
        storage = LocalStorage(folder / "prepared")
        location = DatasetLocation(storage.root_uri, renderer.profile.name, "affinity", "v1")
        config = DatasetConfig(paths=[str(source)], format="auto", turns="on_policy")
        prepared = run_prepare(config, location, storage, renderer, PrepareSettings(shard_size=200, workers=1))
        assert isinstance(prepared, PreparedDataset)
        off = one_pass(folder / "off", prepared, folder / "prepared", args, affinity=False)
        print("least busy endpoint", json.dumps(off), flush=True)
        on = one_pass(folder / "on", prepared, folder / "prepared", args, affinity=True)
        print("endpoint affinity  ", json.dumps(on), flush=True)
    if on["turns_answered"] != off["turns_answered"]:
        raise SystemExit(f"{off['turns_answered']} turns answered without affinity, {on['turns_answered']} with it")
    print(
        f"cached share of prompt tokens {off['cached_share']:.3f} -> {on['cached_share']:.3f} with affinity "
        f"(ratio {on['cached_share'] / off['cached_share']:.2f}); later turns on their history's endpoint "
        f"{off['later_turns_on_the_previous_turns_endpoint']} -> {on['later_turns_on_the_previous_turns_endpoint']}"
    )
    save(args.report, {"args": vars(args), "off": off, "on": on})


if __name__ == "__main__":
    main()
