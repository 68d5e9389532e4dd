"""Validation judges ids by the profile's token roles: one crafted record per reason, and valid records untouched.

Records are written as text with the profile's special tokens and encoded by the mini tokenizer, so a case reads like
what Kimi-K2.5 emits; the ids of its special tokens (KIMI_K25.md) are what the verdicts hinge on.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import msgspec
import pytest

from regen.chat import ChatRenderer
from regen.judge import FLAG_NO_REASONING_END, OK, judge, judge_output, mark_table
from regen.reasons import Reason
from regen.records import RawAnswer, text_digest

TOOLS = frozenset({"get_weather"})
CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
)
STOP = {"type": "stop", "matched": 163586}


@pytest.fixture(scope="module")
def prompt(renderer: ChatRenderer) -> list[int]:
    return renderer.render_ids([{"role": "user", "content": "Weather in Paris?"}], None)


def answer(
    renderer: ChatRenderer,
    prompt: list[int],
    text: str,
    finish: dict[str, Any] | None = None,
    *,
    extra_ids: list[int] | None = None,
    meta: dict[str, Any] | None = None,
    server_text: str | None = None,
) -> RawAnswer:
    output = renderer.tokenizer.encode(text, add_special_tokens=False) + (extra_ids or [])
    meta_info = {"finish_reason": finish or STOP, "prompt_tokens": len(prompt), "completion_tokens": len(output)}
    decoded = renderer.decode(output) if all(0 <= i < renderer.roles.vocab_size for i in output) else ""
    text = decoded if server_text is None else server_text
    return RawAnswer("s1", output, {**meta_info, **(meta or {})}, *text_digest(text))


def verdict_of(
    renderer: ChatRenderer, prompt: list[int], record: RawAnswer, tools: frozenset[str] | None = TOOLS
) -> str:
    return judge(prompt, record, renderer.roles, tools, renderer.decode).verdict


VALID = [
    pytest.param("Let me think.</think>It is 4.<|im_end|>", OK, (), id="reasoning-then-answer"),
    pytest.param(f"Need the tool.</think>{CALL}<|im_end|>", OK, (), id="reasoning-then-tool-call"),
    pytest.param(f"Need the tool.{CALL}<|im_end|>", OK, (FLAG_NO_REASONING_END,), id="tool-call-without-think-end"),
    pytest.param("Thinking.</think>Done.[EOS]", OK, (), id="tokenizer-eos"),
    pytest.param(
        "Need two.</think><|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>",
        OK,
        (),
        id="parallel-calls",
    ),
]


@pytest.mark.parametrize("text,verdict,flags", VALID)
def test_valid_records_pass_with_their_flags(
    renderer: ChatRenderer, prompt: list[int], text: str, verdict: str, flags: tuple[str, ...]
) -> None:
    record = answer(renderer, prompt, text)
    judgement = judge(prompt, record, renderer.roles, TOOLS, renderer.decode)
    assert (judgement.verdict, judgement.flags) == (verdict, flags)
    assert judgement.decoded == renderer.decode(record.output_ids)


def test_reasoning_and_tool_counts(renderer: ChatRenderer, prompt: list[int]) -> None:
    record = answer(renderer, prompt, f"Need the tool.</think>{CALL}<|im_end|>")
    judgement = judge(prompt, record, renderer.roles, TOOLS, renderer.decode)
    think_end = record.output_ids.index(163607)
    assert judgement.reasoning_len == think_end + 1
    assert judgement.tool_calls == 1
    implicit = answer(renderer, prompt, f"Need the tool.{CALL}<|im_end|>")
    judged = judge(prompt, implicit, renderer.roles, TOOLS, renderer.decode)
    assert judged.reasoning_len == implicit.output_ids.index(163595)  # the section start ends reasoning


LENGTH = {"type": "length", "length": 64}
DEFECTS = [
    pytest.param("Fine.</think>Hi<|im_end|>", {"extra_ids": [163840]}, Reason.ID_OUT_OF_VOCAB, id="id-at-vocab-size"),
    pytest.param("Fine.</think>Hi", {"extra_ids": [2**31 + 1]}, Reason.ID_OUT_OF_VOCAB, id="id-over-int32"),
    pytest.param("Fine.</think>Hi<|im_end|>", {"extra_ids": [-1]}, Reason.ID_OUT_OF_VOCAB, id="negative-id"),
    pytest.param("Hm.</think>A<|im_end|>B<|im_end|>", {}, Reason.EOS_NOT_AT_END, id="eos-in-middle"),
    pytest.param("Hm.</think>Answer.", {}, Reason.NO_EOS_AT_END, id="no-eos-at-end"),
    pytest.param(
        "Hm.</think>Done.<|im_user|>user<|im_middle|>more<|im_end|>", {}, Reason.ROLE_TOKEN_IN_OUTPUT, id="runaway"
    ),
    pytest.param("Hm<think>more.</think>Done.<|im_end|>", {}, Reason.REASONING_START_IN_OUTPUT, id="think-in-output"),
    pytest.param("Hm.</think>Done.</think><|im_end|>", {}, Reason.REASONING_END_REPEATED, id="think-end-repeated"),
    pytest.param("Never closes the reasoning.<|im_end|>", {}, Reason.REASONING_END_MISSING, id="think-end-missing"),
    pytest.param(
        "Hm." + CALL + "</think>Done.<|im_end|>", {}, Reason.TOOL_CALL_IN_REASONING, id="section-before-think-end"
    ),
    pytest.param(
        "Hm.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|im_end|>',
        {},
        Reason.TOOL_CALL_UNBALANCED,
        id="call-not-closed",
    ),
    pytest.param(
        "Hm.</think><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{}<|tool_call_end|><|im_end|>",
        {},
        Reason.TOOL_CALL_UNBALANCED,
        id="call-outside-section",
    ),
    *(  # the one well-formed call, with one thing about it changed
        pytest.param("Hm.</think>" + CALL.replace(was, now) + "<|im_end|>", {}, reason, id=name)
        for name, was, now, reason in (
            (
                "call-id-sglang-skips",
                "functions.get_weather:0",
                "functions.github:create_issue:0",
                Reason.TOOL_CALL_BAD_ID,
            ),
            ("call-id-format", "functions.get_weather:0", "call_abc123", Reason.TOOL_CALL_BAD_ID),
            ("arguments-not-json", '{"city": "Paris"}', '{"city": "Par', Reason.TOOL_CALL_BAD_ARGUMENTS),
            ("arguments-not-an-object", '{"city": "Paris"}', "[1, 2]", Reason.TOOL_CALL_BAD_ARGUMENTS),
            ("undeclared-tool", "get_weather", "delete_files", Reason.TOOL_CALL_UNDECLARED),
            (
                "call-begin-in-its-id",
                "<|tool_call_argument_begin|>",
                "<|tool_call_begin|>",
                Reason.TOOL_CALL_UNBALANCED,
            ),
            (
                "section-end-in-its-id",
                "<|tool_call_argument_begin|>",
                "<|tool_calls_section_end|>",
                Reason.TOOL_CALL_UNBALANCED,
            ),
        )
    ),
    pytest.param("Hm.</think>Hi<|im_end|>", {"meta": {"prompt_tokens": 3}}, Reason.PROMPT_TOKENS_MISMATCH, id="pt"),
    pytest.param(
        "Hm.</think>Hi<|im_end|>", {"meta": {"prompt_tokens": None}}, Reason.PROMPT_TOKENS_MISMATCH, id="pt-missing"
    ),
    pytest.param(
        "Hm.</think>Hi there<|im_end|>",
        {"server_text": "Hm.</think>Hi where<|im_end|>"},
        Reason.TEXT_MISMATCH,
        id="text",
    ),
    pytest.param("Hm.</think>Hi<|im_end|>", {"server_text": "Hm.</think>Hi"}, Reason.TEXT_MISMATCH, id="text-trimmed"),
    pytest.param("Still thinking about", {"finish": LENGTH}, Reason.TRUNCATED_IN_REASONING, id="cut-in-reasoning"),
    pytest.param("Hm.</think>The answer is", {"finish": LENGTH}, Reason.TRUNCATED_IN_ANSWER, id="cut-in-answer"),
    pytest.param(
        "Hm.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{",
        {"finish": LENGTH},
        Reason.TRUNCATED_IN_ANSWER,
        id="cut-in-tool-call",
    ),
    pytest.param(
        "Hm<think>", {"finish": LENGTH}, Reason.REASONING_START_IN_OUTPUT, id="cut-but-defective-before-the-cut"
    ),
]


@pytest.mark.parametrize("text,options,reason", DEFECTS)
def test_each_defect_has_its_reason(
    renderer: ChatRenderer, prompt: list[int], text: str, options: dict[str, Any], reason: Reason
) -> None:
    record = answer(renderer, prompt, text, options.pop("finish", None), **options)
    assert verdict_of(renderer, prompt, record) == reason.value


def test_tool_calls_when_the_prompt_declares_none(renderer: ChatRenderer, prompt: list[int]) -> None:
    record = answer(renderer, prompt, f"Hm.</think>{CALL}<|im_end|>")
    assert verdict_of(renderer, prompt, record, tools=None) == Reason.TOOL_CALL_WITHOUT_TOOLS


def test_prompt_without_the_generation_suffix(renderer: ChatRenderer, prompt: list[int]) -> None:
    suffix = renderer.roles.generation_suffix
    # one id short; the suffix's ids each one higher (a comparison, not equality, would pass these)
    for other in (prompt[:-1], prompt[: -len(suffix)] + [i + 1 for i in suffix]):
        record = answer(renderer, other, "Hm.</think>Hi<|im_end|>")
        assert verdict_of(renderer, other, record) == Reason.PROMPT_SUFFIX


def test_empty_output(renderer: ChatRenderer, prompt: list[int]) -> None:
    record = RawAnswer("s1", [], {"finish_reason": STOP, "prompt_tokens": len(prompt)}, *text_digest(""))
    assert verdict_of(renderer, prompt, record) == Reason.EMPTY_OUTPUT


def test_thinking_off_prompt_expects_no_reasoning(renderer: ChatRenderer) -> None:
    roles = renderer.roles
    prompt = [*renderer.render_ids([{"role": "user", "content": "Hi"}], None), roles.reasoning_end]
    off_roles = type(roles)(**{**roles.__dict__, "generation_suffix": (*roles.generation_suffix, roles.reasoning_end)})
    plain = answer(renderer, prompt, "Hello.<|im_end|>")
    assert judge(prompt, plain, off_roles, None, renderer.decode).verdict == OK
    closing = answer(renderer, prompt, "Hello.</think>Hi<|im_end|>")
    assert judge(prompt, closing, off_roles, None, renderer.decode).verdict == Reason.UNEXPECTED_REASONING_END


def test_a_model_that_opens_its_own_reasoning(renderer: ChatRenderer) -> None:
    """Kimi-K2-Thinking's prompt ends at `<|im_middle|>` and the model writes `<think>` itself (KIMI_K25.md)."""
    roles = renderer.roles
    prompt = renderer.render_ids([{"role": "user", "content": "Hi"}], None)[:-1]
    k2_roles = type(roles)(**{**roles.__dict__, "generation_suffix": roles.generation_suffix[:-1]})
    opened = answer(renderer, prompt, "<think>Hm.</think>Hi<|im_end|>")
    assert judge(prompt, opened, k2_roles, None, renderer.decode).verdict == OK
    late = answer(renderer, prompt, "Hi<think>Hm.</think><|im_end|>")
    assert judge(prompt, late, k2_roles, None, renderer.decode).verdict == Reason.REASONING_START_IN_OUTPUT


