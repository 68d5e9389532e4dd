"""The drain: whole-run fleet utilization on heavy-tailed answers, today's send order against longest first.

    .venv/bin/python bench/bench_drain.py [--prompts 1280] [--endpoints 4] [--slots 16] [--margin 3]
                                          [--length-median 500] [--decode-ms 4.5] [--report var/bench/drain.json]
    .venv/bin/python bench/bench_drain.py --on-policy 140 --endpoints 2 --shard-size 20 [--max-turns 8]
                                          [--only chain_priority] [--second]
    .venv/bin/python bench/bench_drain.py --on-policy 140 --night 500 --endpoints 2 --shard-size 20 [--chats-last]

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
times lognormal(0, 0.5), at most 6,000 tokens (spelt in the turn for the simulators: `--length-hint`); three first
versions, in roots of their own: the shards' own order, the longest chain of predicted answers first, and that with
`chain_priority` (the simulators admit their waiting queues by priority, as SGLang with
--enable-priority-scheduling); with `--second`, each run's second version, its first made just before (each turn
expected as long as the first's answer to it). With `--night M` too: a mixed night on one fleet, the conversations
beside a single-turn first version of M rows (references: the answers x lognormal(0, 0.5)) and the second version of
another M rows (its first made just before), three times: at `--shard-size` and `--margin`, then at the shard size
and budget that keep 6 requests a slot at the servers while tasks drain (`budget`), without and with chain
priority; the datasets listed in that order, or with `--chats-last` the conversations after both others. Each run
prints, beside what it measured, what the drain model (drain_model.py) predicts for its settings, and where its idle
slot-seconds fell (`timeline`: each tenth of the window, whether requests waited meanwhile, and `last_chain`, the
conversation answered last: when it began, and how long its turns waited, decoded and took between them). Each
holds every answer's record once, the same records.
"""

from __future__ import annotations

import argparse
import itertools
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

import drain_model  # noqa: E402
from report_file import save  # noqa: E402

from regen.run_report import ADVISED_REQUESTS_PER_SLOT  # noqa: E402
from regen.sglang.client import answer_id_of  # noqa: E402
from tools.devstack import Stack  # noqa: E402

DATASETS = ("drain_a", "drain_b")
CHATS = "drain_chat"
NIGHT_FIRST, NIGHT_SECOND = "night_first", "night_second"
SHARD_TASKS = 4


def write_config(
    folder: Path, args: argparse.Namespace, longest_first: bool = True, chain_priority: bool = False
) -> Path:
    if args.on_policy or args.night:
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
    folder: Path,
    args: argparse.Namespace,
    longest_first: bool,
    profile: str,
    chain_priority: bool = False,
    sized: bool = False,
) -> dict[str, Any]:
    """The config's defaults and governance, the same for every dataset the bench makes; `sized`: the shard size and
    in-flight budget `budget` gives for the sized runs, instead of --shard-size and --margin."""
    shard_size, in_flight = budget(args, sized)
    return {
        "defaults": {
            "profile": profile,
            "storage_root": str(folder / "storage"),
            "shard_size": shard_size,
            "in_flight": in_flight,
            "shard_tasks": SHARD_TASKS,
            "tokenize_workers": 1,
            "longest_first": longest_first,
            "chain_priority": chain_priority,
            "sampling": {"max_new_tokens": 16_384, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0},
        },
        # the bench's simulators, and the roots of the first versions run beside the main one
        "governance": {"allowed_endpoints": ["127.0.0.1"], "allowed_storage_roots": [str(folder)]},
    }


