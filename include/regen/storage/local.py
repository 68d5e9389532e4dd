"""A storage root on a local (or mounted) file system. A file appears whole by an atomic rename of a synced
temporary file beside it; `create` links it into place, which fails if a file of that name exists. A conditional
`replace` or `delete_if` compares and changes the file holding an exclusive lock on its folder (flock, which the kernel
drops when its holder dies: a crashed writer never leaves the folder locked); its tag is the file's sha256.

A writer killed before its rename leaves its temporary file (`.tmp-{pid}-{host}-*`, which listings skip); a run's
delivery removes those of writers that are gone from the version it publishes (`remove_stale_temporaries`)."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from regen.scratch import process_gone
from regen.storage.base import CHUNK, Changed, KeyExists, StoredObject, sha256_file

_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "_"
_TEMPORARY = re.compile(r"\.tmp-(?P<pid>\d+)-(?P<host>[A-Za-z0-9._]+)-[a-z0-9_]+")
# A temporary file untouched this long has no writer (a live one writes it, then renames it): what a writer on
# another host left, whose pid cannot be asked about here, or one named before temporary files named their writer.
STALE_TEMPORARY_S = 3600.0


def _staged(target: Path, chunks: Iterable[bytes]) -> tuple[str, str]:
    """The chunks in a synced temporary file beside the target, with the mode a new file gets: its path, sha256."""
    fd, tmp = _temporary_beside(target)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp, digest.hexdigest()


def _temporary_beside(target: Path) -> tuple[int, str]:
    """A temporary file in the target's folder, made if needed (again, if a delete beside it just removed it empty)."""
    for attempt in range(3):
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            return tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-{_HOST}-", dir=target.parent)
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _abandoned(entry: os.DirEntry[str], now: float) -> bool:
    """A temporary file whose writer is gone: named by a process of this host that no longer runs, or untouched for
    STALE_TEMPORARY_S. A writer at work keeps its own: its pid runs, and it writes the file as it goes."""
    named = _TEMPORARY.fullmatch(entry.name)
    if named and named["host"] == _HOST and process_gone(int(named["pid"])):
        return True
    try:
        return now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMPORARY_S
    except FileNotFoundError:
        return False  # renamed into place (or removed) as it was looked at


