"""Fleet utilization of on-policy multi-turn regeneration against single-turn regeneration of the same prompts.

    .venv/bin/python bench/bench_on_policy.py [--conversations 512] [--turns 4] [--slots 32] [--margin 3]

The same conversations (`--turns` user turns each) are generated twice by `run_generate`, each time against a fresh
simulator with `--slots` running slots (`--decode-ms` per output token): first `turns: every_assistant_turn` (the
baseline: every turn's prompt is known up front, with the dataset's history, so every request is independent), then
`turns: on_policy` (each turn waits for its own previous turn). Both send as many requests (conversations x turns).
Utilization is measured server-side: the simulator's busy slot-seconds over its slots times the window from its first
request to its last answer. The in-flight budget is `--margin` times the slots, as docs/scaling.md says. Also printed:
the share of prompt tokens the simulator's prefix cache served.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regen.chat import ChatRenderer  # noqa: E402
from regen.config import DatasetConfig, Sampling  # noqa: E402
from regen.layout import DatasetLocation  # noqa: E402
from regen.profiles import lookup  # noqa: E402
from regen.stages.generate.generate import GenerateSettings, run_generate  # noqa: E402
from regen.stages.prepare.prepare import PrepareSettings, run_prepare  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402
from tools.devstack import start_simulator  # noqa: E402

QUESTIONS = ["How would you write {}?", "Can you make it faster?", "Which edge cases matter?", "Summarize it."]


def write_conversations(path: Path, conversations: int, turns: int) -> None:
    with path.open("w") as f:
        for i in range(conversations):
            chat = []
            for t in range(turns):
                question = QUESTIONS[t % len(QUESTIONS)].format(f"task {i}")
                chat += [{"from": "human", "value": question}, {"from": "gpt", "value": f"Reference {i}.{t}."}]
            f.write(json.dumps({"conversations": chat}) + "\n")


def one_mode(folder: Path, source: Path, mode: str, args: argparse.Namespace, renderer: ChatRenderer) -> dict[str, Any]:
    storage = LocalStorage(folder / mode)
    config = DatasetConfig(paths=[str(source)], format="sharegpt", turns=mode)  # type: ignore[arg-type]
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "bench", "v1")
    prepared = run_prepare(
        config, location, storage, renderer, PrepareSettings(shard_size=10**6, limit=None, workers=1)
    )
    sim_args = ("--max-running", str(args.slots), "--decode-ms-per-token", str(args.decode_ms))
    sim = start_simulator(folder, *sim_args)
    try:
        settings = GenerateSettings(
            [sim.url], Sampling(max_new_tokens=1024).as_params(), concurrency=int(args.slots * args.margin)
        )
        started = time.monotonic()
        generated = [run_generate(shard, storage, settings, renderer) for shard in prepared.shards]
        elapsed = time.monotonic() - started
        stats = sim.stats()
    finally:
        sim.stop()
    reports = [g.generation for g in generated if g.generation is not None]
    prompt_tokens = sum(r.prompt_tokens for r in reports)
    return {
        "mode": mode,
        "requests": stats["answered"],
        "seconds": round(elapsed, 2),
        "utilization": round(stats["utilization"], 4),
        "cached_prompt_share": round(sum(r.cached_tokens for r in reports) / max(prompt_tokens, 1), 3),
        "prompt_tokens": prompt_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=512)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--slots", type=int, default=32, help="the simulator's running slots")
    parser.add_argument("--margin", type=float, default=3.0, help="in-flight budget over the running slots")
    parser.add_argument("--decode-ms", type=float, default=2.0, help="per output token (answers average ~115)")
    args = parser.parse_args()
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    with tempfile.TemporaryDirectory(prefix="regen-bench-on-policy-") as tmp:
        folder = Path(tmp)
        source = folder / "conversations.jsonl"
        write_conversations(source, args.conversations, args.turns)
        baseline = one_mode(folder, source, "every_assistant_turn", args, renderer)
        print("single-turn (baseline)", json.dumps(baseline), flush=True)
        on_policy = one_mode(folder, source, "on_policy", args, renderer)
        print("on-policy", json.dumps(on_policy), flush=True)
    print(
        f"utilization {on_policy['utilization']:.3f} on-policy vs {baseline['utilization']:.3f} single-turn "
        f"(ratio {on_policy['utilization'] / baseline['utilization']:.3f}, target >= 0.95); "
        f"{on_policy['requests']} vs {baseline['requests']} requests"
    )


if __name__ == "__main__":
    main()
