"""The order a shard's samples are sent in: longest expected answer first, sharpened as the answers arrive.

A sample's expected length comes from prepare (regen.stages.prepare.shards): its answer in the dataset's last
version, or its row's reference answer. A first version's references are only a noisy multiple of the target's
answers, and a row may have none; so, as answers come in, a least-squares fit of log(answer length) on log(reference
length) and log(prompt length) (on the prompt length alone for rows without a reference) predicts every sample not
sent yet, which is re-ranked. Refitted each time the answers seen double (from 16): a handful of fits a shard, never
one per answer. The fit starts from what the version's shards validated before this one measured (their verdicts'
prompt, expected and answer lengths, `pooled`): a dataset's later shards are ordered by its first ones' answers
from their first request. A sample whose length the last version gave keeps it (an exact length beats any fit). The
order only changes what the fleet does when, never the data; a fit that cannot be made (too few answers, one length)
keeps the order as it is. The fit is ridge-regularised and its predictions clipped to [0, max_new_tokens], so that
near-identical references (capped ones) never make it extrapolate to infinity; and the order is a hint
(regen.hints): whatever fails in it, the rest of the shard is sent in the order it had.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from regen.hints import SEND_ORDER, SHARED_FIT, Hints
from regen.layout import VERDICTS_SUFFIX
from regen.manifest import ShardManifest
from regen.records import ShardPrompts, longest_first_order
from regen.samples import sample_of
from regen.stages.generate.conversations import longest_first
from regen.storage import Storage, read_table

FIRST_FIT = 16  # answers before the first fit
MAX_TOKENS = 2**31 - 1  # the most a prediction says (an int32 column's largest), whatever the fit
# Shrinks each slope by var / (var + RIDGE), var a feature's variance in log length: a feature that hardly varies
# (references all capped at one length) supports no slope, where least squares would divide by its spread.
RIDGE = 1e-4
POOLED_SHARDS = 8  # the version's validated shards a shard's fit starts from: the last ones dealt before it
POOLED_ANSWERS = 4096  # of their answers, at most (the latest)

# An answer as the fit takes it, log1p of: its prompt's length, its reference's (None: none), its own
Observation = tuple[float, float | None, float]


class LengthOrder:
    """An iterator of the sample ids to send, shared by a shard's workers (each takes the next); `observe` each
    answer's length as it arrives. `max_tokens`: the sampling's max_new_tokens, the longest a prediction may be."""

    def __init__(
        self,
        prompts: ShardPrompts,
        todo: list[str],
        hints: Hints | None = None,
        max_tokens: int | None = None,
        pooled: list[Observation] | None = None,
    ) -> None:
        self.prompts, self.hints = prompts, hints or Hints()
        self.max_tokens = min(max_tokens or MAX_TOKENS, MAX_TOKENS)
        first = self.hints.use(SEND_ORDER, todo, prompts.longest_expected_first, todo)
        self.pending = list(reversed(first))  # popped from the end: the longest first
        self.seen: list[tuple[str, int]] = []
        self.pooled = pooled or []
        self.next_fit = FIRST_FIT
        if self.pooled:  # other shards' answers: a fit before this shard's first request
            self.hints.use(SEND_ORDER, None, self.refit)

    def __iter__(self) -> LengthOrder:
        return self

    def __next__(self) -> str:
        if not self.pending:
            raise StopIteration
        return self.pending.pop()

    def __len__(self) -> int:
        return len(self.pending)

    def observe(self, sample_id: str, output_tokens: int) -> None:
        if not self.hints.on(SEND_ORDER):
            return
        self.seen.append((sample_id, output_tokens))
        if len(self.seen) >= self.next_fit:
            self.next_fit *= 2
            self.hints.use(SEND_ORDER, None, self.refit)

    def refit(self) -> None:
        """Every pending sample predicted from the answers so far, and the pending re-ranked longest first; the
        pending are left as they are unless the new order is a permutation of them."""
        if not self.pending:
            return
        predicted = fitted_lengths(self.prompts, self.seen, self.pending, self.max_tokens, self.pooled)
        if predicted is not None:
            order = longest_first_order(predicted)
            if sorted(order) != list(range(len(self.pending))):
                raise ValueError(f"{len(predicted)} predictions for {len(self.pending)} pending samples")
            self.pending = [self.pending[i] for i in order][::-1]


def conversation_order(prompts: ShardPrompts, todo: list[str], hints: Hints) -> list[str]:
    """An on-policy shard's conversations with unfinished turns (`todo`: their turns), the longest chain of
    predicted answers first (conversations.longest_first, a hint); else in the shard's order."""
    return hints.use(SEND_ORDER, list(dict.fromkeys(map(sample_of, todo))), longest_first, todo, prompts.turn_tokens)


def _features(prompts: ShardPrompts, sample_id: str) -> tuple[float, float | None]:
    reference = prompts.reference_tokens(sample_id)
    p = float(np.log1p(len(prompts.prompt_ids(sample_id))))
    return p, None if reference is None else float(np.log1p(max(reference, 0)))


