"""One writer per version: a run claims a dataset version before its tasks write into it, so that two runs of one
version (a second deployment, a `dags test` beside the scheduler, two resumes at once) never write the same keys.

The claim is `{version}/writer.json`, naming the run, its try (a token its plan made: the tasks of one plan share the
claim, and a run planned again is told apart from tasks of its earlier try still writing) and when it last renewed
the claim. A task of the holder renews it every RENEW_S while it writes; any other writer is refused while the claim
is fresh (`VersionBusy`, at once: the other run is writing) and takes it over once it is older than EXPIRES_S, which
is how a Resume continues the version of a run that died. A run releases its claims when it publishes the version
and when it ends (its report task), so a Resume of a run that failed need not wait.

Every change is conditional on what was read (regen.storage `create`, `replace` and `delete_if`: If-None-Match and
If-Match on the ETag on S3, a link and a locked compare-and-rename locally): of two writers acting on one claim
exactly one succeeds, the other reads it again and decides again, so exactly one holder exists at any instant.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from regen.errors import FinalError
from regen.layout import DatasetLocation
from regen.storage import Changed, KeyExists, Storage, is_not_found

log = logging.getLogger(__name__)

RENEW_S = 30.0
EXPIRES_S = 120.0  # four renewals missed: the run holding it is gone
# A claim this try renewed less than this share of RENEW_S ago is left as it is: a run's shard tasks starting together
# do not queue on one key. (tools/crash_points sets it to 0: a task replayed from a restored root finds the claim old.)
FRESH_SHARE = 1 / 6
ROUNDS = 20  # reads of a claim that keeps changing under one claimant before it gives up


class VersionBusy(FinalError):
    """Another run (or another try of this run) is writing this version now."""


class Holder(NamedTuple):
    run_id: str | None
    token: str
    renewed_at: float


def _read(storage: Storage, key: str) -> tuple[Holder, str] | None:
    """The claim's holder and the tag its change is conditional on; None when there is no claim. An unreadable
    claim counts as long expired."""
    try:
        data, tag = storage.get_tagged(key)
    except Exception as e:
        if is_not_found(e):
            return None
        raise
    try:
        claim = json.loads(data)
        return Holder(str(claim["run_id"]), str(claim.get("token", "")), float(claim["renewed_at"])), tag
    except (ValueError, KeyError, TypeError):
        return Holder(None, "", 0.0), tag


def claim(storage: Storage, location: DatasetLocation, run_id: str, token: str = "", renewing: bool = False) -> None:
    """Take or renew the claim of this run's try (`token`) on the version; VersionBusy when another holds a fresh
    one, or when a claim being renewed (`renewing`) is gone: its run released it (published, or ended), and
    another run may have taken the version since, so the renewer must not write on as if it still held it."""
    key = location.writer
    for _ in range(ROUNDS):
        now = time.time()
        body = json.dumps({"run_id": run_id, "token": token, "renewed_at": now}).encode()
        found = _read(storage, key)
        try:
            if found is None and renewing:
                raise VersionBusy(
                    f"{location.prefix}: the claim this task renews was released while it still wrote (its run "
                    "published the version or ended); what it writes now is not published"
                )
            if found is None:
                storage.create(key, body)
                return
            holder, tag = found
            if (holder.run_id, holder.token) == (run_id, token) and now - holder.renewed_at < RENEW_S * FRESH_SHARE:
                return  # another task of this try renewed it just now: a run's shard tasks do not queue on one key
            if (holder.run_id, holder.token) != (run_id, token):
                age = now - holder.renewed_at
                if age < EXPIRES_S:
                    raise _busy(location, holder, run_id, age)
                log.warning(
                    "%s: taking over the version from run %s, silent for %.0f s", location.prefix, holder.run_id, age
                )
            storage.replace(key, body, tag)
            return
        except (KeyExists, Changed):
            continue  # another writer changed the claim since it was read: read it again
    raise VersionBusy(f"{location.prefix}: its claim kept changing under {ROUNDS} tries to take it; try again")


def _busy(location: DatasetLocation, holder: Holder, run_id: str, age: float) -> VersionBusy:
    who = f"another try of this run {run_id} (planned again)" if holder.run_id == run_id else f"run {holder.run_id}"
    return VersionBusy(
        f"{location.dataset} version {location.version} is being written by {who} (its claim was renewed "
        f"{age:.0f} s ago): two runs writing one version would corrupt it. Let that run finish, or trigger with "
        f"another version; if that run is gone, its claim expires {max(EXPIRES_S - age, 0):.0f} s from now and "
        "a run of this version may then take it over"
    )


def release(storage: Storage, location: DatasetLocation, run_id: str, token: str = "") -> None:
    """The run is done writing the version (published, or the run ended): a claim its try holds is deleted, so that
    a Resume may continue the version at once. Conditional: a claim another took over meanwhile stays."""
    found = _read(storage, location.writer)
    if found is None or (found[0].run_id, found[0].token) != (run_id, token):
        return
    try:
        storage.delete_if(location.writer, found[1])
    except Changed:
        log.info("%s: the claim changed as it was released: left to its new holder", location.prefix)


@contextmanager
def held(storage: Storage, location: DatasetLocation, run_id: str, token: str = "") -> Iterator[None]:
    """The claim, renewed in the background while the block writes. A renewal that finds another holding the
    version (this one went silent too long) fails the block's task when it ends: what it wrote is not published,
    since the manifest is only created by the claim's holder."""
    claim(storage, location, run_id, token)
    stop, lost = threading.Event(), []

    def renew() -> None:
        while not stop.wait(RENEW_S):
            try:
                claim(storage, location, run_id, token, renewing=True)
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
