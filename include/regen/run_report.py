"""The run report: the run's summary, how busy it kept the fleet and what it cost, written beside its datasets."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from regen.errors import FinalError
from regen.fleet_losses import SHOWN, read_losses, resume_command
from regen.layout import DatasetLocation, run_report_key
from regen.manifest import GenerationReport
from regen.sglang.parity import sglang_version_warnings
from regen.storage import Storage, get_json

log = logging.getLogger(__name__)


def fleet_utilization(reports: list[GenerationReport], fleet: list[dict[str, Any]]) -> dict[str, Any]:
    """Request-seconds the run kept in flight over the fleet's slot-seconds during generation (capped at 1).

    `utilization` is client-side: time a request waited in a server's queue counts as busy, so it is an upper bound.
    `server_side` is the servers' own: the seconds the answers held a running slot, which SGLang says of each answer
    when it runs with --enable-metrics (None unless every answer said so). Unknown when a server does not report
    max_running_requests.
    """
    slots = fleet_slots(fleet)
    if not reports or slots is None:
        return {"utilization": None, "reason": "no generation in this run, or a server without max_running_requests"}
    window = generation_window(reports)
    busy = sum(r.request_seconds for r in reports)
    held, timed = sum(r.slot_seconds for r in reports), sum(r.slot_timed for r in reports)
    every_answer_timed = timed > 0 and timed == sum(r.answered for r in reports)
    return {
        "utilization": min(1.0, busy / (slots * window)) if window > 0 else None,
        "server_side": round(min(1.0, held / (slots * window)), 4) if window > 0 and every_answer_timed else None,
        "window_s": round(window, 3),
        "request_seconds": round(busy, 3),
        "slots": slots,
        "output_tokens": sum(r.output_tokens for r in reports),
        "requests": sum(r.requests for r in reports),
    }


def fleet_slots(fleet: list[dict[str, Any]]) -> int | None:
    """The fleet's running slots (max_running_requests summed); None unless every endpoint reported them."""
    capacity = [e.get("max_running_requests") for e in fleet]
    if not capacity or not all(isinstance(c, int) and c > 0 for c in capacity):
        return None
    return sum(c for c in capacity if c)


# Requests at the servers per running slot below which a run idles the fleet while its shard tasks finish their last
# answers and conversations (bench/drain_model.py and bench_drain.py: 0.82 to 0.89 at 3 on a small night, 0.97 at 6
# with chain priority; docs/scaling.md).
REQUESTS_PER_SLOT = 3
ADVISED_REQUESTS_PER_SLOT = 6  # what the warning says to set


def sizing_warnings(run: dict[str, Any], fleet: list[dict[str, Any]]) -> list[str]:
    """What in the run's in-flight budget idles the fleet it was checked against: a shard task's share above the
    rows a shard has (a task never holds more requests than its shard has rows, so the rest of its share is never
    used), and fewer requests at the servers than REQUESTS_PER_SLOT a running slot. None where the fleet's slots are
    unknown."""
    slots, share, rows = fleet_slots(fleet), run.get("concurrency"), run.get("shard_size")
    if share is None or rows is None:  # (not a run's spec: nothing to judge)
        return []
    tasks, warnings = run.get("shard_tasks", 1), []
    if rows < share:
        warnings.append(
            f"each of the {tasks} shard tasks may keep {share} requests in flight, but a shard has {rows} rows: a "
            f"task never holds more than its rows, so {share - rows} of its share stay unused; set shard_size to "
            f"{share} or more (docs/scaling.md)"
        )
    held = tasks * min(share, rows)
    if slots is not None and held < REQUESTS_PER_SLOT * slots:
        warnings.append(
            f"the run keeps at most {held} requests at a fleet of {slots} running slots ({held / slots:.1f} a slot): "
            f"while shard tasks finish their last answers the fleet idles; set in_flight to "
            f"{ADVISED_REQUESTS_PER_SLOT * slots} ({ADVISED_REQUESTS_PER_SLOT} a slot, "
            "with chain_priority on a fleet that schedules by priority) and shard_size to at least in_flight / "
            f"shard_tasks (docs/scaling.md)"
        )
    return warnings


def generation_window(reports: list[GenerationReport]) -> float:
    """Seconds from the first request to the last answer, over every shard's tries."""
    return max(r.finished_at for r in reports) - min(r.started_at for r in reports) if reports else 0.0


