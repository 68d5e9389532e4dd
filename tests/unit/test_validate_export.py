from __future__ import annotations

import pytest

from regen.chat import TokenRoles
from regen.export import build_training_record
from regen.validate import validate_record

SUFFIX = (163588, 70, 163601, 163606)
ROLES = TokenRoles(
    generation_suffix=SUFFIX, reasoning_end=163607, eos_ids=frozenset({163586, 163585}), tool_calls_begin=163595
)
PROMPT = [163587, 5, 163586, *SUFFIX]
STOP = {"type": "stop", "matched": 163586}


@pytest.mark.parametrize(
    "prompt,output,finish,verdict",
    [
        pytest.param(PROMPT, [10, 11, 163607, 12, 163586], STOP, "ok", id="ok"),
        pytest.param(PROMPT, [10, 163607, 163595, 20, 163596, 163586], STOP, "ok", id="ok-tool-call"),
        pytest.param(PROMPT[:-1], [10, 163607, 12, 163586], STOP, "prompt_suffix_mismatch", id="suffix"),
        pytest.param(PROMPT, [10, 11, 12], {"type": "length", "length": 3}, "truncated", id="truncated"),
        pytest.param(PROMPT, [10, 163607, 12], STOP, "no_eos_at_end", id="no-eos"),
        pytest.param(PROMPT, [10, 12, 163586], STOP, "reasoning_end_missing", id="no-think-end"),
        pytest.param(
            PROMPT, [10, 163595, 20, 163596, 163586], STOP, "reasoning_end_missing_before_tool_call", id="kimi-quirk"
        ),
        pytest.param(PROMPT, [163607, 1, 163607, 163586], STOP, "reasoning_end_repeated", id="repeated"),
        pytest.param(PROMPT, [], STOP, "empty_output", id="empty"),
        pytest.param(PROMPT, [10, 163607, 163585], {"type": "stop", "matched": 163585}, "ok", id="tokenizer-eos"),
    ],
)
def test_verdicts(prompt: list[int], output: list[int], finish: dict, verdict: str) -> None:
    assert validate_record(prompt, output, finish, ROLES) == verdict


def test_thinking_off_prompts_expect_no_reasoning_end() -> None:
    roles = TokenRoles((163588, 163606, 163607), 163607, frozenset({163586}), 163595)
    prompt = [1, 163588, 163606, 163607]
    assert validate_record(prompt, [5, 163586], STOP, roles) == "ok"
    assert validate_record(prompt, [5, 163607, 163586], STOP, roles) == "unexpected_reasoning_end"


def test_training_record_is_prompt_then_output_with_boundary_mask() -> None:
    input_ids, loss_mask = build_training_record([1, 2, 3], [7, 8])
    assert input_ids == [1, 2, 3, 7, 8]
    assert loss_mask == [0, 0, 0, 1, 1]
