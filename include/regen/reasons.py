"""Why a row, a sample or an answer was left out: one enum for every stage, and one writer for `rejected/`.

Every stage counts `dropped_<reason>` with these values and writes each dropped item to a `rejected/` file with its
reason and a human-readable detail, so nothing is ever dropped silently. The README's list is tested against this
enum (tests/unit/test_reasons.py).
"""

from __future__ import annotations

import json
import tempfile
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from regen.storage import Storage


class Reason(StrEnum):
    # prepare: the source row or the conversation in it
    MALFORMED_JSON = "malformed_json"
    INVALID_UTF8 = "invalid_utf8"
    BLANK_LINE = "blank_line"  # counted, so that every line of a file is accounted for
    ROW_TOO_LARGE = "row_too_large"  # a line over 32 MiB
    TOO_DEEP = "too_deep"  # nested deeper than 64 levels
    NUMBER_TOO_LONG = "number_too_long"  # an integer literal past Python's 4,300 digits
    NON_FINITE_NUMBER = "non_finite_number"  # NaN or Infinity: not JSON, and metadata stays strict JSON
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_FORMAT = "unknown_format"
    MISSING_MESSAGES = "missing_messages"
    BAD_MESSAGES = "bad_messages"
    UNKNOWN_ROLE = "unknown_role"
    BAD_MESSAGE = "bad_message"
    BAD_CONTENT = "bad_content"
    EMPTY_CONTENT = "empty_content"
    NO_USER_TURN = "no_user_turn"
    BAD_TOOLS = "bad_tools"
    BAD_TOOL_CALL = "bad_tool_call"
    BAD_TOOL_CALL_ARGUMENTS = "bad_tool_call_arguments"
    DUPLICATE = "duplicate"
    PROMPT_TOO_LONG = "prompt_too_long"
    TEMPLATE_ERROR = "template_error"
    # generate: the server's answer to one sample
    SERVER_REJECTED = "server_rejected"  # HTTP 400 with the server's message
    SERVER_ABORTED = "server_aborted"  # finish_reason abort on every attempt
    COUNT_MISMATCH = "count_mismatch"  # completion_tokens != len(output_ids) on every attempt
    # generate, on-policy: the turns of a conversation after the one that ended it
    DIVERGED_TOOL_CALL = "diverged_tool_call"  # its calls differ from the dataset's: the recorded results would lie
    EARLIER_TURN_UNUSABLE = "earlier_turn_unusable"  # an earlier turn rejected, cut by the length limit, or unreadable
    # validate: the answer's ids, judged against the profile's token roles
    PROMPT_SUFFIX = "prompt_suffix"
    EMPTY_OUTPUT = "empty_output"
    ID_OUT_OF_VOCAB = "id_out_of_vocab"
    PROMPT_TOKENS_MISMATCH = "prompt_tokens_mismatch"  # server disagreement: missing or != the prompt sent
    TEXT_MISMATCH = "text_mismatch"  # server disagreement: text != decode(output_ids)
    EOS_NOT_AT_END = "eos_not_at_end"
    NO_EOS_AT_END = "no_eos_at_end"
    ROLE_TOKEN_IN_OUTPUT = "role_token_in_output"  # a runaway next turn
    REASONING_START_IN_OUTPUT = "reasoning_start_in_output"
    REASONING_END_REPEATED = "reasoning_end_repeated"
    REASONING_END_MISSING = "reasoning_end_missing"
    UNEXPECTED_REASONING_END = "unexpected_reasoning_end"  # reasoning was off in the prompt
    TOOL_CALL_UNBALANCED = "tool_call_unbalanced"  # section and call tokens out of order or unclosed
    TOOL_CALL_BAD_ID = "tool_call_bad_id"
    TOOL_CALL_MALFORMED = "tool_call_malformed"  # a tagged call that names no function, or holds stray text
    TOOL_CALL_BAD_ARGUMENTS = "tool_call_bad_arguments"
    TOOL_CALL_IN_REASONING = "tool_call_in_reasoning"  # a reasoning end after the calls: SGLang reads them as reasoning
    TOOL_CALL_UNDECLARED = "tool_call_undeclared"
    TOOL_CALL_WITHOUT_TOOLS = "tool_call_without_tools"
    # validate, kept in the flagged `truncated/` split rather than rejected
    TRUNCATED_IN_REASONING = "truncated_in_reasoning"
    TRUNCATED_IN_ANSWER = "truncated_in_answer"

    @property
    def stage(self) -> str:
        return STAGE_OF[self]


OK = "ok"  # the verdict of an answer that passed every check
TRUNCATED = frozenset({Reason.TRUNCATED_IN_REASONING, Reason.TRUNCATED_IN_ANSWER})
_GENERATE = frozenset(
    {
        Reason.SERVER_REJECTED,
        Reason.SERVER_ABORTED,
        Reason.COUNT_MISMATCH,
        Reason.DIVERGED_TOOL_CALL,
        Reason.EARLIER_TURN_UNUSABLE,
    }
)
_FIRST_VALIDATE = list(Reason).index(Reason.PROMPT_SUFFIX)
STAGE_OF: dict[Reason, str] = {
    reason: "generate" if reason in _GENERATE else "validate" if i >= _FIRST_VALIDATE else "prepare"
    for i, reason in enumerate(Reason)
}


def split_of(verdict: str) -> str | None:
    """Where a record with this verdict goes: train/, the flagged truncated/ split, or nowhere (rejected/)."""
    return "train" if verdict == OK else "truncated" if verdict in TRUNCATED else None


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
        """Key -> sha256 of what was written: empty when nothing was rejected."""
        self._file.close()
        return {self.key: self.storage.put_file(self.key, self.path)} if self.count else {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self._file.close()
        self._dir.cleanup()
