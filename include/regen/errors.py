"""Failures a retry cannot mend: the orchestrator fails them at once, with their message, instead of backing off."""

from __future__ import annotations

from collections.abc import Iterable


class FinalError(Exception):
    """A wrong input, a wrong fleet, a changed template, a dataset that cannot complete yet: the same attempt again
    would fail the same way. Transient faults (a connection, a timeout, a 5xx) are never FinalErrors."""


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`; did you mean 'turns'?` for a name close to a known one (a typo), else ''."""
    import difflib

    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