def test_a_length_cut_inside_a_utf8_character_is_tolerated(renderer: ChatRenderer, prompt: list[int]) -> None:
    """At a length cut SGLang's detokenizer emits the unfinished character as U+FFFD, as decode does; a server that
    held it back instead is tolerated there, and only there."""
    ids = renderer.tokenizer.encode("Hm.</think>café ☕", add_special_tokens=False)
    cut = ids[:-1]
    decoded = renderer.decode(cut)
    meta = {"finish_reason": LENGTH, "prompt_tokens": len(prompt), "completion_tokens": len(cut)}
    assert decoded.endswith("\ufffd")  # the cut falls inside the 3 bytes of U+2615
    as_sent = RawAnswer("s1", cut, meta, *text_digest(decoded))
    assert verdict_of(renderer, prompt, as_sent) == Reason.TRUNCATED_IN_ANSWER
    held_back = RawAnswer("s1", cut, meta, *text_digest(decoded.rstrip("\ufffd")))
    assert verdict_of(renderer, prompt, held_back) == Reason.TRUNCATED_IN_ANSWER
    other = RawAnswer("s1", cut, meta, *text_digest(decoded.rstrip("\ufffd") + "x"))
    assert verdict_of(renderer, prompt, other) == Reason.TEXT_MISMATCH