def budget(args: argparse.Namespace, sized: bool) -> tuple[int, int]:
    """The shard size and in-flight budget of a run: --shard-size and --margin x the fleet's slots; `sized`, those
    that keep ADVISED_REQUESTS_PER_SLOT at the servers while shard tasks drain (docs/scaling.md), each task's share
    of in_flight its whole shard."""
    if not sized:
        return args.shard_size, int(args.endpoints * args.slots * args.margin)
    share = -(-ADVISED_REQUESTS_PER_SLOT * args.endpoints * args.slots // SHARD_TASKS)
    return share, share * SHARD_TASKS


def write_chat_config(
    folder: Path, args: argparse.Namespace, longest_first: bool, chain_priority: bool, sized: bool = False
) -> Path:
    """One dataset of `--on-policy` conversations (seeded: the same every run; with `--night`, the night's three
    datasets); an answer's length is spelt in its user message, for the simulators' --length-hint."""
    from importlib.resources import files

    import yaml

    datasets = chat_datasets(args)
    for name, rows in datasets.items():
        (folder / f"{name}.jsonl").write_text(
            "".join(json.dumps(hinted_row(name, i, r)) + "\n" for i, r in enumerate(rows))
        )
    builtin = yaml.safe_load(files("regen").joinpath("builtin_profiles.yaml").read_text())["kimi-k2.5-mini"]
    config = {
        **deployment(folder, args, longest_first, "drain-chat", chain_priority, sized),
        "profiles": {"drain-chat": {**builtin, "max_prompt_tokens": 200_000}},  # every turn's history fits
        "datasets": {
            name: {"paths": [f"{name}.jsonl"], "format": "openai_messages"}
            | ({"turns": "on_policy"} if name == CHATS else {})
            for name in datasets
        },
    }
    path = folder / "regen.yaml"
    path.write_text(json.dumps(config))
    return path


def chat_datasets(args: argparse.Namespace) -> dict[str, list[list[tuple[int, int]]]]:
    """The on-policy conversations, each row its turns' (reference tokens, answer tokens); with `--night`, beside
    single-turn rows whose references are the answers x lognormal(0, 0.5) (a first version) and single-turn rows of
    a dataset that `--night` answers once before the night (its second version, ordered by the first's)."""
    chats = {CHATS: drain_model.conversations(args.on_policy, args.max_turns, args.length_median)}
    if not args.night:
        return chats
    first = {NIGHT_FIRST: drain_model.single_turn(args.night, 0.5, args.length_median, seed=51)}
    second = {NIGHT_SECOND: drain_model.single_turn(args.night, None, args.length_median, seed=52)}
    return {**first, **second, **chats} if args.chats_last else {**first, **chats, **second}


def hinted_row(name: str, i: int, turns: list[tuple[int, int]]) -> dict[str, Any]:
    """A conversation whose every user turn spells its answer's length; a reference answer of the reference's
    length after it, but for a second version's rows (their first version is the reference)."""
    messages: list[dict[str, str]] = []
    for k, (reference, answer) in enumerate(turns):
        messages.append({"role": "user", "content": f"{name} {i}, question {k}. [[answer {answer} tokens]]"})
        if name != NIGHT_SECOND or k + 1 < len(turns):
            messages.append({"role": "assistant", "content": " ".join(["step"] * reference)})
    return {"messages": messages}


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
    recorded = [len(s.records()) for s in stack.fleet]
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
        "report_model": report["fleet_usage"].get("model"),  # the drain model as the run report works it out
        "manifests": [d["manifest"] for d in report["datasets"]],
        "predictor": sorted({(d.get("length_prediction") or {}).get("predictor", "?") for d in report["datasets"]}),
        "spearman": [(d.get("length_prediction") or {}).get("spearman") for d in report["datasets"]],
        "timeline": timeline(
            [
                answer
                for simulator, n in zip(stack.fleet, recorded, strict=True)
                for answer in simulator.records()[n:]
                if answer["received_at"] >= first_request  # not check_server's probe
            ],
            slots,
        ),
    }


