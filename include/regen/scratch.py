"""Tables on a task's local disk for what would otherwise grow with the dataset in its memory (the sample ids a
reader has seen, the last version's answer lengths)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def scratch_table(path: Path, schema: str) -> sqlite3.Connection:
    """An SQLite database at `path` holding the table `schema` creates. No journal and no fsync: nothing reads it
    after a crash, the task that retries builds it again."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    db.execute(schema)
    return db