def _file_mode() -> int:
    """What a new file gets under the process's umask, as open() gives it (mkstemp would give 0600: only its owner
    could read a published version)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """The folder held under an exclusive flock (threads and processes alike: each open is its own lock). The
    folder is the one at that path still: one removed (left empty by a delete) and made again is locked anew."""
    for _ in range(100):
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise Changed(f"{folder} is gone") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(folder).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield
                return
        finally:
            os.close(fd)  # releases the lock
    raise Changed(f"{folder} keeps being removed and made again")


class LocalStorage:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root_uri = str(self.root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"key {key!r} escapes the storage root")
        return path

    def uri(self, key: str) -> str:
        return str(self._path(key))

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _write_atomically(self, key: str, chunks: Iterable[bytes]) -> str:
        """Written to a temporary file beside the target, synced, then renamed: readers see all or nothing."""
        target = self._path(key)
        tmp, digest = _staged(target, chunks)
        try:
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def put_bytes(self, key: str, data: bytes) -> str:
        return self._write_atomically(key, [data])

    def create(self, key: str, data: bytes) -> str:
        """Written only if the key is not there: the whole file linked into place in one step, which fails when a
        file of that name exists (two writers of one key: exactly one succeeds, the other gets KeyExists)."""
        target = self._path(key)
        tmp, digest = _staged(target, [data])
        try:
            os.link(tmp, target)
        except FileExistsError:
            # On NFS a LINK whose reply was lost is sent again and refused by the link it made: the file in place is
            # then the staged one itself (the check open(2) gives), and this writer's.
            if not _same_file(tmp, target):
                raise KeyExists(f"{target} exists already") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        return digest

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        """The file and its tag (its sha256), for a `replace` or `delete_if` of exactly this content."""
        data = self._path(key).read_bytes()
        return data, hashlib.sha256(data).hexdigest()

    def _unchanged(self, target: Path, tag: str) -> None:
        try:
            current = hashlib.sha256(target.read_bytes()).hexdigest()
        except FileNotFoundError:
            raise Changed(f"{target} is gone") from None
        if current != tag:
            raise Changed(f"{target} changed since it was read")

    def replace(self, key: str, data: bytes, tag: str) -> str:
        """Written only if the file is still the one read with `tag` (`get_tagged`), else Changed: of two writers
        that read one file, exactly one replaces it."""
        target = self._path(key)
        tmp, digest = _staged(target, [data])
        try:
            with _folder_locked(target.parent):
                self._unchanged(target, tag)
                os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return digest

    def delete_if(self, key: str, tag: str) -> None:
        """Deleted only if the file is still the one read with `tag`, else Changed."""
        target = self._path(key)
        with _folder_locked(target.parent):
            self._unchanged(target, tag)
            target.unlink()
        self._prune(target)

    def read_start(self, key: str, size: int) -> bytes:
        """The file's first `size` bytes (all of it when it is shorter): a reader that caps what it takes asks
        for one byte more than its cap, and never holds more."""
        with self._path(key).open("rb") as f:
            return f.read(max(size, 0))

    def put_file(self, key: str, path: Path) -> str:
        with path.open("rb") as src:
            return self._write_atomically(key, iter(lambda: src.read(CHUNK), b""))

    def get_file(self, key: str, path: Path) -> None:
        shutil.copyfile(self._path(key), path)  # streamed: a shard's file need not fit in memory

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")
        )

    def list_objects(self, prefix: str) -> list[StoredObject]:
        """Every file under `prefix` with its size and modification time, sorted by key: one walk of the folder,
        a stat per file from the directory scan (what an S3 listing gives with each key)."""
        base = self._path(prefix) if prefix else self.root
        found: list[StoredObject] = []
        folders = [base] if base.is_dir() else []
        while folders:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
                    elif entry.is_file() and not entry.name.startswith(".tmp-"):
                        stat = entry.stat()
                        key = Path(entry.path).relative_to(self.root).as_posix()
                        found.append(StoredObject(key, stat.st_size, stat.st_mtime))
        if base.is_file():
            stat = base.stat()
            found.append(StoredObject(prefix, stat.st_size, stat.st_mtime))
        return sorted(found)

    def remove_stale_temporaries(self, prefix: str, recursive: bool = True) -> list[str]:
        """The temporary files killed writers left under `prefix` (in its folder alone unless `recursive`), removed:
        their keys. Safe beside writers at work (`_abandoned`)."""
        base = self._path(prefix) if prefix else self.root
        folders, removed, now = [base] if base.is_dir() else [], [], time.time()
        while folders:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders += [Path(entry.path)] if recursive else []
                    elif entry.name.startswith(".tmp-") and _abandoned(entry, now):
                        Path(entry.path).unlink(missing_ok=True)
                        removed.append(Path(entry.path).relative_to(self.root).as_posix())
        return sorted(removed)

    def delete(self, key: str) -> None:
        """The file, and the folders it leaves empty (a shard's checkpoints, once merged), up to the root."""
        path = self._path(key)
        path.unlink(missing_ok=True)
        self._prune(path)

    def _prune(self, path: Path) -> None:
        """The folders a deleted file leaves empty, up to the root."""
        for folder in path.parents:
            if folder == self.root or not folder.is_relative_to(self.root):
                break
            try:
                folder.rmdir()
            except OSError:  # not empty (or gone already): the folders above it are not empty either
                break

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def iter_chunks(self, key: str) -> Iterator[bytes]:
        with self._path(key).open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def open(self, key: str) -> IO[bytes]:
        return self._path(key).open("rb")

    def content_id(self, key: str) -> str:
        """The file's sha256."""
        return sha256_file(self._path(key))

    def stamp(self, key: str) -> tuple[int, str]:
        """The file's size, and its inode and modification time: every write makes a new file (renamed or linked
        into place) at a new time, so a file written again has another stamp, read without reading it."""
        stat = self._path(key).stat()
        return stat.st_size, f"{stat.st_ino}:{stat.st_mtime_ns}"

    def folders(self, prefix: str) -> list[str]:
        """The names of the folders directly under `prefix` (a key ending in `/`), sorted."""
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        with os.scandir(base) as entries:  # the entry's type from the directory itself: no stat per folder
            return sorted(entry.name for entry in entries if entry.is_dir())

    def glob(self, pattern: str) -> list[str]:
        """Keys of the files matching a glob (`**` spans folders), sorted; walks only the folders it must."""
        matches = glob.glob(str(self.root / pattern), recursive=True)
        return sorted(str(Path(m).relative_to(self.root)) for m in matches if Path(m).is_file())