def fleet_gpus(fleet: list[dict[str, Any]], gpus_per_endpoint: int | None = None) -> int | None:
    """The fleet's GPUs from each endpoint's server info (tp_size x dp_size), or the config's count per server where
    one did not say; None when any stays unknown."""
    counts: list[int] = []
    for endpoint in fleet:
        servers = max(1, len(endpoint.get("workers") or []))  # a router: its workers
        known = endpoint.get("gpus") or (gpus_per_endpoint * servers if gpus_per_endpoint else None)
        if not known:
            return None
        counts.append(int(known))
    return sum(counts) or None


def generation_cost(
    reports: list[GenerationReport], fleet: list[dict[str, Any]], train_tokens: int, cost: dict[str, Any]
) -> dict[str, Any]:
    """Tokens, server time and GPU-hours of generation and, with `cost["gpu_hour_price"]`, what it cost per 1M
    training tokens. A request holds one running slot for its request seconds, and a slot of a fleet with G GPUs and
    S slots costs G/S GPU-seconds per second: `gpu_hours` is what the requests used (client-side time includes
    queueing, so an upper bound); `gpu_hours_window` is the whole fleet over the generation window, what a fleet
    reserved for the run costs. `cost` is the config's defaults.cost."""
    gpus = fleet_gpus(fleet, cost.get("gpus_per_endpoint"))
    slots = fleet_slots(fleet)
    request_seconds = sum(r.request_seconds for r in reports)
    window = generation_window(reports)
    prompt, cached = sum(r.prompt_tokens for r in reports), sum(r.cached_tokens for r in reports)
    used = request_seconds * gpus / slots / 3600 if gpus and slots else None
    price = cost.get("gpu_hour_price")
    spent = round(used * price, 4) if used is not None and price is not None else None
    return {
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "cached_share": round(cached / prompt, 4) if prompt else None,
        "output_tokens": sum(r.output_tokens for r in reports),
        "request_seconds": round(request_seconds, 3),
        "gpus": gpus,
        "slots": slots,
        "gpu_hours": round(used, 6) if used is not None else None,
        "gpu_hours_window": round(gpus * window / 3600, 6) if gpus else None,
        "gpu_hour_price": price,
        "currency": cost.get("currency", "USD"),
        "cost": spent,
        "train_tokens": train_tokens,
        "cost_per_million_train_tokens": round(spent / (train_tokens / 1e6), 4) if spent and train_tokens else None,
    }


def log_summary(published: list[dict[str, Any]], missing: list[str], fleet_usage: dict[str, Any]) -> None:
    for p in published:
        if p.get("unchanged"):
            log.info("%s: unchanged since version %s, not regenerated -> %s", p["dataset"], p["version"], p["manifest"])
            continue
        g, v = p["stages"]["generate"], p["stages"]["validate"]
        log.info(
            "%s: %d rows read, %d prompts, %d answers asked, %d answered (not: %s), %d valid (failed: %s), %d "
            "training records -> %s",
            p["dataset"],
            p["prepare"]["rows_read"],
            p["prepare"]["kept"],
            g["total"],
            g["kept"],
            g["dropped_by_reason"] or "none",
            v["kept"],
            v["dropped_by_reason"] or "none",
            p["records"],
            p["manifest"],
        )
        if prediction := p.get("length_prediction"):
            log.info(
                "%s: send order from %s; predicted lengths ranked against the answers': Spearman %s (%s of %s)",
                p["dataset"],
                prediction.get("predictor"),
                prediction.get("spearman"),
                prediction.get("predicted"),
                prediction.get("answers"),
            )
    log.info("fleet: %s", {k: v for k, v in fleet_usage.items() if k != "model"})
    if (model := fleet_usage.get("model") or {}).get("with_answer_lengths") is not None:
        log.info(
            "fleet utilization %s measured (client-side; %s server-side); the drain model gives %s for these answers "
            "at these settings, %s for the lengths the run predicted (docs/scaling.md)",
            round(fleet_usage["utilization"], 4),
            fleet_usage.get("server_side"),
            model["with_answer_lengths"],
            model.get("predicted"),
        )
    if missing:
        log.error("not published: %s (see the failed tasks; clear them to resume)", ", ".join(missing))


