"""How well a version's send order predicted its answers: each sample's expected length (prepare's `expected_tokens`:
the last version's answer, another profile's, or the row's reference answer) against the answer it got, as the
Spearman rank correlation (the order is what longest first uses, not the lengths)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranked = np.empty(len(values), np.float64)
    ranked[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranked)
    return (sums / counts)[inverse]


def spearman(predicted: np.ndarray, actual: np.ndarray) -> float | None:
    """Spearman's rho; None below three pairs or when either side is constant."""
    if len(predicted) < 3:
        return None
    a, b = ranks(predicted), ranks(actual)
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def length_prediction(verdicts: pa.Table, lengths_from: dict[str, Any]) -> dict[str, Any]:
    """`lengths_from`: where prepare took the lengths (regen.pipeline.prepare.lengths_from); with how many answers
    had a prediction (the verdicts' `expected_tokens`, as validate copied it from prompts/) and its rank correlation
    with the answers' output lengths."""
    names = verdicts.column_names
    expected = verdicts.column("expected_tokens").to_pylist() if "expected_tokens" in names else []
    output = verdicts.column("output_len").to_pylist() if expected else []
    pairs = [(e, n) for e, n in zip(expected, output, strict=True) if e is not None]
    rho = spearman(np.array([p for p, _ in pairs]), np.array([n for _, n in pairs])) if pairs else None
    if not pairs and lengths_from.get("predictor") == "reference_answers":  # no row had one: the fit alone
        lengths_from = {"predictor": "none"}
    return {**lengths_from, "answers": verdicts.num_rows, "predicted": len(pairs), "spearman": rho and round(rho, 4)}
