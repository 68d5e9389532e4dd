"""What a crash point is: one mutating storage operation of one try of a task, named by what it is (its method, its
key and its place among the try's operations on that key), and the fault it meets; and where faults are injected
(`FaultyStorage`, around the storage every task opens)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import threading
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = ("before", "lost_reply", "crash")
TORN = "torn"  # a local root's: killed with its temporary file written, before the rename (mid-write)
MUTATING = {"put_bytes": "PUT", "create": "PUT", "replace": "PUT", "put_file": "PUT", "delete": "DELETE"}
MUTATING["delete_if"] = "DELETE"
STAGED = {"put_bytes", "create", "replace", "put_file", "renew"}  # what a local root writes through a temporary file
RENEW = "renew"  # a claim's timed renewal (its renewer thread's replace), named apart: it follows the clock
RENEW_NOW_S = 0.05  # a renewal point's try renews this often, and its writes wait for the renewal (RENEW_WAIT_S)
RENEW_WAIT_S = 5.0
_DRAWN = re.compile(r"[0-9a-f]{16,}")  # plan's probe's token, a publisher's report folder: drawn afresh each try


@dataclass(frozen=True)
class Operation:
    """`method key@nth`: the nth operation of that method on that key in one try (`*` for what a try draws).
    `held`: made while the try held its version's claim (regen.claims.held), whose renewer runs only then."""

    method: str
    key: str
    nth: int = 1
    held: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        return f"{self.method} {self.key}@{self.nth}"

    @classmethod
    def parse(cls, text: str) -> Operation:
        method, _, rest = text.partition(" ")
        key, _, nth = rest.rpartition("@")
        return cls(method, key, int(nth))


@dataclass(frozen=True)
class Arm:
    """What one try is armed with: the fault, at the operation."""

    op: Operation
    fault: str

    def __str__(self) -> str:
        return f"{self.op}:{self.fault}"


@dataclass(frozen=True)
class CrashPoint:
    """A fault at an operation of the task's first try, or with `after`, of its second: the first was killed right
    after `after` landed, and the retry meets what it left (stale prompts, leftover checkpoints, a claim to renew)."""

    task: str  # a task instance's label: "generate_group[tools/shard-00000 +1]"
    op: Operation
    fault: str
    after: Operation | None = None

    def arms(self) -> tuple[Arm, ...]:
        """Each try's, from the first."""
        if self.after is None:
            return (Arm(self.op, self.fault),)
        return Arm(self.after, "crash"), Arm(self.op, self.fault)

    def __str__(self) -> str:
        return f"{self.task}#" + " then ".join(str(arm) for arm in self.arms())


def parse_point(text: str) -> CrashPoint:
    """`task#method key@n:fault`, or `task#method key@n:crash then method key@n:fault`, as a point prints."""
    task, _, rest = text.partition("#")
    arms = []
    for part in rest.split(" then "):
        op, _, fault = part.rpartition(":")
        arms.append(Arm(Operation.parse(op), fault))
    if len(arms) == 1:
        return CrashPoint(task, arms[0].op, arms[0].fault)
    return CrashPoint(task, arms[1].op, arms[1].fault, after=arms[0].op)


def op_key(key: str) -> str:
    return _DRAWN.sub("*", key)


class Injector:
    """A task try's mutating operations, named as they are made (threads too), and the fault for the armed one."""

    def __init__(self) -> None:
        self.arm: Arm | None = None
        self.task = ""
        self.ops: list[Operation] = []
        self.made: Counter[tuple[str, str]] = Counter()
        self.fired: str | None = None
        self.lock = threading.Lock()
        self.renewed = threading.Event()
        self.proxy: str | None = None  # the S3 fault proxy's URL, to lose a reply
        self.holding: Counter[str] = Counter()  # the folders of the claims held now (regen.claims.held)

    def start(self, task: str, arm: Arm | None) -> None:
        """In the try's process, before the task runs: a renewal point's claims renew at once (regen.claims)."""
        self.task, self.arm, self.ops, self.made, self.fired = task, arm, [], Counter(), None
        self.holding = Counter()
        self.renewed.clear()
        if arm is not None and arm.op.method == RENEW:
            from regen import claims

            claims.RENEW_S = RENEW_NOW_S

    def next(self, method: str, key: str) -> str | None:
        """The fault this operation meets, if it is the armed one."""
        renewal = threading.current_thread().name.startswith("claim-")  # regen.claims.held's renewer
        name, named = RENEW if renewal else method, op_key(key)
        self._await_renewal(named, renewal)
        with self.lock:
            self.made[(name, named)] += 1
            held = not renewal and any(named.startswith(folder) for folder in +self.holding)
            op = Operation(name, named, self.made[(name, named)], held)
            self.ops.append(op)
            if self.arm is None or self.fired or op != self.arm.op:
                return None
            self.fired = str(self.arm)
            self.renewed.set()
            return self.arm.fault

    def _await_renewal(self, key: str, renewal: bool) -> None:
        """A renewal point's try writes into the claimed version only once the renewal came (or RENEW_WAIT_S passed):
        the renewal is met in every run of it, not only in one slow enough to renew."""
        arm = self.arm
        if arm is None or arm.op.method != RENEW or renewal or key == arm.op.key:
            return
        if key.startswith(arm.op.key.rsplit("/", 1)[0] + "/"):
            self.renewed.wait(RENEW_WAIT_S)


