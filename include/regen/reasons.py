"""Why a row, a sample or an answer was left out: one enum for every stage, each reason with its stage.

Every stage counts `dropped_<reason>` with these values and writes each dropped item to a `rejected/` file with its
reason and a human-readable detail (regen.rejections), so nothing is ever dropped silently. The list in docs/data.md is
tested against this enum (tests/unit/test_reasons.py).
"""

from __future__ import annotations

from enum import StrEnum

PREPARE, GENERATE, VALIDATE = "prepare", "generate", "validate"


class Reason(StrEnum):
    """Each reason with the stage that gives it (the stage its rejections are counted and filed under)."""

    stage: str

    def __new__(cls, value: str, stage: str) -> Reason:
        member = str.__new__(cls, value)
        member._value_, member.stage = value, stage
        return member

    @classmethod
    def of(cls, value: str) -> Reason:
        """The member with this value (a reason read back from a file)."""
        return cls._value2member_map_[value]  # type: ignore[return-value]

    # prepare: the source row or the conversation in it
    MALFORMED_JSON = "malformed_json", PREPARE
    INVALID_UTF8 = "invalid_utf8", PREPARE
    BLANK_LINE = "blank_line", PREPARE  # counted, so that every line of a file is accounted for
    ROW_TOO_LARGE = "row_too_large", PREPARE  # a line over 32 MiB
    TOO_DEEP = "too_deep", PREPARE  # nested deeper than 64 levels
    NUMBER_TOO_LONG = "number_too_long", PREPARE  # an integer literal past Python's 4,300 digits
    NON_FINITE_NUMBER = "non_finite_number", PREPARE  # NaN or Infinity: not JSON, and metadata stays strict JSON
    NOT_AN_OBJECT = "not_an_object", PREPARE
    UNKNOWN_FORMAT = "unknown_format", PREPARE
    MISSING_MESSAGES = "missing_messages", PREPARE
    BAD_MESSAGES = "bad_messages", PREPARE
    UNKNOWN_ROLE = "unknown_role", PREPARE
    BAD_MESSAGE = "bad_message", PREPARE
    BAD_CONTENT = "bad_content", PREPARE
    EMPTY_CONTENT = "empty_content", PREPARE
    NO_USER_TURN = "no_user_turn", PREPARE
    BAD_TOOLS = "bad_tools", PREPARE
    # A tool call in the conversation sent (its history), malformed; its arguments not a JSON object. An answer's
    # own calls are judged at validate (tool_call_*), by the same check of arguments (tool_calls.arguments_problem).
    HISTORY_TOOL_CALL = "history_tool_call", PREPARE
    HISTORY_TOOL_CALL_ARGUMENTS = "history_tool_call_arguments", PREPARE
    DUPLICATE = "duplicate", PREPARE
    EVAL_OVERLAP = "eval_overlap", PREPARE  # holds an item of an eval suite (regen.stages.prepare.decontaminate)
    PROMPT_TOO_LONG = "prompt_too_long", PREPARE
    TEMPLATE_ERROR = "template_error", PREPARE
    # generate: the server's answer to one sample
    SERVER_REJECTED = "server_rejected", GENERATE  # HTTP 400 with the server's message
    SERVER_ABORTED = "server_aborted", GENERATE  # finish_reason abort on every attempt
    COUNT_MISMATCH = "count_mismatch", GENERATE  # completion_tokens != len(output_ids) on every attempt
    SAMPLE_TIMEOUT = "sample_timeout", GENERATE  # no answer in time, sample_timeouts times, on working servers
    # a prompt id outside the vocabulary (a corrupted prompt file): never sent, since one kills an SGLang server
    PROMPT_ID_OUT_OF_VOCAB = "prompt_id_out_of_vocab", GENERATE
    # generate, on-policy: the turns of a conversation after the one that ended it
    # its calls differ from the dataset's: the recorded results would lie
    DIVERGED_TOOL_CALL = "diverged_tool_call", GENERATE
    # an earlier turn rejected, cut by the length limit, or unreadable
    EARLIER_TURN_UNUSABLE = "earlier_turn_unusable", GENERATE
    # validate: the answer's ids, judged against the profile's token roles
    PROMPT_SUFFIX = "prompt_suffix", VALIDATE
    EMPTY_OUTPUT = "empty_output", VALIDATE
    ID_OUT_OF_VOCAB = "id_out_of_vocab", VALIDATE
    PROMPT_TOKENS_MISMATCH = "prompt_tokens_mismatch", VALIDATE  # server disagreement: missing or != the prompt sent
    TEXT_MISMATCH = "text_mismatch", VALIDATE  # server disagreement: text != decode(output_ids)
    EOS_NOT_AT_END = "eos_not_at_end", VALIDATE
    NO_EOS_AT_END = "no_eos_at_end", VALIDATE
    ROLE_TOKEN_IN_OUTPUT = "role_token_in_output", VALIDATE  # a runaway next turn
    REASONING_START_IN_OUTPUT = "reasoning_start_in_output", VALIDATE
    REASONING_END_REPEATED = "reasoning_end_repeated", VALIDATE
    REASONING_END_MISSING = "reasoning_end_missing", VALIDATE
    UNEXPECTED_REASONING_END = "unexpected_reasoning_end", VALIDATE  # reasoning was off in the prompt
    TOOL_CALL_UNBALANCED = "tool_call_unbalanced", VALIDATE  # section and call tokens out of order or unclosed
    TOOL_CALL_BAD_ID = "tool_call_bad_id", VALIDATE
    TOOL_CALL_MALFORMED = "tool_call_malformed", VALIDATE  # a tagged call that names no function, or holds stray text
    MARKUP_AS_TEXT = "markup_as_text", VALIDATE  # a reasoning or tool-call marker spelt in ordinary tokens
    TOOL_CALL_BAD_ARGUMENTS = "tool_call_bad_arguments", VALIDATE
    # a reasoning end after the calls: SGLang reads them as reasoning
    TOOL_CALL_IN_REASONING = "tool_call_in_reasoning", VALIDATE
    TOOL_CALL_UNDECLARED = "tool_call_undeclared", VALIDATE
    TOOL_CALL_WITHOUT_TOOLS = "tool_call_without_tools", VALIDATE
    # validate, kept in the flagged `truncated/` split rather than rejected
    TRUNCATED_IN_REASONING = "truncated_in_reasoning", VALIDATE
    TRUNCATED_IN_ANSWER = "truncated_in_answer", VALIDATE


OK = "ok"  # the verdict of an answer that passed every check
TRUNCATED = frozenset({Reason.TRUNCATED_IN_REASONING, Reason.TRUNCATED_IN_ANSWER})


def split_of(verdict: str) -> str | None:
    """Where a record with this verdict goes: train/, the flagged truncated/ split, or nowhere (rejected/)."""
    return "train" if verdict == OK else "truncated" if verdict in TRUNCATED else None
