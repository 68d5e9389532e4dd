"""One writer per version: a run claims a dataset version before its tasks write into it, so that two runs of one
version (a second deployment, a `dags test` beside the scheduler, two resumes at once) never write the same keys.

The claim is `{version}/writer.json`, naming the run and when it last renewed the claim. A task of the run renews it
every RENEW_S while it writes; a task of another run is refused while the claim is fresh (`VersionBusy`, at once:
the other run is writing) and takes it over once it is older than EXPIRES_S, which is how a Resume continues the
version of a run that died. A run releases its claims when it publishes the version and when it ends (its report
task), so a Resume of a run that failed need not wait. Creating the claim is conditional (regen.storage `create`),
and a takeover reads the claim back after a pause, so that of two runs taking over one stale claim the later one
holds it and the other is refused.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from regen.errors import FinalError
from regen.layout import DatasetLocation
from regen.storage import KeyExists, Storage, is_not_found

log = logging.getLogger(__name__)

RENEW_S = 30.0
EXPIRES_S = 120.0  # four renewals missed: the run holding it is gone
SETTLE_S = 1.0  # between a takeover and reading the claim back


class VersionBusy(FinalError):
    """Another run is writing this version now."""


def _holder(storage: Storage, key: str) -> tuple[str | None, float]:
    """The run holding the claim and when it renewed it; an unreadable claim counts as long expired."""
    try:
        claim = json.loads(storage.get_bytes(key))
        return str(claim["run_id"]), float(claim["renewed_at"])
    except Exception as e:
        if is_not_found(e) or isinstance(e, (ValueError, KeyError, TypeError)):
            return None, 0.0
        raise


def claim(storage: Storage, location: DatasetLocation, run_id: str, settle_s: float = SETTLE_S) -> None:
    """Take or renew the run's claim on the version; VersionBusy when another run holds a fresh one."""
    key, now = location.writer, time.time()
    body = json.dumps({"run_id": run_id, "renewed_at": now}).encode()
    try:
        storage.create(key, body)
        return
    except KeyExists:
        pass
    holder, renewed_at = _holder(storage, key)
    if holder == run_id:
        storage.put_bytes(key, body)
        return
    age = now - renewed_at
    if age < EXPIRES_S:
        raise _busy(location, holder, age)
    log.warning("%s: taking over the version from run %s, silent for %.0f s", location.prefix, holder, age)
    storage.put_bytes(key, body)
    time.sleep(settle_s)
    holder, renewed_at = _holder(storage, key)
    if holder != run_id:  # another run took it over at the same moment, after this one
        raise _busy(location, holder, time.time() - renewed_at)


def _busy(location: DatasetLocation, holder: str | None, age: float) -> VersionBusy:
    return VersionBusy(
        f"{location.dataset} version {location.version} is being written by run {holder} (its claim was renewed "
        f"{age:.0f} s ago): two runs writing one version would corrupt it. Let that run finish, or trigger with "
        f"another version; if that run is gone, its claim expires {max(EXPIRES_S - age, 0):.0f} s from now and "
        "a run of this version may then take it over"
    )


def release(storage: Storage, location: DatasetLocation, run_id: str) -> None:
    """The run is done writing the version (published, or the run ended): a claim it holds is deleted, so that a
    Resume may continue the version at once."""
    holder, _ = _holder(storage, location.writer)
    if holder == run_id:
        storage.delete(location.writer)


@contextmanager
def held(storage: Storage, location: DatasetLocation, run_id: str) -> Iterator[None]:
    """The claim, renewed in the background while the block writes. A renewal that finds another run holding the
    version (this one went silent too long) fails the block's task when it ends: what it wrote is not published,
    since the manifest is only created by the claim's holder."""
    claim(storage, location, run_id)
    stop, lost = threading.Event(), []

    def renew() -> None:
        while not stop.wait(RENEW_S):
            try:
                claim(storage, location, run_id)
            except VersionBusy as e:
                lost.append(e)
                return
            except Exception as e:  # a storage fault: the next renewal tries again
                log.warning("%s: renewing the claim failed (%r); trying again in %.0f s", location.prefix, e, RENEW_S)

    renewer = threading.Thread(target=renew, name=f"claim-{location.dataset}", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
    if lost:
        raise lost[0]
