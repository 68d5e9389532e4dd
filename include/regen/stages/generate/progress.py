"""A generating shard's numbers: what its progress lines log, what the UI reads beside its checkpoints, and its
GenerationReport."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from regen.endpoints import redact_url
from regen.hints import Hints
from regen.manifest import GenerationReport, ShardManifest
from regen.metrics import current as metrics
from regen.sglang.client import Generation, SGLangClient

log = logging.getLogger(__name__)


@dataclass
class EndpointSeries:
    """A shard's live series at one endpoint (regen.metrics)."""

    answers: Any
    output_tokens: Any
    prompt_tokens: Any
    slot_seconds: Any
    request_seconds: Any
    requests: dict[str, Any] = field(default_factory=dict)  # by outcome


class Progress:
    """The numbers behind the progress lines and the shard's GenerationReport."""

    def __init__(self, shard: ShardManifest, total: int, already: int) -> None:
        self.shard, self.total, self.done, self.already = shard, total, already, already
        self.started_at, self.started = time.time(), time.monotonic()
        self.answered = self.output_tokens = self.prompt_tokens = self.cached_tokens = 0
        self.request_seconds = self.slot_seconds = 0.0
        self.slot_timed = 0
        self.hints = Hints()  # the task's hints (regen.hints): those that failed go into its report
        self.metrics, self.dataset = metrics(), shard.location.dataset
        self.settled = self.metrics.settled.labels(self.dataset)
        self.in_flight = self.metrics.in_flight.labels(self.dataset)
        self.settled.inc(already)
        self._series: dict[str, EndpointSeries] = {}

    def answer(self, generation: Generation) -> None:
        self.settle()
        self.answered += 1
        output = len(generation.output_ids)
        prompt = int(generation.meta_info.get("prompt_tokens") or 0)
        self.output_tokens += output
        self.prompt_tokens += prompt
        self.cached_tokens += int(generation.meta_info.get("cached_tokens") or 0)
        held = slot_seconds(generation.meta_info)
        if held is not None:
            self.slot_seconds += held
            self.slot_timed += 1
        series = self.series(generation.endpoint)
        series.answers.inc()
        series.output_tokens.inc(output)
        series.prompt_tokens.inc(prompt)
        if held is not None:
            series.slot_seconds.inc(held)

    def settle(self) -> None:
        """One more of the shard's answers answered or rejected."""
        self.done += 1
        self.settled.inc()

    def request(self, endpoint: str, outcome: str, seconds: float) -> None:
        """One /generate attempt (SGLangClient's observer)."""
        series = self.series(endpoint)
        if outcome not in series.requests:
            series.requests[outcome] = self.metrics.requests.labels(self.dataset, redact_url(endpoint), outcome)
        series.requests[outcome].inc()
        series.request_seconds.inc(seconds)

    def series(self, endpoint: str) -> EndpointSeries:
        """The shard's series at an endpoint, looked up once: a label lookup costs more than the increment."""
        if endpoint not in self._series:
            m, where = self.metrics, (self.dataset, redact_url(endpoint))
            self._series[endpoint] = EndpointSeries(
                m.answers.labels(*where),
                m.output_tokens.labels(*where),
                m.prompt_tokens.labels(*where),
                m.slot_seconds.labels(*where),
                m.request_seconds.labels(*where),
            )
        return self._series[endpoint]

    def log_line(self, client: SGLangClient) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.answered / elapsed
        eta = (self.total - self.done) / rate if rate else float("inf")
        log.info(
            "%s %s: %d/%d done, %d in flight, %.2f req/s, %.0f output tok/s, retries %s, ejections %d, ETA %.0fs",
            self.shard.location.dataset,
            self.shard.name,
            self.done,
            self.total,
            client.pool.in_flight,
            rate,
            self.output_tokens / elapsed,
            dict(client.stats.retries_by_cause),
            client.pool.ejections,
            eta,
        )

    def status(self, client: SGLangClient, concurrency: int, flushed: int) -> dict[str, Any]:
        """The shard's numbers as the UI shows them; `done` counts only what is checkpointed."""
        return {
            "total": self.total,
            "done": self.already + flushed,
            "answered": self.answered,
            "started_at": self.started_at,
            "updated_at": time.time(),
            "in_flight": client.pool.in_flight,
            "concurrency": concurrency,
            "requests": client.stats.requests,
            "retries_by_cause": dict(client.stats.retries_by_cause),
        }

    def report(self, client: SGLangClient) -> GenerationReport:
        return GenerationReport(
            started_at=self.started_at,
            finished_at=time.time(),
            requests=client.stats.requests,
            answered=self.answered,
            request_seconds=round(client.stats.request_seconds, 3),
            output_tokens=self.output_tokens,
            retries_by_cause=dict(client.stats.retries_by_cause),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            ejections=client.pool.ejections,
            slot_seconds=round(self.slot_seconds, 3),
            slot_timed=self.slot_timed,
            hints_off=dict(self.hints.failed),
        )


def slot_seconds(meta_info: dict[str, Any]) -> float | None:
    """How long the answer held a running slot, as its server measured: from receipt to finish (e2e_latency) less
    the wait for a slot (queue_time, in SGLang's meta_info only with --enable-metrics). None when it did not say."""
    total, queued = meta_info.get("e2e_latency"), meta_info.get("queue_time")
    if not isinstance(total, int | float) or not isinstance(queued, int | float):
        return None
    return max(0.0, float(total) - float(queued))
