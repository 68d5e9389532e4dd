"""The drain: whole-run fleet utilization on heavy-tailed answers, today's send order against longest first.

    .venv/bin/python bench/bench_drain.py [--prompts 1280] [--endpoints 4] [--slots 16] [--margin 3]
                                          [--length-median 500] [--decode-ms 4.5] [--report var/bench/drain.json]
    .venv/bin/python bench/bench_drain.py --on-policy 140 --endpoints 2 --shard-size 20 [--max-turns 8]

Airflow (scheduler, dag-processor, triggerer, api-server; LocalExecutor on PostgreSQL) runs the DAG, a pool of 4
shard tasks, over two datasets of distinct prompts against `--endpoints` simulators of `--slots` running slots each.
Their answers have the real shape, scaled down in time: a whole answer's length lognormal around `--length-median`
tokens (sigma 1), from 50 to 16,000 tokens, the same for the same prompt every time, at `--decode-ms` a token; each
slot serves 30 to 60 answers over a run at the defaults.

Runs on one stack, side by side: the first version of the datasets (no earlier version: the shards' own order,
today's), then the next version (`skip_unchanged` off), which knows every answer's length from the first, deals the
longest into the first shards and sends each shard's longest first. With `--reference-noise SIGMA`, each row also
carries a reference answer (its `output`), as SFT rows do: as long as the answer the simulators will give it times a
lognormal noise of that sigma (the target's answer a noisy multiple of the reference's): the first run then keeps the
source order (`longest_first` off), and a third run makes a first version again, in a root of its own, longest first
by the references. Utilization is measured server-side: the
simulators' busy slot-seconds (the time integral of their running requests) over their slots times the window from
the run's first request to its last answer; beside it, the run report's two figures (`server_side`, from what the
servers say of each answer with --enable-metrics, and the client-side upper bound). Also: the time from the first
request to the first published dataset, and the check that both versions hold every prompt's record exactly once,
and the same training records (the order changes what the fleet does when, never the data).

With `--on-policy N`: one dataset of N on-policy conversations of 1 to `--max-turns` user turns instead, each turn's
recorded answer (its reference) lognormal around `--length-median` tokens and the answer the target gives it that
times lognormal(0, 0.5), at most 6,000 tokens (spelt in the turn for the simulators: `--length-hint`); two first
versions, in roots of their own: the shards' own order, then the longest chain of predicted answers first, then
that with `chain_priority` (the simulators admit their waiting queues by priority, as SGLang with
--enable-priority-scheduling: a conversation's next turn ahead of short work queued before it). Each holds every
turn's record once, the same records.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report_file import save  # noqa: E402

from tools.devstack import Stack  # noqa: E402

DATASETS = ("drain_a", "drain_b")
CHATS = "drain_chat"
SHARD_TASKS = 4
LONGEST_ANSWER = 6000  # tokens, of an on-policy turn's answer


def write_config(
    folder: Path, args: argparse.Namespace, longest_first: bool = True, chain_priority: bool = False
) -> Path:
    if args.on_policy:
        return write_chat_config(folder, args, longest_first, chain_priority)
    for name in DATASETS:
        rows = [
            {"input": f"{name} task {i}: prove that the {i}th prime exists, then explain."} for i in range(args.prompts)
        ]
        if args.reference_noise is not None:
            rows = with_references(rows, args)
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        **deployment(folder, args, longest_first, "kimi-k2.5-mini"),
        "datasets": {name: {"paths": [f"{name}.jsonl"], "format": "input_output"} for name in DATASETS},
    }
    path = folder / "regen.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def deployment(
    folder: Path, args: argparse.Namespace, longest_first: bool, profile: str, chain_priority: bool = False
) -> dict[str, Any]:
    """The config's defaults and governance, the same for every dataset the bench makes."""
    return {
        "defaults": {
            "profile": profile,
            "storage_root": str(folder / "storage"),
            "shard_size": args.shard_size,
            "in_flight": int(args.endpoints * args.slots * args.margin),
            "shard_tasks": SHARD_TASKS,
            "tokenize_workers": 1,
            "longest_first": longest_first,
            "chain_priority": chain_priority,
            "sampling": {"max_new_tokens": 16_384, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0},
        },
        # the bench's simulators, and the roots of the first versions run beside the main one
        "governance": {"allowed_endpoints": ["127.0.0.1"], "allowed_storage_roots": [str(folder)]},
    }


