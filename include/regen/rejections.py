"""`rejected/` files: every item a stage leaves out, with its reason and a detail people can read."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from regen.reasons import Reason
from regen.storage import Storage


class RejectionWriter:
    """Rejected items streamed to a local file and uploaded once, when closed: memory stays flat, and the storage
    key appears whole or not at all. Nothing is written when nothing was rejected."""

    def __init__(self, storage: Storage, key: str) -> None:
        self.storage, self.key = storage, key
        self.count = 0
        self._dir = tempfile.TemporaryDirectory(prefix="regen-rejected-")
        self.path = Path(self._dir.name) / "rejected.jsonl"
        self._file = self.path.open("w", encoding="utf-8")

    def add(self, sample_id: str | None, reason: Reason, detail: str, **extra: Any) -> None:
        record = {"id": sample_id, "stage": reason.stage, "reason": reason.value, "detail": detail, **extra}
        line = json.dumps(record, ensure_ascii=False)
        # A detail quoting undecodable input carries lone surrogates, which UTF-8 cannot hold: written as `\udcff`.
        self._file.write(line.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
        self.count += 1

    def upload(self) -> dict[str, str]:
        """Key -> sha256 of what was written: empty when nothing was rejected. The key is this try's: with nothing
        rejected, what an earlier try of the stage left there (it died before finishing) is removed, as its samples
        are answered or kept now."""
        self._file.close()
        if self.count:
            return {self.key: self.storage.put_file(self.key, self.path)}
        if self.storage.exists(self.key):
            self.storage.delete(self.key)
        return {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self._file.close()
        self._dir.cleanup()
