"""Both backends behave the same; S3 goes through boto3 over HTTP to a real S3 API on loopback."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from regen.storage import (
    Changed,
    KeyExists,
    LocalStorage,
    S3Storage,
    Storage,
    check_writable,
    is_not_found,
    open_storage,
)
from tests.conftest import local_or_s3


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return local_or_s3(request, tmp_path, "some/prefix")


def test_round_trip_list_and_checksums(storage: Storage, tmp_path: Path) -> None:
    assert not storage.exists("a/b.json")
    digest = storage.put_bytes("a/b.json", b'{"x": 1}')
    assert digest == hashlib.sha256(b'{"x": 1}').hexdigest()
    assert storage.exists("a/b.json") and storage.get_bytes("a/b.json") == b'{"x": 1}'
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 40_000)  # 10 MB: a multipart upload on S3
    assert storage.put_file("a/c/big.bin", big) == hashlib.sha256(big.read_bytes()).hexdigest()
    back = tmp_path / "back.bin"
    storage.get_file("a/c/big.bin", back)
    assert back.read_bytes() == big.read_bytes()
    assert storage.list_keys("a/") == ["a/b.json", "a/c/big.bin"]
    storage.delete("a/b.json")
    assert storage.list_keys("a/") == ["a/c/big.bin"]


def test_of_writers_creating_one_key_at_once_exactly_one_wins(storage: Storage) -> None:
    """`create` is the manifest's write: If-None-Match on S3, a link that cannot replace a file locally. Sixteen
    threads create one key with their own bytes at once; one succeeds, every other is told, and the key holds
    the winner's bytes whole."""
    from concurrent.futures import ThreadPoolExecutor

    def attempt(i: int) -> int | None:
        try:
            storage.create("v/manifest.json", f"writer {i} ".encode() * 1000)
        except KeyExists:
            return None
        return i

    with ThreadPoolExecutor(16) as pool:
        winners = [i for i in pool.map(attempt, range(16)) if i is not None]
    assert len(winners) == 1
    assert storage.get_bytes("v/manifest.json") == f"writer {winners[0]} ".encode() * 1000
    with pytest.raises(KeyExists):
        storage.create("v/manifest.json", b"late")
    assert storage.list_keys("v/") == ["v/manifest.json"]  # no temporary file left behind


def test_a_listing_gives_each_file_its_size_and_time(storage: Storage) -> None:
    """What the Drafter data page reads a version's shards from: one listing, no request per key."""
    import time

    before = time.time()
    storage.put_bytes("v/reports/shard-00000.json", b"{}")
    storage.put_bytes("v/raw/shard-00001/progress.json", b'{"done": 3}')
    storage.put_bytes("v/raw/shard-00001/part-00000.jsonl", b"")
    storage.put_bytes("w/manifest.json", b"not under v/")
    listed = storage.list_objects("v/")
    assert [(o.key, o.size) for o in listed] == [
        ("v/raw/shard-00001/part-00000.jsonl", 0),
        ("v/raw/shard-00001/progress.json", 11),
        ("v/reports/shard-00000.json", 2),
    ]
    # S3's LastModified has whole seconds; a local file's mtime the file system's resolution
    assert all(before - 2 <= o.mtime <= time.time() + 1 for o in listed)
    assert storage.list_objects("nothing/") == []


def test_reading_the_start_of_a_file_takes_no_more(storage: Storage) -> None:
    storage.put_bytes("v/big.json", b"0123456789" * 1000)
    storage.put_bytes("v/empty.json", b"")
    ranges: list[bytes | None] = []
    if isinstance(storage, S3Storage):  # one ranged GET: the object is never sent whole
        storage.client.meta.events.register(
            "before-send.s3.GetObject", lambda request, **_: ranges.append(request.headers.get("Range"))
        )
    assert storage.read_start("v/big.json", 11) == b"01234567890"
    assert ranges == ([b"bytes=0-10"] if isinstance(storage, S3Storage) else [])
    assert storage.read_start("v/big.json", 20_000) == b"0123456789" * 1000
    assert storage.read_start("v/empty.json", 5) == b""
    with pytest.raises(Exception) as missing:
        storage.read_start("v/missing.json", 5)
    assert is_not_found(missing.value)