def write_chat_config(folder: Path, args: argparse.Namespace, longest_first: bool, chain_priority: bool) -> Path:
    """One dataset of `--on-policy` conversations (seeded: the same every run); a turn's answer length is spelt in
    its user message, for the simulators' --length-hint."""
    import random
    from importlib.resources import files

    import yaml

    draw = random.Random(55)
    rows = []
    for i in range(args.on_policy):
        messages = []
        for k in range(draw.randint(1, args.max_turns)):
            reference = max(1, min(LONGEST_ANSWER, round(args.length_median * math.exp(draw.gauss(0.0, 1.0)))))
            answer = max(2, min(LONGEST_ANSWER, round(reference * math.exp(0.5 * draw.gauss(0.0, 1.0)))))
            messages.append({"role": "user", "content": f"Conversation {i}, question {k}. [[answer {answer} tokens]]"})
            messages.append({"role": "assistant", "content": " ".join(["step"] * reference)})
        rows.append({"messages": messages})
    (folder / f"{CHATS}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    builtin = yaml.safe_load(files("regen").joinpath("builtin_profiles.yaml").read_text())["kimi-k2.5-mini"]
    config = {
        **deployment(folder, args, longest_first, "drain-chat", chain_priority),
        "profiles": {"drain-chat": {**builtin, "max_prompt_tokens": 200_000}},  # every turn's history fits
        "datasets": {CHATS: {"paths": [f"{CHATS}.jsonl"], "format": "openai_messages", "turns": "on_policy"}},
    }
    path = folder / "regen.yaml"
    path.write_text(json.dumps(config))
    return path


def chat_turns(folder: Path) -> int:
    """The answers the on-policy dataset asks for: one a user turn."""
    rows = [json.loads(line) for line in (folder / f"{CHATS}.jsonl").read_text().splitlines()]
    return sum(1 for row in rows for m in row["messages"] if m["role"] == "user")


def with_references(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each row with a reference answer (`output`) as long as the simulators' answer to its prompt, times a lognormal
    noise of sigma `--reference-noise` (seeded: the same rows every run)."""
    import random

    from regen.chat import ChatRenderer
    from regen.profiles import lookup
    from regen.simulator.model import ModelBehaviour, SimulatedModel

    profile = lookup("kimi-k2.5-mini")
    renderer = ChatRenderer(profile)
    behaviour = ModelBehaviour(length_median=args.length_median, length_sigma=1.0, min_tokens=25, max_tokens=8000)
    model, noise = SimulatedModel(profile, behaviour), random.Random(51)
    out = []
    for row in rows:
        length = model.answer_tokens(renderer.render_ids([{"role": "user", "content": row["input"]}], None)) or 1
        words = max(1, round(length * math.exp(args.reference_noise * noise.gauss(0.0, 1.0))))
        out.append({**row, "output": " ".join(["step"] * words)})
    return out


def one_run(stack: Stack, version: str, **conf: Any) -> dict[str, Any]:
    before = [s.stats() for s in stack.fleet]
    run_id = stack.trigger({"endpoints": [s.url for s in stack.fleet], "version": version, **conf})
    state = stack.wait_for_run(run_id, timeout_s=3600)
    if state != "success":
        raise SystemExit(f"run {version}: {state}: {stack.failures(run_id)}")
    report = stack.xcom(run_id, "report")
    after = [s.stats() for s in stack.fleet]
    first_request = min(g["started_at"] for d in report["datasets"] for g in d["generation"])
    last_answer = max(s["last_end"] for s in after)
    window = last_answer - first_request
    busy = sum(a["busy_slot_seconds"] - b["busy_slot_seconds"] for a, b in zip(after, before, strict=True))
    slots = sum(a["max_running"] for a in after)
    manifests = {d["dataset"]: json.loads(Path(d["manifest"]).read_text()) for d in report["datasets"]}
    published = [datetime.fromisoformat(m["published_at"]).timestamp() for m in manifests.values()]
    return {
        "version": version,
        "answered": sum(a["answered"] - b["answered"] for a, b in zip(after, before, strict=True)),
        "records": {name: m["records"] + m["splits"].get("validation", 0) for name, m in manifests.items()},  # kept
        "window_s": round(window, 1),
        "first_published_s": round(min(published) - first_request, 1),
        "utilization": round(busy / (slots * window), 4),
        "report_server_side": report["fleet_usage"]["server_side"],
        "report_client_side": report["fleet_usage"]["utilization"],
        "manifests": [d["manifest"] for d in report["datasets"]],
        "predictor": sorted({(d.get("length_prediction") or {}).get("predictor", "?") for d in report["datasets"]}),
        "spearman": [(d.get("length_prediction") or {}).get("spearman") for d in report["datasets"]],
    }


def records(manifests: list[str]) -> list[str]:
    """Every training record of the versions, each as canonical JSON, sorted: what the two orders must agree on."""
    from regen import read_training_data

    return sorted(
        json.dumps(row, sort_keys=True)
        for manifest in manifests
        for batch in read_training_data(manifest)
        for row in batch.to_pylist()
    )


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the stack's processes are stopped too
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=1280, help="per dataset (two datasets)")
    parser.add_argument("--shard-size", type=int, default=160)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16, help="running slots per simulated server")
    parser.add_argument("--margin", type=float, default=3.0, help="in_flight over the fleet's slots, as advised")
    parser.add_argument("--length-median", type=int, default=500, help="tokens, of the whole answer")
    parser.add_argument("--decode-ms", type=float, default=4.5, help="per output token")
    parser.add_argument(
        "--reference-noise", type=float, default=None, help="rows carry reference answers, this lognormal sigma off"
    )
    parser.add_argument("--on-policy", type=int, default=0, help="instead: this many on-policy conversations")
    parser.add_argument("--max-turns", type=int, default=8, help="user turns of an on-policy conversation, at most")
    parser.add_argument("--report", type=Path, default=None, help="also write the figures here, as JSON")
    args = parser.parse_args()
    if args.on_policy:
        on_policy(args)
        return
    simulator_args = simulators(args)
    with tempfile.TemporaryDirectory(prefix="regen-bench-drain-") as tmp:
        folder = Path(tmp)
        os.environ["REGEN_CONFIG"] = str(write_config(folder, args, longest_first=args.reference_noise is None))
        stack = Stack(
            folder / "airflow",
            purpose="bench_drain",
            simulators=args.endpoints,
            simulator_args=simulator_args,
            pool_slots=SHARD_TASKS,
        )
        with stack:
            today = one_run(stack, "first")
            print("shards' own order (first version)", json.dumps(today), flush=True)
            write_config(folder, args)  # longest first from here on
            longest = one_run(stack, "nightly", skip_unchanged=False)
            print("longest first (next version)", json.dumps(longest), flush=True)
            runs = [today, longest]
            if args.reference_noise is not None:  # a first version again, in a root of its own
                by_reference = one_run(stack, "first", storage_root=str(folder / "by-reference"))
                print("first version, longest first by the references", json.dumps(by_reference), flush=True)
                runs.append(by_reference)
            kept = [records(run.pop("manifests")) for run in runs]
            same_records = all(k == kept[0] for k in kept)
    expected = {name: args.prompts for name in DATASETS}
    for run in runs:
        if run["records"] != expected:  # (answers: the prompts', and check_server's one probe per endpoint)
            raise SystemExit(f"{run['version']}: {run['records']} records, not one a prompt: {expected}")
    if not same_records:
        raise SystemExit("the versions' training records differ: the order changed the data")
    figures = {
        "args": vars(args) | {"report": str(args.report)},
        "shards_own_order": today,
        "longest_first": longest,
        "utilization_ratio": round(longest["utilization"] / today["utilization"], 3),
        "window_ratio": round(longest["window_s"] / today["window_s"], 3),
        "first_published_ratio": round(longest["first_published_s"] / today["first_published_s"], 3),
    }
    if args.reference_noise is not None:
        by_reference = runs[2]
        figures["first_version_by_reference"] = by_reference
        print(
            f"first version: {by_reference['utilization']:.3f} longest first by the rows' reference answers "
            f"(Spearman {by_reference['spearman']}) vs {today['utilization']:.3f} in the source order"
        )
    print(
        f"utilization {longest['utilization']:.3f} longest first vs {today['utilization']:.3f} in the shards' order "
        f"(ratio {figures['utilization_ratio']}); run window x{figures['window_ratio']}, first dataset published "
        f"x{figures['first_published_ratio']}; both versions: every record once, the same training records"
    )
    save(args.report, figures)


def simulators(args: argparse.Namespace, *extra: str) -> list[str]:
    return [
        *("--max-running", str(args.slots), "--decode-ms-per-token", str(args.decode_ms)),
        *("--length-median", str(args.length_median), "--length-sigma", "1.0"),
        *("--min-tokens", "25", "--max-tokens", "8000", "--context-length", "32768"),  # answers of 50 to 16,000
        "--enable-metrics",  # as docs/operations.md launches SGLang: the run report's server-side figure
        *extra,
    ]


def on_policy(args: argparse.Namespace) -> None:
    """Three first versions of the on-policy dataset: the shards' own order, the longest chain first, and that with
    chain priority."""
    with tempfile.TemporaryDirectory(prefix="regen-bench-drain-") as tmp:
        folder = Path(tmp)
        os.environ["REGEN_CONFIG"] = str(write_config(folder, args, longest_first=False))
        turns = chat_turns(folder)
        stack = Stack(
            folder / "airflow",
            purpose="bench_drain",
            simulators=args.endpoints,
            # a turn as short as its hint; a conversation's history past 32,768 tokens; the waiting queue by priority
            # then arrival (by arrival alone for the runs that send none)
            simulator_args=simulators(
                args, "--length-hint", "--min-tokens", "1", "--context-length", "262144", "--enable-priority-scheduling"
            ),
            pool_slots=SHARD_TASKS,
        )
        with stack:
            own = one_run(stack, "first", storage_root=str(folder / "own-order"))
            print("on-policy, the shards' own order", json.dumps(own), flush=True)
            write_config(folder, args, longest_first=True)
            chains = one_run(stack, "first", storage_root=str(folder / "longest-chain"))
            print("on-policy, the longest chain first", json.dumps(chains), flush=True)
            write_config(folder, args, longest_first=True, chain_priority=True)
            ahead = one_run(stack, "first", storage_root=str(folder / "chain-priority"))
            print("on-policy, the longest chain first, its next turn ahead (chain priority)", json.dumps(ahead))
            kept = [records(run.pop("manifests")) for run in (own, chains, ahead)]
    for run in (own, chains, ahead):
        if run["records"] != {CHATS: turns}:
            raise SystemExit(f"{run['version']}: {run['records']} records, not one a turn: {turns}")
    if not all(k == kept[0] for k in kept):
        raise SystemExit("the versions' training records differ: the order changed the data")
    figures = {
        "args": vars(args) | {"report": str(args.report)},
        "turns": turns,
        "shards_own_order": own,
        "longest_chain_first": chains,
        "chain_priority": ahead,
        "utilization_ratio": round(chains["utilization"] / own["utilization"], 3),
        "window_ratio": round(chains["window_s"] / own["window_s"], 3),
        "chain_priority_ratio": round(ahead["utilization"] / own["utilization"], 3),
    }
    print(
        f"on-policy first version: utilization {ahead['utilization']:.3f} with chain priority, "
        f"{chains['utilization']:.3f} longest chain first, {own['utilization']:.3f} in the shards' order (ratios "
        f"{figures['chain_priority_ratio']} and {figures['utilization_ratio']}), windows {ahead['window_s']}, "
        f"{chains['window_s']} and {own['window_s']} s; {turns} turns, each once in all three, the same records"
    )
    save(args.report, figures)


if __name__ == "__main__":
    main()
