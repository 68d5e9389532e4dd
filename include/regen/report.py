"""Stage 7: the run's summary, and how busy the run kept the fleet."""

from __future__ import annotations

import logging
from typing import Any

from regen.manifest import GenerationReport

log = logging.getLogger(__name__)


def fleet_utilisation(reports: list[GenerationReport], fleet: list[dict[str, Any]]) -> dict[str, Any]:
    """Request-seconds the run kept in flight over the fleet's slot-seconds during generation (capped at 1).

    Client-side: time a request waited in a server's queue counts as busy, so this is an upper bound; the simulator's
    /sim/stats gives the exact server-side figure. Unknown when a server does not report max_running_requests.
    """
    capacity = [e.get("max_running_requests") for e in fleet]
    if not reports or not capacity or not all(isinstance(c, int) and c > 0 for c in capacity):
        return {"utilisation": None, "reason": "no generation in this run, or a server without max_running_requests"}
    slots = sum(c for c in capacity if c)
    window = max(r.finished_at for r in reports) - min(r.started_at for r in reports)
    busy = sum(r.request_seconds for r in reports)
    return {
        "utilisation": min(1.0, busy / (slots * window)) if window > 0 else None,
        "window_s": round(window, 3),
        "request_seconds": round(busy, 3),
        "slots": slots,
        "output_tokens": sum(r.output_tokens for r in reports),
        "requests": sum(r.requests for r in reports),
    }


def log_summary(published: list[dict[str, Any]], missing: list[str], fleet_usage: dict[str, Any]) -> None:
    for p in published:
        if p.get("unchanged"):
            log.info("%s: unchanged since version %s, not regenerated -> %s", p["dataset"], p["version"], p["manifest"])
            continue
        g, v = p["stages"]["generate"], p["stages"]["validate"]
        log.info(
            "%s: %d rows read, %d prompts, %d answered, %d valid (failed: %s), %d training records -> %s",
            p["dataset"],
            p["prepare"]["rows_read"],
            p["prepare"]["kept"],
            g["kept"],
            v["kept"],
            v["dropped_by_reason"] or "none",
            p["records"],
            p["manifest"],
        )
    log.info("fleet: %s", fleet_usage)
    if missing:
        log.error("not published: %s (see the failed tasks; clear them to resume)", ", ".join(missing))
