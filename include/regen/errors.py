"""Failures a retry cannot mend: the orchestrator fails them at once, with their message, instead of backing off."""

from __future__ import annotations


class FinalError(Exception):
    """A wrong input, a wrong fleet, a changed template, a dataset that cannot complete yet: the same attempt again
    would fail the same way. Transient faults (a connection, a timeout, a 5xx) are never FinalErrors."""