def named_losses(
    storage: Storage, run: dict[str, Any], datasets: list[str], missing: list[str]
) -> list[dict[str, Any]]:
    """Each dataset's answers lost to the fleet, as its version's last publish listed them (regen.fleet_losses): how
    many, the first SHOWN ids, where the full list is and, for a version not published, the Resume that asks them
    again. A published version kept them within max_server_rejected_share."""
    named = []
    for dataset in datasets:
        location = DatasetLocation(storage.root_uri, run["profile"], dataset, run["version"])
        lost = read_losses(storage, location)
        if not lost:
            continue
        entry = {"dataset": dataset, "version": run["version"], "lost": len(lost), "published": dataset not in missing}
        entry |= {"ids": [r["id"] for r in lost[:SHOWN]], "list": storage.uri(location.fleet_losses)}
        if dataset in missing:
            entry["resume"] = resume_command([dataset], run["version"])
        named.append(entry)
        log.log(
            logging.WARNING if dataset in missing else logging.INFO,
            "%s %s: %d answers lost to the fleet%s, e.g. %s; all of them: %s%s",
            dataset,
            run["version"],
            len(lost),
            "" if dataset in missing else " (kept: within max_server_rejected_share)",
            ", ".join(entry["ids"][:5]),
            entry["list"],
            f"; ask them again: {entry['resume']}" if "resume" in entry else "",
        )
    return named


class IncompleteRun(FinalError):
    """Some selected dataset was not published: the run failed, though complete datasets were published."""


def write_run_report(
    storage: Storage,
    run: dict[str, Any],
    datasets: list[str],
    published: list[dict[str, Any]],
    fleet: list[dict[str, Any]],
    cost: dict[str, Any],
    model: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The run's summary: one line per dataset in the log, and a JSON report beside the datasets
    ({profile}/runs/{version}.json). `model`: the drain model's figures from what the run measured
    (regen.stages.generate.drain_model), set beside them as `fleet_usage.model`. Raises IncompleteRun, after writing
    it, when a dataset was not published."""
    missing = sorted(set(datasets) - {p["dataset"] for p in published})
    generations = [GenerationReport.from_dict(g) for p in published for g in p.get("generation", [])]
    fleet_usage = fleet_utilization(generations, fleet)
    train_tokens = sum((p.get("cost") or {}).get("train_tokens", 0) for p in published if not p.get("unchanged"))
    warnings = sglang_version_warnings(fleet) + sizing_warnings(run, fleet)
    if model is not None and fleet_usage["utilization"] is not None:
        try:
            fleet_usage["model"] = model(fleet_usage)
        except Exception as e:  # a figure beside the measured ones: never the report's failure
            warnings.append(f"the drain model's utilization was not worked out ({type(e).__name__}: {e})")
    warnings += [w for p in published for w in p.get("warnings", [])]
    losses = named_losses(storage, run, datasets, missing)
    summary: dict[str, Any] = {
        "run": run,
        "warnings": warnings,
        "fleet": fleet,
        "fleet_usage": fleet_usage,
        "cost": generation_cost(generations, fleet, train_tokens, cost),
        "datasets": [p for p in published if not p.get("unchanged")],
        "unchanged": [p for p in published if p.get("unchanged")],
        "unpublished": missing,
        "fleet_losses": losses,
        **({"resume": resume_command(missing, run["version"])} if missing else {}),
    }
    key = _report_key(storage, run["profile"], run["version"], run["run_id"])
    storage.put_bytes(key, json.dumps(summary, indent=1).encode())
    log_summary(published, missing, fleet_usage)
    for warning in warnings:
        log.warning("%s", warning)
    log.info("run report: %s", storage.uri(key))
    summary["report"] = storage.uri(key)
    if missing:  # a run that did not deliver is red, whatever else it did
        raise IncompleteRun(
            f"not published: {', '.join(missing)}; see their failed tasks, mend what they name and Resume the "
            f"version: {summary['resume']}. Run report: {storage.uri(key)}"
        )
    return summary


def _report_key(storage: Storage, profile: str, version: str, run_id: str) -> str:
    """The version's run report, or, when another run of the version wrote that one (this is a Resume), this run's
    own beside it: the earlier run's report is never written over."""
    key = run_report_key(profile, version)
    if not storage.exists(key):
        return key
    try:
        earlier = get_json(storage, key).get("run", {}).get("run_id")
    except (ValueError, AttributeError):  # not a run report this pipeline wrote: keep it too
        earlier = None
    return key if earlier == run_id else run_report_key(profile, version, run_id)