def fitted_lengths(
    prompts: ShardPrompts,
    seen: list[tuple[str, int]],
    pending: list[str],
    max_tokens: int = MAX_TOKENS,
    pooled: list[Observation] | None = None,
) -> list[int | None] | None:
    """Each pending sample's predicted answer length, in [0, max_tokens]: its last version's where prepare had one,
    else the fit's over the answers `seen` and `pooled`; None when no fit can be made."""
    answered = [((p, r), y) for p, r, y in pooled or []]
    answered += [(_features(prompts, i), float(np.log1p(max(n, 0)))) for i, n in seen]
    with_reference = [(p, r, y) for (p, r), y in answered if r is not None]
    full = _least_squares([[p, r] for p, r, _ in with_reference], [y for *_, y in with_reference])
    prompt_only = _least_squares([[p] for (p, _), _ in answered], [y for _, y in answered])
    if full is None and prompt_only is None:
        return None
    out: list[int | None] = []
    for sample_id in pending:
        known = prompts.expected_tokens(sample_id)
        if known is not None and known != prompts.reference_tokens(sample_id):  # the last version's: exact
            out.append(known)
            continue
        p, r = _features(prompts, sample_id)
        if r is not None and full is not None:
            out.append(full.predict([p, r], max_tokens))
        elif prompt_only is not None:
            out.append(prompt_only.predict([p], max_tokens))
        else:
            out.append(known)
    return out


@dataclass(frozen=True)
class Fit:
    """log1p(answer length) = mean_y + (features - mean_x) @ slopes."""

    mean_x: np.ndarray
    mean_y: float
    slopes: np.ndarray

    def predict(self, features: list[float], max_tokens: int) -> int:
        log_length = self.mean_y + float((np.asarray(features) - self.mean_x) @ self.slopes)
        return int(np.expm1(np.clip(log_length, 0.0, np.log1p(max_tokens))))


def _least_squares(x: list[list[float]], y: list[float]) -> Fit | None:
    """The ridge fit on centred features, or None with too few points, nothing to fit (every answer alike) or
    anything not finite."""
    if len(y) < FIRST_FIT // 2 or np.ptp(y) == 0:
        return None
    features, target = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if not (np.isfinite(features).all() and np.isfinite(target).all()):
        return None
    mean_x, mean_y = features.mean(axis=0), float(target.mean())
    centred = features - mean_x
    gram = centred.T @ centred + RIDGE * len(y) * np.eye(features.shape[1])
    slopes = np.linalg.solve(gram, centred.T @ (target - mean_y))  # gram is positive definite: never singular
    return Fit(mean_x, mean_y, slopes) if np.isfinite(slopes).all() else None


def shard_order(
    prompts: ShardPrompts, todo: list[str], hints: Hints, max_tokens: int | None, storage: Storage, shard: ShardManifest
) -> LengthOrder:
    """A single-turn shard's LengthOrder, its fit started from the version's validated shards (`pooled_answers`, a
    hint) unless a sample of it has the last version's length: those measured other answers than the references."""
    last_lengths = any(prompts.expected_tokens(i) not in (None, prompts.reference_tokens(i)) for i in todo)
    pooled = [] if last_lengths else hints.use(SHARED_FIT, [], pooled_answers, storage, shard)
    return LengthOrder(prompts, todo, hints, max_tokens, pooled)


def pooled_answers(storage: Storage, shard: ShardManifest) -> list[Observation]:
    """The answers of the version's last POOLED_SHARDS validated shards dealt before this one, as the fit takes them,
    from their verdicts (prompt length, the length prepare expected: a first version's reference, and the answer's);
    the latest POOLED_ANSWERS of them."""
    prefix = f"{shard.location.prefix}/reports/"
    keys = sorted(k for k in storage.list_keys(prefix) if k.endswith(VERDICTS_SUFFIX) and k < shard.keys.verdicts)
    pooled: list[Observation] = []
    for key in keys[-POOLED_SHARDS:]:
        table = read_table(storage, key, ["prompt_len", "output_len"], optional=("expected_tokens",))
        prompt, output = table.column("prompt_len").to_pylist(), table.column("output_len").to_pylist()
        expected = table.column("expected_tokens").to_pylist() if "expected_tokens" in table.column_names else []
        for row, (p, n) in enumerate(zip(prompt, output, strict=True)):
            r = expected[row] if expected else None
            pooled.append((float(np.log1p(p)), None if r is None else float(np.log1p(max(r, 0))), float(np.log1p(n))))
    return pooled[-POOLED_ANSWERS:]


def longest_work_first(works: list[int | None]) -> list[int]:
    """The positions of `works` (each a shard's longest expected answer, an on-policy conversation's turns together;
    None: unknown), the longest first: the run's order of shard tasks across datasets, so that one dataset's long
    work never starts after another's short work and ends the run alone. Unknown work counts as the median of the
    known (where prepare deals a row of unknown length); equal work keeps its given order."""
    known = sorted(work for work in works if work is not None)
    median = known[len(known) // 2] if known else 0
    return sorted(range(len(works)), key=lambda i: -(median if (work := works[i]) is None else work))
