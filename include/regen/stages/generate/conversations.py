"""On-policy generation: a shard's conversations followed turn by turn, each turn's prompt rendered from the answers
the target gave before it (regen.on_policy reads each answer back as SGLang's chat layer would)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import jinja2

from regen.chat import ChatRenderer
from regen.hints import CHAIN_PRIORITY, Hints
from regen.on_policy import Ended, after_answer, check_resumed, dataset_turns
from regen.reasons import Reason
from regen.records import RawAnswer, ShardPrompts, decode_answer
from regen.samples import sample_of, turn_id
from regen.stages.generate.checkpoints import Checkpoints


class Ask(Protocol):
    """ask(answer id, prompt ids, sampling params, prefer=endpoint, priority=...): the answer, checkpointed, or the
    reason it was rejected (checkpointed with it); `prefer`, the endpoint to ask first; `priority`, the request's
    (None: the run's)."""

    def __call__(
        self,
        answer_id: str,
        prompt_ids: list[int],
        params: dict[str, Any],
        *,
        prefer: str | None = None,
        priority: int | None = None,
    ) -> Awaitable[RawAnswer | Reason]: ...


class Reject(Protocol):
    """reject(answer id, reason, detail, ended_by=...): a turn that will never be asked, checkpointed with why;
    `ended_by`, the turn that ended its conversation (and that turn's rejection reason, when it was rejected)."""

    def __call__(
        self, answer_id: str, reason: Reason, detail: str, *, ended_by: dict[str, str] | None = None
    ) -> Any: ...


@dataclass
class Conversations:
    """An on-policy shard's conversations, each answered turn by turn (regen.on_policy). A worker takes one
    conversation at a time and follows it to its end, so a turn waits only for its own previous turn and the
    conversation's prefix is still in the server's cache; the fleet stays full with many conversations in flight.
    A resumed conversation reads its finished turns from the checkpoints and asks only for the first unfinished
    one: each (conversation, turn) is generated once. With `affinity`, a turn goes first to the endpoint that
    answered the turn before it, whose prefix cache holds the conversation so far (EndpointPool.acquire)."""

    prompts: ShardPrompts
    renderer: ChatRenderer
    done: Checkpoints
    affinity: bool = True
    # a turn's priority from (conversation, turn, its turns): chain priority, where the fleet admits by priority
    priority_of: Callable[[str, int, int], int | None] | None = None
    render_thread: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "regen-render"))

    async def worker(self, queue: Iterator[str], sampling_params: dict[str, Any], ask: Ask, reject: Reject) -> None:
        for sample_id in queue:
            await self.converse(sample_id, sampling_params, ask, reject)

    async def converse(self, sample_id: str, sampling_params: dict[str, Any], ask: Ask, reject: Reject) -> None:
        prompts = self.prompts
        turns = dataset_turns(json.loads(prompts.later(sample_id) or "[]"))
        messages = json.loads(prompts.messages_json(sample_id))
        tools = json.loads(prompts.tools_json(sample_id) or "[]")
        prompt_ids = prompts.prompt_ids(sample_id).tolist()
        endpoint: str | None = None  # the one that answered the previous turn
        for turn, recorded in enumerate(turns, 1):
            answer_id = turn_id(sample_id, turn)
            if turn > 1:
                try:
                    prompt_ids = await asyncio.get_running_loop().run_in_executor(
                        self.render_thread, self.renderer.render_ids, messages, tools or None
                    )
                except (ValueError, jinja2.TemplateError) as e:  # a template refusing this history ends it here
                    ended = Ended(Reason.EARLIER_TURN_UNUSABLE, f"turn {turn}'s prompt does not render: {e}")
                    return self._end(sample_id, turn - 1, len(turns), ended, reject)
            answer: RawAnswer | Reason
            if answer_id in self.done.answers:  # finished by an earlier try: read, never asked again
                answer = decode_answer(self.done.answers[answer_id])
                check_resumed(answer, prompt_ids)
            elif answer_id in self.done.rejected:  # rejected by an earlier try, and not asked again (ask_again)
                answer = Reason.of(self.done.rejected[answer_id]["reason"])
            else:
                params = {**sampling_params, **prompts.sampling(answer_id)}
                priority = self.priority_of(sample_id, turn, len(turns)) if self.priority_of else None
                prefer = endpoint if self.affinity else None
                answer = await ask(answer_id, prompt_ids, params, prefer=prefer, priority=priority)
            if isinstance(answer, Reason):  # its later turns are lost with it: for the fleet's fault, the fleet's
                ended = Ended(Reason.EARLIER_TURN_UNUSABLE, f"it was rejected ({answer.value})")
                return self._end(sample_id, turn, len(turns), ended, reject, cause=answer)
            endpoint = answer.endpoint or endpoint
            if turn == len(turns):
                return
            after = after_answer(answer, prompt_ids, messages, tools, recorded, self.renderer)
            if isinstance(after, Ended):
                return self._end(sample_id, turn, len(turns), after, reject)
            messages = after

    def _end(
        self, sample_id: str, turn: int, turns: int, ended: Ended, reject: Reject, cause: Reason | None = None
    ) -> None:
        """The turns after `turn` rejected with the reason the conversation ended there (those not already), each
        naming that turn and, when it was rejected, its reason (`cause`): regen.fleet_losses counts the later turns
        of a conversation the fleet ended as the fleet's losses."""
        ended_by = {"turn": turn_id(sample_id, turn), **({"reason": cause.value} if cause is not None else {})}
        for later in range(turn + 1, turns + 1):
            answer_id = turn_id(sample_id, later)
            if answer_id not in self.done:
                reject(answer_id, ended.reason, f"turn {turn}: {ended.detail}", ended_by=ended_by)