INJECTOR = Injector()


def holding(held: Callable[..., Any]) -> Callable[..., Any]:
    """regen.claims.held, the operations made inside it marked `held`: its renewer runs only then, so a try renews
    its claim only when it writes there (a shard found finished writes its stage manifest after the block)."""

    @contextlib.contextmanager
    def marked(storage: Any, location: Any, *args: Any, **kwargs: Any) -> Iterator[None]:
        with held(storage, location, *args, **kwargs):
            folder = op_key(location.writer).rsplit("/", 1)[0] + "/"
            with INJECTOR.lock:
                INJECTOR.holding[folder] += 1
            try:
                yield
            finally:
                with INJECTOR.lock:
                    INJECTOR.holding[folder] -= 1

    return marked


class FaultyStorage:
    """A task's storage (regen.pipeline.run_storage: where a task gets it, once), its mutating operations named and
    the armed one failed; everything else passes through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in MUTATING:
            return attribute
        return lambda key, *args, **kwargs: self._mutate(name, key, lambda: attribute(key, *args, **kwargs))

    def _mutate(self, method: str, key: str, call: Callable[[], Any]) -> Any:
        fault = INJECTOR.next(method, key)
        if fault is None:
            return call()
        if fault == "before":
            raise self._dropped_connection(key)
        if fault in (TORN, "crash"):
            if fault == TORN:
                self._killed_before_rename(key)
            try:
                call()
            finally:  # killed after it, whatever its answer (a create refused: KeyExists)
                os.kill(os.getpid(), signal.SIGKILL)
        if INJECTOR.proxy is not None and hasattr(self.inner, "bucket"):  # S3: the proxy loses the reply
            query = urllib.parse.urlencode({"method": MUTATING[method], "path": self.inner._key(key)})
            urllib.request.urlopen(urllib.request.Request(f"{INJECTOR.proxy}/__drop_reply?{query}", method="POST"))
            return call()  # botocore retries it, as it would
        try:
            call()
        except Exception as e:  # its answer, whatever it was, is lost with the connection
            raise self._dropped_connection(key) from e
        raise self._dropped_connection(key)

    def _killed_before_rename(self, key: str) -> None:
        """The process SIGKILLed once its temporary file for `key` is written and synced, before it is renamed into
        place: a writer killed mid-write (regen.storage.local)."""
        from regen.storage import local

        staged, killed_at = local._staged, self.inner._path(key)

        def staged_then_killed(target: Path, chunks: Iterable[bytes]) -> tuple[str, str]:
            done = staged(target, chunks)
            if target == killed_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return done

        local._staged = staged_then_killed  # (this process dies in it)

    def _dropped_connection(self, key: str) -> Exception:
        if hasattr(self.inner, "bucket"):
            from botocore.exceptions import ConnectionClosedError  # what botocore raises once its retries are spent

            return ConnectionClosedError(endpoint_url=f"{self.inner.uri(key)} (crash point)")
        return ConnectionResetError(errno.ECONNRESET, f"crash point: {key}")


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Every task's storage opened through FaultyStorage (the seam: regen.pipeline.run_storage.open_storage), until
    the harness closes: the process it ran in (a test worker) opens plain storage again. And every task writes its
    claim when it starts (regen.claims.FRESH_SHARE): a task replayed from a restored root finds the claim as old as the
    traced run left it and writes it, so the traced run's must too, or its points would miss their operations. And
    its claimed blocks (run_storage.held) mark the operations made in them (`holding`)."""
    from regen import claims
    from regen.pipeline import run_storage

    opened, held, fresh = run_storage.open_storage, run_storage.held, claims.FRESH_SHARE
    run_storage.open_storage = lambda *args, **kwargs: FaultyStorage(opened(*args, **kwargs))
    run_storage.held = holding(held)
    claims.FRESH_SHARE = 0.0
    try:
        yield
    finally:
        run_storage.open_storage, run_storage.held, claims.FRESH_SHARE = opened, held, fresh
