"""A task's local scratch: tables on its disk for what would otherwise grow with the dataset in its memory (the sample
ids a reader has seen, the last version's answer lengths), and folders that outlive a task killed without its
`finally` (an OOM kill leaves a prepare's spill file of GBs) until the next task on the machine removes them."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

_SCRATCH = re.compile(r"regen-(?P<kind>[a-z-]+?)-(?P<pid>\d+)-[a-z0-9_]+(\.[a-z.]+)?")


def scratch_table(path: Path, schema: str) -> sqlite3.Connection:
    """An SQLite database at `path` holding the table `schema` creates. No journal and no fsync: nothing reads it
    after a crash, the task that retries builds it again."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    db.execute(schema)
    return db


def process_gone(pid: int) -> bool:
    """Whether no process of this pid runs on this machine (one of another user's does: it cannot be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def scratch_prefix(kind: str) -> str:
    """`regen-{kind}-{pid}-`: a scratch path's name says whose it is (`remove_abandoned`)."""
    return f"regen-{kind}-{os.getpid()}-"


@contextlib.contextmanager
def scratch_folder(kind: str) -> Iterator[Path]:
    """A temporary folder named by this process (`scratch_prefix`) and locked (flock) while in use; removed when the
    block ends, or, when the process is killed first, by the next `remove_abandoned` on the machine."""
    with tempfile.TemporaryDirectory(prefix=scratch_prefix(kind)) as folder, locked(folder):
        yield Path(folder)


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """`path` (a folder or a file) held under an exclusive flock, which the kernel drops when its holder dies."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_abandoned(kinds: tuple[str, ...], folder: Path | None = None) -> list[Path]:
    """The scratch paths of `kinds` in `folder` (the system's temporary one) whose process is gone, removed: named
    by a pid no process here has, and not locked (a pid of another namespace sharing the folder still holds its
    lock, so a live task's scratch is never taken). Their paths."""
    base = Path(folder or tempfile.gettempdir())
    removed = []
    for entry in base.iterdir():
        named = _SCRATCH.fullmatch(entry.name)
        if named and named["kind"] in kinds and process_gone(int(named["pid"])) and _remove_unlocked(entry):
            removed.append(entry)
    return removed


def _remove_unlocked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False  # another task removed it first
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False  # its owner is alive (in another pid namespace)
        raise
    try:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)
    return True