def test_trailing_replacement_characters_must_match_when_not_cut(renderer: ChatRenderer, prompt: list[int]) -> None:
    record = answer(renderer, prompt, "Hm.</think>Hi<|im_end|>")
    extra = msgspec.structs.replace(record, text_replacement_tail=1)
    assert verdict_of(renderer, prompt, extra) == Reason.TEXT_MISMATCH


@pytest.mark.parametrize(
    "text,flags",
    [
        pytest.param(
            "Hm." + CALL.replace("<|tool_calls_section_end|>", "") + "<|im_end|>",
            ("tool_call_without_reasoning_end", "tool_call_section_unclosed"),
            id="section-not-closed",
        ),
        pytest.param(
            "Hm.</think><|tool_calls_section_begin|><|tool_calls_section_end|><|im_end|>",
            ("tool_call_section_empty",),
            id="empty-section",
        ),
        *(  # the call's id written another way
            pytest.param(
                "Hm.</think>" + CALL.replace("functions.get_weather:0", written) + "<|im_end|>", (kind,), id=name
            )
            for name, written, kind in (
                ("id-with-whitespace", " functions.get_weather:0\n", "tool_call_id_spaced"),
                ("id-without-prefix", "get_weather:0", "tool_call_id_without_functions_prefix"),
                ("id-a-bare-counter", "3", "tool_call_id_bare_counter"),
            )
        ),
        pytest.param("<think><think>Hm.</think>Hi.<|im_end|>", ("reasoning_start_repeated",), id="think-repeated"),
        pytest.param("Hm." + CALL + CALL + "<|im_end|>", ("tool_call_without_reasoning_end",), id="two-sections"),
        pytest.param(
            "Hm.</think>" + CALL.removesuffix("<|tool_calls_section_end|>") + CALL + "<|im_end|>",
            ("tool_call_section_unclosed",),
            id="a-section-with-a-call-left-open-by-the-next",
        ),
        pytest.param(
            "Hm.</think><|tool_calls_section_begin|>" + CALL + "<|im_end|>",
            ("tool_call_section_empty",),
            id="an-empty-section-left-open-by-the-next",
        ),
        pytest.param(
            "Hm.</think><|tool_calls_section_begin|><|tool_call_end|>"
            + CALL.removeprefix("<|tool_calls_section_begin|>")
            + "<|im_end|>",
            ("tool_call_markup_stray",),
            id="a-stray-end-in-a-section-leaves-it-open",
        ),
    ],
)
def test_what_sglang_reads_leniently_is_kept_and_flagged(
    renderer: ChatRenderer, prompt: list[int], text: str, flags: tuple[str, ...]
) -> None:
    """SGLang's chat layer turns these into a usable message (tests/parity/ checks the reading against its code):
    the answer is kept, with flags that say what was lenient."""
    record = answer(renderer, prompt, text)
    tools = json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])
    judged = judge(
        prompt, record, renderer.roles, frozenset({"get_weather"}), renderer.decode, lambda: json.loads(tools)
    )
    assert (judged.verdict, judged.flags) == ("ok", flags)