def test_keys_cannot_escape_the_root(storage: Storage) -> None:
    with pytest.raises(ValueError, match="escapes"):
        storage.put_bytes("../outside", b"x")


def test_open_storage_parses_roots(tmp_path: Path) -> None:
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)
    s3 = open_storage("s3://bucket/pre/fix", s3_client=object())
    assert isinstance(s3, S3Storage) and s3.uri("k") == "s3://bucket/pre/fix/k"
    with pytest.raises(ValueError, match="only s3://bucket/prefix and local directories"):
        open_storage("gs://bucket/x")


@pytest.mark.parametrize(
    "profile,dataset,version",
    [
        ("kimi-k2.5", "..", "v1"),
        ("kimi-k2.5", "B1", "../v1"),
        ("/abs", "B1", "v1"),
        ("kimi-k2.5", "B1/x", "v1"),
        ("kimi-k2.5", "B1", ""),
        ("kimi-k2.5", ".hidden", "v1"),
    ],
)
def test_a_location_whose_names_could_leave_the_root_is_refused(profile: str, dataset: str, version: str) -> None:
    from regen.layout import DatasetLocation

    with pytest.raises(ValueError, match="cannot name a storage folder"):
        DatasetLocation("s3://bucket/root", profile, dataset, version)


def test_local_files_honour_the_umask_and_deletes_leave_no_empty_folder(tmp_path: Path) -> None:
    """Published data is readable by another user or a trainer's container as the umask allows (not mkstemp's
    0600), and a folder emptied by deletes (a shard's checkpoints) goes with its last file."""
    import os
    import stat

    storage = LocalStorage(tmp_path / "root")
    umask = os.umask(0)
    os.umask(umask)
    storage.put_bytes("v/train/a.parquet", b"a")
    storage.create("v/manifest.json", b"{}")
    for key in ("v/train/a.parquet", "v/manifest.json"):
        assert stat.S_IMODE(Path(storage.uri(key)).stat().st_mode) == 0o666 & ~umask
    storage.put_bytes("v/raw/shard-00000/part-0", b"p")
    storage.put_bytes("v/raw/shard-00000/progress.json", b"{}")
    storage.delete("v/raw/shard-00000/part-0")
    assert (tmp_path / "root" / "v" / "raw" / "shard-00000").is_dir()  # not empty yet
    storage.delete("v/raw/shard-00000/progress.json")
    assert not (tmp_path / "root" / "v" / "raw").exists() and (tmp_path / "root" / "v" / "train").is_dir()
    assert (tmp_path / "root").is_dir()  # never the root itself


