"""The prefix cache's share of prompt tokens, with and without endpoint affinity, and behind sglang-router's
cache_aware policy, on production-like conversations.

    .venv/bin/python bench/bench_affinity.py [--conversations 400] [--endpoints 4] [--in-flight 64]
                                             [--no-router] [--report var/bench/affinity.json]

`scale_rows.py`'s on-policy conversations (ShareGPT, 2 to 4 user turns, production-shaped text) prepared once, then
generated through the real `run_generate`, each time against `--endpoints` fresh simulators (each with SGLang's
radix-cache behaviour: a prompt's longest cached prefix is not prefilled, `meta_info.cached_tokens`): with
`endpoint_affinity` off (every turn to the least busy endpoint), on (a turn first to the endpoint that answered the
turn before), and, unless `--no-router`, through the real sglang-router (`--policy cache_aware`) in front of the
same number of simulators, the client sending every turn to the router. Printed for each: the share of prompt tokens
the caches held, as the servers counted them, and the share of later turns answered by the server that answered the
turn before (from the servers' own records). Only the routing differs; the answers, and so the prompts, are the
same (the simulators answer a prompt the same way on any server).
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
from regen.sglang.client import answer_id_of  # noqa: E402
from regen.stages.generate.generate import GenerateSettings, run_generate  # noqa: E402
from regen.stages.prepare.prepare import PrepareSettings, run_prepare  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402
from tools.devstack import start_simulator  # noqa: E402
from tools.router import start_router  # noqa: E402


def previous_turn(answer_id: str) -> str:
    return turn_id(sample_of(answer_id), int(answer_id.rpartition(TURN)[2]) - 1)


ROUTES = {
    "least busy endpoint": "the client's: every turn to the least busy endpoint",
    "endpoint affinity": "the client's: a turn first to the endpoint that answered the turn before",
    "sglang-router cache_aware": "the router's, in front of the servers: the client sends every turn to it",
}


def one_pass(
    folder: Path, prepared: PreparedDataset, prepared_root: Path, args: argparse.Namespace, route: str
) -> dict[str, Any]:
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    folder.mkdir(parents=True)
    storage = LocalStorage(folder / "root")
    for shard in prepared.shards:  # the same prompts, in a root of this pass's own
        storage.put_file(shard.prompts_key, prepared_root / shard.prompts_key)
    with contextlib.ExitStack() as servers:
        simulator_args = ("--decode-ms-per-token", "1", "--max-running", "32")
        simulators = [servers.enter_context(start_simulator(folder, *simulator_args)) for _ in range(args.endpoints)]
        urls = [simulator.url for simulator in simulators]
        if route == "sglang-router cache_aware":
            urls = [servers.enter_context(start_router(urls, folder / "router.log", "cache_aware")).url]
        settings = GenerateSettings(urls, Sampling().as_params(), concurrency=args.in_flight)
        settings = dataclasses.replace(settings, endpoint_affinity=route == "endpoint affinity")
        shards = [run_generate(shard, storage, settings, renderer) for shard in prepared.shards]
    answers = {a.id: a for shard in shards for a in read_raw(storage, shard.raw_key or "", folder)}
    server = {  # answer id -> the simulator that answered it, from its own record (a rid is the id, nonce, attempt)
        answer_id_of(json.loads(line)["rid"]): simulator.url
        for simulator in simulators
        for line in simulator.record.read_text().splitlines()
    }
    later = [a for a in answers.values() if previous_turn(a.id) in answers]
    same = sum(server[a.id] == server[previous_turn(a.id)] for a in later)
    prompt = sum(int(a.meta_info.get("prompt_tokens") or 0) for a in answers.values())
    cached = sum(int(a.meta_info.get("cached_tokens") or 0) for a in answers.values())
    return {
        "route": route,
        "turns_answered": len(answers),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 4),
        "later_turns_on_the_previous_turns_server": round(same / len(later), 4) if later else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--no-router", action="store_true", help="leave out the sglang-router pass")
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
        routes = [r for r in ROUTES if not (args.no_router and "router" in r)]
        passes = {}
        for route in routes:
            passes[route] = one_pass(folder / route.replace(" ", "-"), prepared, folder / "prepared", args, route)
            print(f"{route:26}", json.dumps(passes[route]), flush=True)
    baseline = passes["least busy endpoint"]
    if len({p["turns_answered"] for p in passes.values()}) != 1:
        raise SystemExit(f"the passes answered different numbers of turns: {passes}")
    for route, figures in passes.items():
        print(
            f"{route:26} cached share of prompt tokens {figures['cached_share']:.3f} "
            f"(ratio {figures['cached_share'] / baseline['cached_share']:.2f} against the least busy endpoint); "
            f"later turns on their history's server {figures['later_turns_on_the_previous_turns_server']}"
        )
    save(args.report, {"args": vars(args), "routes": ROUTES, "passes": passes})


if __name__ == "__main__":
    main()