def test_a_server_without_text_cannot_be_checked(renderer: ChatRenderer, prompt: list[int]) -> None:
    record = msgspec.structs.replace(answer(renderer, prompt, "Hm.</think>Hi<|im_end|>"), text_digest=None)
    assert verdict_of(renderer, prompt, record) == Reason.TEXT_MISMATCH


def test_backend_decode_is_the_tokenizers_decode(renderer: ChatRenderer) -> None:
    ids = renderer.tokenizer.encode("Hm.</think>café ☕ <|im_end|>[EOS]<|tool_call_begin|>", add_special_tokens=False)
    rng = random.Random(7)
    samples = [ids, ids[:-3], [rng.randrange(renderer.roles.vocab_size) for _ in range(300)]]
    for sample in samples:
        for skip in (False, True):
            assert renderer.decode(sample, skip) == renderer.tokenizer.decode(sample, skip_special_tokens=skip)


def test_every_reason_code_is_exercised() -> None:
    covered = {p.values[2] for p in DEFECTS} | {
        Reason.TOOL_CALL_WITHOUT_TOOLS,
        Reason.PROMPT_SUFFIX,
        Reason.EMPTY_OUTPUT,
        Reason.UNEXPECTED_REASONING_END,
        Reason.TOOL_CALL_MALFORMED,  # tagged grammars only: tests/unit/test_tool_call_grammars.py
        Reason.MARKUP_AS_TEXT,  # below
    }
    validate_reasons = {r for r in Reason if r.stage == "validate"}
    assert validate_reasons == covered, sorted(validate_reasons - covered)