def _killed_mid_write(storage: LocalStorage, key: str) -> None:
    """A writer SIGKILLed after its temporary file was written and before its rename (a task killed mid-write)."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:
        try:
            os.replace = lambda *_: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[assignment]
            storage.put_bytes(key, b"half of a shard")
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


def test_what_a_writer_killed_mid_write_left_is_removed_and_a_live_writer_s_is_kept(tmp_path: Path) -> None:
    """A killed writer's temporary file is invisible to listings but stays on disk until removed: named by its
    process, it goes once that process is gone. Kept: a live writer's (this process's), one of another host's
    writer or of a writer that named no process, until untouched for an hour; then they go too."""
    import os
    import time

    from regen.storage import local

    storage = LocalStorage(tmp_path / "root")
    storage.put_bytes("v/train/a.parquet", b"a")
    _killed_mid_write(storage, "v/train/b.parquet")
    [left] = (tmp_path / "root" / "v" / "train").glob(".tmp-*")
    assert storage.list_keys("v") == ["v/train/a.parquet"]
    folder = tmp_path / "root" / "v" / "raw"
    folder.mkdir()
    live, elsewhere, unnamed = (
        folder / f".tmp-{os.getpid()}-{local._HOST}-x1",
        folder / ".tmp-1-other-x2",
        folder / ".tmp-x3",
    )
    for path in (live, elsewhere, unnamed):
        path.write_bytes(b"being written")
    (tmp_path / "root" / ".tmp-1-beside-x4").write_bytes(b"")  # outside the prefix
    assert storage.remove_stale_temporaries("v") == [left.relative_to(tmp_path / "root").as_posix()]
    assert not left.exists() and live.exists() and elsewhere.exists() and unnamed.exists()
    an_hour_ago = time.time() - local.STALE_TEMPORARY_S - 1
    for path in (elsewhere, unnamed):
        os.utime(path, (an_hour_ago, an_hour_ago))
    assert storage.remove_stale_temporaries("v", recursive=False) == []  # only v/'s own files
    assert storage.remove_stale_temporaries("v") == ["v/raw/.tmp-1-other-x2", "v/raw/.tmp-x3"]
    assert live.exists() and storage.list_keys("") == ["v/train/a.parquet"]


def test_a_conditional_replace_or_delete_acts_only_on_what_was_read(storage: Storage) -> None:
    """`replace` and `delete_if` take the tag `get_tagged` gave (S3's ETag, sent as If-Match; locally the file's
    sha256, compared under the folder's lock): a change made since, or a key gone since, is Changed, and the
    object is left as the other writer made it."""
    storage.create("v/writer.json", b"first")
    data, tag = storage.get_tagged("v/writer.json")
    assert data == b"first"
    storage.replace("v/writer.json", b"second", tag)
    with pytest.raises(Changed):
        storage.replace("v/writer.json", b"stale", tag)  # the tag of what is no longer there
    with pytest.raises(Changed):
        storage.delete_if("v/writer.json", tag)
    assert storage.get_bytes("v/writer.json") == b"second"
    _, tag = storage.get_tagged("v/writer.json")
    storage.delete_if("v/writer.json", tag)
    assert not storage.exists("v/writer.json") and storage.list_keys("v/") == []
    with pytest.raises(Changed):
        storage.replace("v/writer.json", b"gone", tag)
    with pytest.raises(Changed):
        storage.delete_if("v/writer.json", tag)
    assert not storage.exists("v/writer.json")


def test_of_writers_replacing_what_they_read_at_once_exactly_one_wins(tmp_path: Path) -> None:
    """Sixteen threads read one file and replace it at once, each with its own bytes, 20 rounds: each round exactly
    one replaces it, and the file holds that writer's bytes whole."""
    from concurrent.futures import ThreadPoolExecutor

    storage = LocalStorage(tmp_path / "root")
    storage.put_bytes("v/latest.json", b"round -1")
    for round_ in range(20):
        _, tag = storage.get_tagged("v/latest.json")
        barrier = threading.Barrier(16)

        def attempt(i: int, tag: str = tag, round_: int = round_, barrier: threading.Barrier = barrier) -> int | None:
            barrier.wait()
            try:
                storage.replace("v/latest.json", f"round {round_} writer {i} ".encode() * 500, tag)
            except Changed:
                return None
            return i

        with ThreadPoolExecutor(16) as pool:
            winners = [i for i in pool.map(attempt, range(16)) if i is not None]
        assert len(winners) == 1, (round_, winners)
        assert storage.get_bytes("v/latest.json") == f"round {round_} writer {winners[0]} ".encode() * 500
    assert storage.list_keys("v/") == ["v/latest.json"]  # no temporary file left behind


def test_a_local_create_whose_link_landed_but_was_reported_as_existing_is_its_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS a LINK whose reply is lost is sent again and answered EEXIST by the link it made itself (open(2):
    check the staged file is the one now in place). Its writer succeeds; another writer is still refused."""
    import os

    import regen.storage.local as local

    storage = LocalStorage(tmp_path / "root")
    real_link = os.link

    def link_then_lose_the_reply(src: str, dst: Path) -> None:
        real_link(src, dst)
        raise FileExistsError(17, "File exists", str(dst))

    monkeypatch.setattr(local.os, "link", link_then_lose_the_reply)
    assert storage.create("v/manifest.json", b"mine") == hashlib.sha256(b"mine").hexdigest()
    monkeypatch.setattr(local.os, "link", real_link)
    with pytest.raises(KeyExists):
        storage.create("v/manifest.json", b"theirs")
    assert storage.get_bytes("v/manifest.json") == b"mine" and storage.list_keys("v/") == ["v/manifest.json"]


def test_a_stamp_changes_when_a_file_is_written_again_with_other_bytes(storage: Storage) -> None:
    """What publish compares with what the verifier read, without reading the file again: size and S3's ETag, or a
    local file's inode and time."""
    storage.put_bytes("v/train/a.parquet", b"1234")
    size, tag = storage.stamp("v/train/a.parquet")
    assert size == 4 and storage.stamp("v/train/a.parquet") == (size, tag)
    storage.put_bytes("v/train/a.parquet", b"4321")
    assert storage.stamp("v/train/a.parquet")[0] == 4 and storage.stamp("v/train/a.parquet")[1] != tag
    with pytest.raises(Exception) as missing:
        storage.stamp("v/train/missing.parquet")
    assert is_not_found(missing.value)


def test_a_local_root_without_hard_links_or_flock_or_whose_creates_overwrite_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plan's probe: a file system that refuses links or locks fails in seconds naming what it lacks, not every task
    after plan with a raw error; a store whose create overwrites is named too."""
    import errno
    import fcntl

    import regen.storage.local as local

    storage = LocalStorage(tmp_path / "root")
    check_writable(storage, "probe")

    def refused(*args: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    for module, name in ((local.os, "link"), (fcntl, "flock")):
        with monkeypatch.context() as patched:
            patched.setattr(module, name, refused)
            with pytest.raises(
                PermissionError, match=r"conditional writes fail \(.*Operation not permitted\).*hard links"
            ):
                check_writable(storage, "probe")

    class Overwriting(LocalStorage):
        def create(self, key: str, data: bytes) -> str:
            return self.put_bytes(key, data)

    with pytest.raises(PermissionError, match=r"a create over an existing key replaced it"):
        check_writable(Overwriting(tmp_path / "root"), "probe")
    assert storage.list_keys("") == []


@pytest.mark.parametrize("failing", range(1, 7), ids=lambda k: f"write-{k}")
def test_plan_s_probe_leaves_a_dropped_connection_to_the_retry_not_to_the_settings(
    tmp_path: Path, failing: int
) -> None:
    """A connection dropped on any write of the probe (the plain write, the delete, the conditional create, replace
    and delete) is a fault of the moment: it is raised as it is, for plan's retry, never reported as a storage root
    that takes no writes or lacks conditional writes (a setting to fix, with no retry)."""
    writes = 0

    class Dropping(LocalStorage):
        def _drop(self) -> None:
            nonlocal writes
            writes += 1
            if writes == failing:
                raise ConnectionResetError(104, "Connection reset by peer")

        def put_bytes(self, key: str, data: bytes) -> str:
            self._drop()
            return super().put_bytes(key, data)

        def create(self, key: str, data: bytes) -> str:
            self._drop()
            return super().create(key, data)

        def replace(self, key: str, data: bytes, tag: str) -> str:
            self._drop()
            return super().replace(key, data, tag)

        def delete(self, key: str) -> None:
            self._drop()
            super().delete(key)

    with pytest.raises(ConnectionResetError):
        check_writable(Dropping(tmp_path / "root"), "probe")
