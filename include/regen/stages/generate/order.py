"""The order a shard's samples are sent in: longest expected answer first, sharpened as the answers arrive.

A sample's expected length comes from prepare (regen.stages.prepare.shards): its answer in the dataset's last
version, or its row's reference answer. A first version's references are only a noisy multiple of the target's
answers, and a row may have none; so, as answers come in, a least-squares fit of log(answer length) on log(reference
length) and log(prompt length) (on the prompt length alone for rows without a reference) predicts every sample not
sent yet, which is re-ranked. Refitted each time the answers seen double (from 16): a handful of fits a shard, never
one per answer. A sample whose length the last version gave keeps it (an exact length beats any fit). The order only
changes what the fleet does when, never the data; a fit that cannot be made (too few answers, one length) keeps the
order as it is.
"""

from __future__ import annotations

import numpy as np

from regen.records import ShardPrompts, longest_first_order

FIRST_FIT = 16  # answers before the first fit


class LengthOrder:
    """An iterator of the sample ids to send, shared by a shard's workers (each takes the next); `observe` each
    answer's length as it arrives."""

    def __init__(self, prompts: ShardPrompts, todo: list[str]) -> None:
        self.prompts = prompts
        self.pending = prompts.longest_expected_first(todo)[::-1]  # popped from the end: the longest first
        self.seen: list[tuple[str, int]] = []
        self.next_fit = FIRST_FIT

    def __iter__(self) -> LengthOrder:
        return self

    def __next__(self) -> str:
        if not self.pending:
            raise StopIteration
        return self.pending.pop()

    def __len__(self) -> int:
        return len(self.pending)

    def observe(self, sample_id: str, output_tokens: int) -> None:
        self.seen.append((sample_id, output_tokens))
        if len(self.seen) >= self.next_fit:
            self.next_fit *= 2
            self.refit()

    def refit(self) -> None:
        """Every pending sample predicted from the answers so far, and the pending re-ranked longest first."""
        if not self.pending:
            return
        predicted = fitted_lengths(self.prompts, self.seen, self.pending)
        if predicted is not None:
            order = longest_first_order(predicted)
            self.pending = [self.pending[i] for i in order][::-1]


def _features(prompts: ShardPrompts, sample_id: str) -> tuple[float, float | None]:
    reference = prompts.reference_tokens(sample_id)
    return np.log1p(len(prompts.prompt_ids(sample_id))), None if reference is None else float(np.log1p(reference))


def fitted_lengths(prompts: ShardPrompts, seen: list[tuple[str, int]], pending: list[str]) -> list[int | None] | None:
    """Each pending sample's predicted answer length: its last version's where prepare had one, else the fit's; None
    when no fit can be made."""
    answered = [(_features(prompts, i), np.log1p(n)) for i, n in seen]
    with_reference = [(p, r, y) for (p, r), y in answered if r is not None]
    full = _least_squares([[1.0, p, r] for p, r, _ in with_reference], [y for *_, y in with_reference])
    prompt_only = _least_squares([[1.0, p] for (p, _), _ in answered], [y for _, y in answered])
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
            out.append(int(np.expm1(full @ [1.0, p, r])))
        elif prompt_only is not None:
            out.append(int(np.expm1(prompt_only @ [1.0, p])))
        else:
            out.append(known)
    return out


def _least_squares(x: list[list[float]], y: list[float]) -> np.ndarray | None:
    """The coefficients, or None with too few points or nothing to fit (every point alike)."""
    if len(y) < FIRST_FIT // 2 or np.ptp(y) == 0:
        return None
    matrix = np.asarray(x)
    if np.linalg.matrix_rank(matrix) < matrix.shape[1]:
        return None
    coefficients, *_ = np.linalg.lstsq(matrix, np.asarray(y), rcond=None)
    return coefficients