def test_arguments_nested_too_deep_are_rejected_not_crashing(renderer: ChatRenderer, prompt: list[int]) -> None:
    deep = "[" * 5000 + "]" * 5000
    record = answer(renderer, prompt, "Hm.</think>" + CALL.replace('{"city": "Paris"}', deep) + "<|im_end|>")
    assert verdict_of(renderer, prompt, record) == Reason.TOOL_CALL_BAD_ARGUMENTS


def test_decode_of_ids_outside_the_vocabulary_follows_the_tokenizer(renderer: ChatRenderer) -> None:
    beyond = [39, 76, renderer.roles.vocab_size + 5, 13]
    assert renderer.decode(beyond) == renderer.tokenizer.decode(beyond, skip_special_tokens=False)
    with pytest.raises(OverflowError):
        renderer.tokenizer.decode([39, -1])
    with pytest.raises(OverflowError):
        renderer.decode([39, -1])


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"Need the tool.</think>{CALL}", id="a-call"),
        pytest.param('Need the tool.</think>It is <|tool_calls_section_begin|>{"city": "Par', id="a-section-opened"),
        pytest.param("Thinking.</think>Done, and </think> again.", id="a-reasoning-end"),
    ],
)
def test_markup_spelt_in_ordinary_tokens_is_rejected(renderer: ChatRenderer, prompt: list[int], text: str) -> None:
    """SGLang's parsers read the decoded text: a marker the model spelt in ordinary tokens is markup to them, though
    no marker id is there. Found by the answer-parity test (tests/parity): a call spelt so was kept as prose while
    SGLang read the text away."""
    encode = renderer.tokenizer.encode
    spelt_from = text.index("</think>") + len("</think>")  # the reasoning's end as its marker id, the rest spelt
    ids = encode(text[:spelt_from], add_special_tokens=False)
    for piece in re.split(r"(?<=<\|)|(?<=</)", text[spelt_from:]):  # "<|" and "</" apart: no marker matches whole
        ids += encode(piece, add_special_tokens=False)
    ids += encode("<|im_end|>", add_special_tokens=False)
    assert renderer.decode(ids, False) == text + "<|im_end|>"
    meta = {"finish_reason": STOP, "prompt_tokens": len(prompt), "completion_tokens": len(ids)}
    spelt = RawAnswer("s1", ids, meta, *text_digest(renderer.decode(ids)))
    assert verdict_of(renderer, prompt, spelt) == Reason.MARKUP_AS_TEXT
    whole = answer(renderer, prompt, text + "<|im_end|>")  # the same text, its markers as marker ids
    assert verdict_of(renderer, prompt, whole) != Reason.MARKUP_AS_TEXT


def test_the_first_id_outside_the_vocabulary_is_named_wherever_it_falls(
    renderer: ChatRenderer, prompt: list[int]
) -> None:
    size, ids = renderer.roles.vocab_size, renderer.tokenizer.encode("Hm.</think>Hi", add_special_tokens=False)
    for bad in (size + 3, -2, size):
        record = answer(renderer, prompt, "", extra_ids=[0, *ids, bad, size + 9, -7, 163586])  # 0: in the vocabulary
        judged = judge(prompt, record, renderer.roles, TOOLS, renderer.decode)
        assert (judged.verdict, judged.detail) == (Reason.ID_OUT_OF_VOCAB, f"id {bad} outside the vocabulary of {size}")