def timeline(answers: list[dict[str, Any]], slots: int, tenths: int = 10) -> dict[str, Any]:
    """Where the idle slot-seconds of a run fall, from the simulators' record of each answer (when it arrived, was
    admitted and answered): the utilization in each tenth of the window; the idle share while requests waited at a
    server (none, for a fleet kept busy) and the share with nothing waiting (the client sent too little); and the
    shard tasks (clients: a rid's nonce prefix) that had a request answered, in all and in the last tenth."""
    start, end = min(a["received_at"] for a in answers), max(a["answered_at"] for a in answers)
    width = (end - start) / tenths
    busy = [
        sum(
            max(0.0, min(a["answered_at"], start + (k + 1) * width) - max(a["admitted_at"], start + k * width))
            for a in answers
        )
        for k in range(tenths)
    ]
    # A sweep over the arrivals, admissions and answers: the idle slots, and whether a request waited meanwhile.
    steps = [(a["received_at"], 1, 0) for a in answers] + [(a["admitted_at"], -1, 1) for a in answers]
    steps += [(a["answered_at"], 0, -1) for a in answers]
    idle_waiting = idle_starved = 0.0
    waiting = running = 0
    at = start
    for when, waits, runs in sorted(steps):
        idle = max(0, slots - running) * (when - at)
        if waiting:
            idle_waiting += idle
        else:
            idle_starved += idle
        at, waiting, running = when, waiting + waits, running + runs
    total = slots * (end - start)

    def clients(of: list[dict[str, Any]]) -> int:
        return len({a["rid"].rsplit("-", 2)[1][:8] for a in of})

    # An on-policy turn's next one arrives after the worker rendered the conversation so far: the client's time.
    from regen.samples import sample_of, turn_of

    turns: dict[str, list[tuple[int, float, float, float]]] = {}
    for a in answers:
        answer_id = answer_id_of(a["rid"])
        if (turn := turn_of(answer_id)) is not None:
            turns.setdefault(sample_of(answer_id), []).append(
                (turn, a["received_at"], a["answered_at"], a["admitted_at"])
            )
    gaps = sorted(
        later[1] - earlier[2]
        for chain in turns.values()
        for earlier, later in itertools.pairwise(sorted(chain))
        if later[0] == earlier[0] + 1
    )
    return {
        "last_chain": last_chain(turns, start, end),
        "turn_gap_s": {"median": round(gaps[len(gaps) // 2], 3), "max": round(gaps[-1], 3)} if gaps else None,
        "tenths": [round(b / (slots * width), 3) for b in busy],
        "idle_while_waiting": round(idle_waiting / total, 4),
        "idle_nothing_waiting": round(idle_starved / total, 4),
        "shard_clients": clients(answers),
        "clients_in_last_tenth": clients([a for a in answers if a["answered_at"] >= end - width]),
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
    parser.add_argument(
        "--night", type=int, default=0, help="a mixed night: also two single-turn datasets of this many rows"
    )
    parser.add_argument(
        "--chats-last", action="store_true", help="with --night: the conversations listed after the other datasets"
    )
    parser.add_argument(
        "--second", action="store_true", help="with --on-policy: measure the second version (the first made before)"
    )
    parser.add_argument("--only", action="append", help="with --on-policy: only this of the runs (repeatable)")
    parser.add_argument("--report", type=Path, default=None, help="also write the figures here, as JSON")
    args = parser.parse_args()
    if args.on_policy or args.night:
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


# (name, longest first, chain priority, sized for the fleet): the runs --on-policy and --night make
ON_POLICY_RUNS = [
    ("shards_own_order", False, False, False),
    ("longest_chain_first", True, False, False),
    ("chain_priority", True, True, False),
]
NIGHT_RUNS = [
    ("as_configured", True, False, False),
    ("sized", True, False, True),
    ("sized_chain_priority", True, True, True),
]


def runs_asked(args: argparse.Namespace) -> list[tuple[str, bool, bool, bool]]:
    runs = NIGHT_RUNS if args.night else ON_POLICY_RUNS
    if unknown := set(args.only or ()) - {run[0] for run in runs}:
        raise SystemExit(f"--only {', '.join(sorted(unknown))}: not one of {', '.join(run[0] for run in runs)}")
    return [run for run in runs if not args.only or run[0] in args.only]


def last_chain(turns: dict[str, list[tuple[int, float, float, float]]], start: float, end: float) -> Any:
    """The conversation answered last, the run's critical path: when its first turn arrived, how long its turns
    waited at a server, how long the client took between them, and how long they decoded (seconds)."""
    if not turns:
        return None
    chain = sorted(max(turns.values(), key=lambda chain: max(answered for _, _, answered, _ in chain)))
    return {
        "turns": len(chain),
        "first_arrival_s": round(chain[0][1] - start, 2),
        "waited_s": round(sum(admitted - received for _, received, _, admitted in chain), 2),
        "between_turns_s": round(sum(b[1] - a[2] for a, b in itertools.pairwise(chain)), 2),
        "decoding_s": round(sum(answered - admitted for _, _, answered, admitted in chain), 2),
        "ended_before_end_s": round(end - chain[-1][2], 2),
    }


def report_model(run: dict[str, Any]) -> str:
    """The run report's drain model: fed the answers' lengths, and the lengths the run predicted."""
    model = run.get("report_model") or {}
    return f"{model.get('with_answer_lengths')} for the answers, {model.get('predicted')} predicted"


def on_policy(args: argparse.Namespace) -> None:
    """First versions of the on-policy dataset (`--night`: a mixed night), in roots of their own, each run beside the
    drain model's figure for its settings; every run holds every answer's record once, the same records."""
    with tempfile.TemporaryDirectory(prefix="regen-bench-drain-") as tmp:
        folder = Path(tmp)
        os.environ["REGEN_CONFIG"] = str(write_config(folder, args, longest_first=False))
        datasets = chat_datasets(args)
        stack = Stack(
            folder / "airflow",
            purpose="bench_drain",
            simulators=args.endpoints,
            # an answer as long as its hint; a conversation's history past 32,768 tokens; the waiting queue by
            # priority then arrival (by arrival alone for the runs that send none)
            simulator_args=simulators(
                args, "--length-hint", "--min-tokens", "1", "--context-length", "262144", "--enable-priority-scheduling"
            ),
            pool_slots=SHARD_TASKS,
        )
        runs = {}
        with stack:
            for name, longest_first, chain_priority, sized in runs_asked(args):
                write_chat_config(folder, args, longest_first, chain_priority, sized)
                root = str(folder / name)
                if args.night:  # the third dataset's first version, before the night that makes its second
                    one_run(stack, "prior", storage_root=root, datasets=[NIGHT_SECOND])
                elif args.second:  # the conversations' first version, before the one measured
                    one_run(stack, "prior", storage_root=root)
                measured = "night" if args.night else "second" if args.second else "first"
                run = one_run(stack, measured, storage_root=root, skip_unchanged=False)
                shard_size, in_flight = budget(args, sized)
                settings = drain_model.Settings(
                    shard_size, SHARD_TASKS, in_flight, args.endpoints * args.slots, longest_first, chain_priority
                )
                run["settings"] = {"shard_size": shard_size, "in_flight": in_flight, "chain_priority": chain_priority}
                known = [[[(n, n) for _, n in c] for c in rows] for rows in datasets.values()]  # a second's lengths
                run["model"] = drain_model.drain(known if args.second else list(datasets.values()), settings)
                print(name, json.dumps(run), flush=True)
                runs[name] = run
            kept = [records(run.pop("manifests")) for run in runs.values()]
    expected = {name: sum(len(turns) for turns in rows) for name, rows in datasets.items()}
    for name, run in runs.items():
        if run["records"] != expected:
            raise SystemExit(f"{name}: {run['records']} records, not one an answer: {expected}")
    if not all(k == kept[0] for k in kept):
        raise SystemExit("the runs' training records differ: the order changed the data")
    save(args.report, {"args": vars(args) | {"report": str(args.report)}, "answers": expected, **runs})
    baseline = next(iter(runs.values()))
    for name, run in runs.items():
        print(
            f"{name}: utilization {run['utilization']:.3f} (x{run['utilization'] / baseline['utilization']:.3f}; the "
            f"model: {run['model']['utilization']:.3f}; the run report's: {report_model(run)}), window "
            f"{run['window_s']} s, {json.dumps(run['settings'])}"
        )
    print(f"{sum(expected.values())} answers, each once in every run, the same records")


if __name__ == "__main__":
    main()