CHAIN_LEVELS = 9  # SGLang preempts a running request for one more preferred by over 10: never among the run's own
CHAIN_UNIT = 128  # tokens: a level a doubling of the work a conversation has left, from 256 tokens to 64k and more
UNKNOWN_TURN = 512  # tokens a turn counts for when no turn of the shard has a reference answer


def turn_priority(base: int, order: str, tokens_left: int) -> int:
    """A turn's priority on a fleet that admits `order` ("larger" or "smaller") values first: `base` moved towards
    the preferred end by a level for each doubling of the answer tokens its conversation has left from it on (this
    turn's and the later ones', predicted), at most CHAIN_LEVELS. The conversation with the most work left goes
    first, as the longest chain must to end with the rest: its last turn too, ahead of a short conversation's first."""
    level = min(max(int(math.log2(max(tokens_left, 1) / CHAIN_UNIT)), 0), CHAIN_LEVELS)
    return base + level if order == "larger" else base - level


@dataclass(frozen=True)
class ChainWork:
    """Each turn's predicted answer length (`turn_tokens`: the last version's answer to it, else its reference; a
    turn with neither counts as the median of those known, or UNKNOWN_TURN when none is), and what a conversation has
    left from a turn on."""

    predicted: Callable[[str], int | None]
    median: int

    @classmethod
    def of(cls, answer_ids: list[str], turn_tokens: Callable[[str], int | None]) -> ChainWork:
        known = sorted(n for n in map(turn_tokens, answer_ids) if n is not None)
        return cls(turn_tokens, known[len(known) // 2] if known else UNKNOWN_TURN)

    def tokens(self, answer_id: str) -> int:
        return self.median if (n := self.predicted(answer_id)) is None else n

    def left(self, sample_id: str, turn: int, turns: int) -> int:
        return sum(self.tokens(turn_id(sample_id, k)) for k in range(turn, turns + 1))


def chain_priority(
    order: str | None, base: int | None, hints: Hints, prompts: ShardPrompts, todo: list[str]
) -> Callable[[str, int, int], int | None] | None:
    """A turn's priority from the work its conversation has left (turn_priority), on a fleet that admits `order`
    first; None where chain priority is off (no order). A hint: if it fails, the run's own priority (`base`)."""
    if order is None:
        return None
    work, plain = ChainWork.of(todo, prompts.turn_tokens), base or 0

    def priority(sample_id: str, turn: int, turns: int) -> int | None:
        return hints.use(CHAIN_PRIORITY, plain, lambda: turn_priority(plain, order, work.left(sample_id, turn, turns)))

    return priority


def longest_first(todo: list[str], turn_tokens: Callable[[str], int | None] = lambda _: None) -> list[str]:
    """The conversations with unfinished turns (`todo`: those turns), the longest chain of them first: the sum of
    their answers' predicted lengths (`turn_tokens`: a turn's last answer or reference; one with neither counts as the
    median turn's), then the most such turns. A conversation's turns wait on one another, so a long chain started
    late is the shard's tail alone; started first, the short ones fill the fleet around it to the end."""
    remaining: dict[str, list[str]] = {}
    for answer_id in todo:
        remaining.setdefault(sample_of(answer_id), []).append(answer_id)
    chains = ChainWork.of(todo, turn_tokens)  # with no reference at all, every turn alike: the most turns first

    def work(sample_id: str) -> tuple[int, int]:
        turns = remaining[sample_id]
        return sum(map(chains.tokens, turns)), len(turns)

    return sorted(remaining, key=work, reverse=True)