def test_a_reasoning_start_after_any_other_token_is_rejected_not_taken_for_a_repeat(
    renderer: ChatRenderer, prompt: list[int]
) -> None:
    """SGLang strips only the reasoning starts that open the output; one after any other token, whatever its id, is
    no repeat."""
    roles = renderer.roles
    above = roles.reasoning_start + 50  # an id above the marker's that marks nothing
    assert above < roles.vocab_size and mark_table(roles)[above] == 0
    rest = renderer.tokenizer.encode("Hm.</think>Hi<|im_end|>", add_special_tokens=False)
    for before in (above, 39):
        record = answer(renderer, prompt, "", extra_ids=[before, roles.reasoning_start, *rest])
        assert verdict_of(renderer, prompt, record) == Reason.REASONING_START_IN_OUTPUT
    repeated = answer(renderer, prompt, "", extra_ids=[roles.reasoning_start, roles.reasoning_start, *rest])
    judged = judge(prompt, repeated, roles, TOOLS, renderer.decode)
    assert (judged.verdict, judged.flags) == (OK, ("reasoning_start_repeated",))


def test_a_rejected_answer_counts_no_reasoning_and_no_calls(renderer: ChatRenderer, prompt: list[int]) -> None:
    record = answer(renderer, prompt, f"Need the tool.</think>{CALL}</think><|im_end|>")
    judged = judge(prompt, record, renderer.roles, TOOLS, renderer.decode)
    assert (judged.verdict, judged.reasoning_len, judged.tool_calls) == (Reason.REASONING_END_REPEATED, 0, 0)


def test_an_answer_with_reasoning_off_has_no_reasoning_length(renderer: ChatRenderer) -> None:
    roles = renderer.roles
    prompt = [*renderer.render_ids([{"role": "user", "content": "Hi"}], None), roles.reasoning_end]
    off_roles = type(roles)(**{**roles.__dict__, "generation_suffix": (*roles.generation_suffix, roles.reasoning_end)})
    judged = judge(prompt, answer(renderer, prompt, "Hello.<|im_end|>"), off_roles, None, renderer.decode)
    assert (judged.verdict, judged.reasoning_len) == (OK, 0)


def test_the_output_alone_is_judged_as_the_whole_record(renderer: ChatRenderer, prompt: list[int]) -> None:
    """judge_output (on-policy turns, the fleet check) without the ids as an array: the verdict judge gives."""
    roles = renderer.roles
    for text in [p.values[0] for p in VALID] + ["Hm.</think>A<|im_end|>B<|im_end|>", "Never closes.<|im_end|>"]:
        record = answer(renderer, prompt, text)
        alone = judge_output(record.output_ids, roles, TOOLS, renderer.decode, roles.opening_phase)
        whole = judge(prompt, record, roles, TOOLS, renderer.decode)
        assert (alone.verdict, alone.flags, alone.tool_calls) == (whole.verdict, whole.flags, whole.tool_calls)


def test_hundreds_of_calls_in_one_answer_are_judged_as_one_is(renderer: ChatRenderer, prompt: list[int]) -> None:
    """Each marker's count in the text against its ids' count: more than 256 of them is no markup as text."""
    calls = "".join(
        f'<|tool_call_begin|>functions.get_weather:{n}<|tool_call_argument_begin|>{{"city": "P{n}"}}<|tool_call_end|>'
        for n in range(300)
    )
    record = answer(
        renderer, prompt, f"Many.</think><|tool_calls_section_begin|>{calls}<|tool_calls_section_end|><|im_end|>"
    )
    judged = judge(prompt, record, renderer.roles, TOOLS, renderer.decode)
    assert (judged.verdict, judged.flags, judged.tool_calls) == (OK, (), 300)


def test_a_call_to_an_undeclared_function_names_the_first_ten_declared(
    renderer: ChatRenderer, prompt: list[int]
) -> None:
    declared = frozenset(f"tool_{n:02d}" for n in range(12))
    judged = judge(
        prompt, answer(renderer, prompt, f"Hm.</think>{CALL}<|im_end|>"), renderer.roles, declared, renderer.decode
    )
    first_ten = [f"tool_{n:02d}" for n in range(10)]
    assert (judged.verdict, judged.detail) == (
        Reason.TOOL_CALL_UNDECLARED,
        f"call to 'get_weather'; declared: {first_ten}",
    )
