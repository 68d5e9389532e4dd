"""On-policy multi-turn regeneration: each turn's prompt is rendered from the answers the model gave for the turns
before it; a tool call that is not the dataset's ends the conversation with its reason; a killed generate resumes at
each conversation's first unfinished turn, so no turn is generated twice and none is skipped.

How an answer reads back into a message follows SGLang's chat endpoint (sglang 0.5.23,
srt/parser/reasoning_parser.py `_detect_and_parse_impl`: no strip since PR 24251, and the tool-call section start
ends reasoning implicitly for kimi_k2; srt/function_call/kimik2_detector.py: content is the text before the
section, arguments as generated; srt/entrypoints/openai/serving_chat.py `_process_tool_call_id`: a Kimi call's id is
`functions.{name}:{calls in the request's history + its index}`, and content is "" when only calls were written).
How the next prompt shows it is the template's rule (KIMI_K25.md: history before the last plain answer shows
`<think></think>{content}`, the turn being answered with tool results shows its reasoning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import ShardManifest
from regen.on_policy import DatasetTurn, Ended, assistant_message, dataset_turns, next_prompt, turn_count
from regen.reasons import Reason
from regen.samples import TURN, sample_of, turn_id
from regen.sglang.client import answer_id_of
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.stages.prepare.formats import normalize_row
from regen.stages.publish.publish import run_publish
from regen.storage import Storage
from regen.ui.catalog import Catalog
from tests.conftest import KILLABLE_GENERATE, finish_shards, prepare_sample, raw_answers
from tests.turns import by_conversation, check_histories
from tools.devstack import Simulator, start_simulator

DATASET = "C1_multiturn"
OPEN = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def _call(call_id: str, city: str, spelling: str = '{{"city": "{}"}}') -> dict[str, Any]:
    arguments = spelling.format(city)
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def _read(renderer: ChatRenderer, text: str, history: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any] | Ended:
    """An answer the model wrote as text (its EOS appended), read back as the chat endpoint reads it."""
    roles = renderer.roles
    ids = [*renderer.tokenizer.encode(text, add_special_tokens=False), min(roles.eos_ids)]
    return assistant_message(
        ids, list(roles.generation_suffix), roles, renderer.profile, renderer.decode, history, tools
    )


def test_a_tool_calling_answer_reads_back_as_the_message_the_template_renders(renderer: ChatRenderer) -> None:
    """Round trip: the template renders an assistant message of the turn being answered as `<think>R</think>C` and
    its section; the model writes the same after the prompt's `<think>`. Reading that answer gives the message."""
    history = [{"role": "user", "content": "Weather in Oslo and Lima?"}]
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": " two cities \n",  # kept as written: no strip
        "tool_calls": [_call("functions.get_weather:0", "Oslo"), _call("functions.get_weather:1", "Lima")],
    }
    rendered = renderer.tokenizer.apply_chat_template(
        [*history, message], tools=[WEATHER], tokenize=False, **renderer.template_kwargs
    )
    written = rendered.split("<|im_assistant|>assistant<|im_middle|><think>", 1)[1].removesuffix("<|im_end|>")
    assert _read(renderer, written, history, [WEATHER]) == message


def test_reading_follows_sglang_on_whitespace_missing_think_end_and_call_ids(renderer: ChatRenderer) -> None:
    plain = _read(renderer, "\nthinking \n</think>\n\nThe answer. ", [], [])
    assert plain == {"role": "assistant", "content": "\n\nThe answer. ", "reasoning_content": "\nthinking \n"}
    # Kimi's known quirk: no </think> before the section; the section start ends the reasoning, content is "".
    section = OPEN.replace(":0", ":7") + '{"city":"Lima"}<|tool_call_end|><|tool_calls_section_end|>'
    history = [{"role": "assistant", "content": "", "tool_calls": [_call("functions.get_weather:0", "Oslo")]}]
    quirk = _read(renderer, f"I should call it{section}", history, [WEATHER])
    assert not isinstance(quirk, Ended)
    assert (quirk["content"], quirk["reasoning_content"]) == ("", "I should call it")
    # The id SGLang gives: one call in the history, so index 1, whatever index the model wrote; arguments as written.
    assert quirk["tool_calls"] == [_call("functions.get_weather:1", "Lima", '{{"city":"{}"}}')]


@pytest.mark.parametrize(
    "text,why",
    [
        ("never stops thinking", "reasoning never ended"),
        ("done</think>Hi<|im_user|>user", "role_token_in_output"),
        (f'</think>{OPEN}{{"city": <|tool_call_end|><|tool_calls_section_end|>', "are not JSON"),
        (f"</think>{OPEN}{{}}", "not closed"),
    ],
)
def test_an_answer_a_client_could_not_send_back_ends_the_conversation(
    renderer: ChatRenderer, text: str, why: str
) -> None:
    ended = _read(renderer, text, [], [WEATHER])
    assert isinstance(ended, Ended) and ended.reason == Reason.EARLIER_TURN_UNUSABLE and why in ended.detail


def test_turns_are_cut_at_each_assistant_answer_and_at_an_unanswered_end() -> None:
    user, tool = {"role": "user", "content": "u"}, {"role": "tool", "tool_call_id": "a", "content": "r"}
    plain, calling = {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": []}
    assert dataset_turns([plain, user, plain]) == [DatasetTurn([plain], [user]), DatasetTurn([plain], [])]
    assert dataset_turns([calling, tool, plain]) == [DatasetTurn([calling], [tool]), DatasetTurn([plain], [])]
    assert dataset_turns([plain, user]) == [DatasetTurn([plain], [user]), DatasetTurn([], [])]
    assert dataset_turns([]) == [DatasetTurn([], [])]
    assert turn_count(json.dumps([plain, user, plain, user])) == 3


def test_the_datasets_tool_results_follow_only_the_datasets_own_calls() -> None:
    prompt = [{"role": "user", "content": "Weather in Oslo?"}]
    recorded = {"role": "assistant", "content": "", "tool_calls": [_call("w1", "Oslo")]}
    result = {"role": "tool", "tool_call_id": "w1", "name": "get_weather", "content": "-3"}
    turn = DatasetTurn([recorded], [result, {"role": "user", "content": "Thanks"}])
    same = {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("functions.get_weather:0", "Oslo", '{{"city":"{}"}}')],
    }
    follows = next_prompt(prompt, same, turn)  # the same call, spelt otherwise: its recorded result answers it
    assert follows == [*prompt, same, {**result, "tool_call_id": "functions.get_weather:0"}, turn.then[1]]
    for other in (
        {**same, "tool_calls": [_call("x", "Lima")]},  # other arguments
        {**same, "tool_calls": [_call("x", "Oslo"), _call("y", "Oslo")]},  # another call besides
        {"role": "assistant", "content": "No call."},  # none
    ):
        ended = next_prompt(prompt, other, turn)
        assert isinstance(ended, Ended) and ended.reason == Reason.DIVERGED_TOOL_CALL
        assert 'the dataset called get_weather({"city": "Oslo"})' in ended.detail
    chat = DatasetTurn([{"role": "assistant", "content": "Hi"}], [{"role": "user", "content": "More"}])
    calls = next_prompt(prompt, same, chat)
    assert isinstance(calls, Ended) and "the dataset called no tool" in calls.detail


def test_an_on_policy_conversation_is_one_prompt_carrying_the_rest() -> None:
    row = {
        "conversations": [
            {"from": "human", "value": "a"},
            {"from": "gpt", "value": "b"},
            {"from": "human", "value": "c"},
        ]
    }
    [conversation] = normalize_row(row, "auto", "{id}", "on_policy")  # type: ignore[misc]
    assert conversation.messages == [{"role": "user", "content": "a"}]
    assert [m["content"] for m in conversation.later] == ["b", "c"]
    [final] = normalize_row(row, "auto", "{id}", "final")  # type: ignore[misc]
    assert conversation.sample_id != final.sample_id  # two conversations that open alike are not duplicates


@pytest.fixture(scope="module")
def quirky_simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    """A simulator that sometimes calls without closing its reasoning (Kimi's quirk), as the real model does."""
    with start_simulator(tmp_path_factory.mktemp("sim"), "--omit-think-end-rate", "0.3") as sim:
        yield sim


def test_on_policy_run_renders_each_turn_from_the_regenerated_answers(
    tmp_path: Path, renderer: ChatRenderer, quirky_simulator: Simulator
) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, DATASET, shard_size=10)
    assert prepared.stats.kept == 24 and prepared.stats.dropped_by_reason == {"duplicate": 1, "no_user_turn": 1}
    assert sum(s.num_answers or 0 for s in prepared.shards) == 66  # what progress and the Drafter data page count
    location = prepared.location
    waiting = Catalog(storage, location.profile).summary(location.dataset, location.version)
    assert waiting is not None and (waiting["done"], waiting["prompts"]) == (0, 66)
    shards = finish_shards(prepared.shards, storage, renderer, quirky_simulator.url)
    sent = {answer_id_of(r["rid"]): r for r in quirky_simulator.records()}
    raw = [a for s in shards for a in raw_answers(storage, s.raw_key)]
    rejected = [r for s in shards for r in _rejected(storage, s)]

    # Every turn of every conversation is answered or ended with its reason, exactly once.
    answered = {a["id"] for a in raw}
    assert len(answered) == len(raw) and not answered & {r["id"] for r in rejected}
    conversations = by_conversation([*answered, *(r["id"] for r in rejected)])
    assert len(conversations) == 24 and sum(map(len, conversations.values())) == 66
    assert all(sorted(turns) == list(range(1, len(turns) + 1)) for turns in conversations.values())
    # What was sent is what raw/ keeps, and each turn's prompt holds the answers regenerated before it.
    assert all(sent[a["id"]]["input_ids"] == a["prompt_ids"] for a in raw)
    assert set(sent) == answered  # a turn after the end of its conversation is never requested
    assert check_histories({i: sent[i] for i in answered}, renderer.tokenizer) > 40
    # Tool divergence: the turns after it are rejected with the calls that differed; other conversations went on
    # past the dataset's own call, answered with its recorded result.
    diverged = [r for r in rejected if r["reason"] == "diverged_tool_call"]
    assert diverged and {r["reason"] for r in rejected} == {"diverged_tool_call"}
    assert all("the dataset called" in r["detail"] for r in diverged)
    after_results = [a for a in raw if "## Return of functions.get_weather:0" in renderer.decode(a["prompt_ids"])]
    assert after_results
    quirks = [a["id"] for a in raw if "</think>" not in renderer.decode(a["output_ids"])]
    assert any(_next_turn(i) in answered for i in quirks)  # a call without </think> was followed like any other

    # Each turn is a training record of its own (prompt + output ids), verified whole and published.
    assert sum(s.stats["validate"].kept for s in shards) == len(raw)
    published = run_publish(prepared, storage, fleet=[], run_id="manual__on_policy")
    assert published["records"] == len(raw)
    assert published["stages"]["generate"]["dropped_by_reason"] == {"diverged_tool_call": len(diverged)}


def _rejected(storage: Storage, shard: ShardManifest) -> list[dict[str, Any]]:
    key = shard.keys.rejected("generate")
    return [json.loads(line) for line in storage.get_bytes(key).splitlines()] if storage.exists(key) else []


def _next_turn(answer_id: str) -> str:
    sample, _, turn = answer_id.rpartition("/turn-")
    return f"{sample}/turn-{int(turn) + 1}"


def test_sigkill_mid_conversation_resumes_each_at_its_first_unfinished_turn(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    slow = start_simulator(tmp_path, "--decode-ms-per-token", "4", "--max-running", "4")
    try:
        prepared, storage = prepare_sample(tmp_path / "root", renderer, DATASET, shard_size=100)
        [shard] = prepared.shards
        checkpoints = storage.root / shard.keys.checkpoints

        def later_turns_checkpointed() -> bool:
            return any("/turn-2" in p.read_text() for p in checkpoints.glob("part-*.jsonl"))

        killable = [sys.executable, "-c", KILLABLE_GENERATE, json.dumps(shard.to_dict()), str(storage.root)]
        process = subprocess.Popen([*killable, slow.url, renderer.profile.name])
        deadline = time.monotonic() + 60
        while not later_turns_checkpointed() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        killed_at = time.time()
        before = {answer_id_of(line["rid"]) for line in slow.records()}
        parts = [json.loads(line) for p in checkpoints.glob("part-*.jsonl") for line in p.read_text().splitlines()]
        kept = {part["id"] for part in parts if "id" in part}
        generated = run_generate(ShardManifest.from_dict(shard.to_dict()), storage, _settings(slow), renderer)
        requests = slow.records()
    finally:
        slow.stop()
    answers = raw_answers(storage, generated.raw_key)
    everything = [a["id"] for a in answers] + [r["id"] for r in _rejected(storage, generated)]
    assert len(everything) == len(set(everything)) == 66  # every turn once, none skipped
    turns = by_conversation(everything)
    midway = [c for c, finished in by_conversation(list(kept)).items() if len(finished) < len(turns[c])]
    assert midway, "the kill came after some conversations' turns were checkpointed and before their last"
    # No checkpointed turn was asked for again; only the killed try's requests in flight were.
    after = Counter(answer_id_of(r["rid"]) for r in requests if r["answered_at"] > killed_at)
    assert not kept & set(after)
    redone = {i for i in after if i in before}
    assert len(redone) <= 4, redone  # the killed try's requests in flight (concurrency 4)
    # The resumed turns were rendered from the checkpointed answers of the turns before them.
    sent = {answer_id_of(r["rid"]): r for r in requests}
    assert check_histories({a["id"]: sent[a["id"]] for a in answers}, renderer.tokenizer) > 40


def _settings(sim: Simulator) -> GenerateSettings:
    return GenerateSettings([sim.url], Sampling().as_params(), concurrency=4, checkpoint_every=4, checkpoint_s=0.2)


def test_an_on_policy_shard_needs_the_renderer(tmp_path: Path, renderer: ChatRenderer) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, DATASET, shard_size=100)
    with pytest.raises(ValueError, match="needs the profile's renderer"):
        run_generate(prepared.shards[0], storage, GenerateSettings(["http://127.0.0.1:9"], {}))


def test_a_qwen_xml_call_reads_back_to_the_same_rendering_and_typed_arguments() -> None:
    """Qwen3.6 (tagged_xml, SGLang's qwen3_coder detector: parameter values converted by their declared type, the
    text before the call kept as is): the answer read back renders as the message it was written from."""
    from regen.config import load_config
    from regen.on_policy import calls_of

    qwen = ChatRenderer(load_config().profile("qwen3.6"))
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": schema}}]
    history = [{"role": "user", "content": "Forecast for Oslo, 3 days?"}]
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "forecast", "arguments": {"city": "Oslo", "days": 3}},
    }
    message = {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "Oslo, three days.",
        "tool_calls": [call],
    }
    rendered = qwen.tokenizer.apply_chat_template(
        [*history, message], tools=tools, tokenize=False, **qwen.template_kwargs
    )
    written = rendered.split(qwen.profile.generation_suffix)[-1].removesuffix("\n").removesuffix("<|im_end|>")
    ids = [*qwen.tokenizer.encode(written, add_special_tokens=False), min(qwen.roles.eos_ids)]
    suffix = list(qwen.roles.generation_suffix)
    read = assistant_message(ids, suffix, qwen.roles, qwen.profile, qwen.decode, history, tools)
    assert not isinstance(read, Ended)
    assert calls_of([read]) == [("forecast", {"city": "Oslo", "days": 3})]  # 3, not "3": compared with the dataset
    follow_up = {"role": "user", "content": "And tomorrow?"}
    assert qwen.render_ids([*history, read, follow_up], tools) == qwen.render_ids([*history, message, follow_up], tools)


def test_a_resumed_turn_whose_prompt_now_renders_otherwise_stops_the_shard() -> None:
    from regen.errors import FinalError
    from regen.on_policy import check_resumed
    from regen.records import RawAnswer

    finished = RawAnswer(id="c/turn-2", output_ids=[7], meta_info={}, prompt_ids=[1, 2, 3])
    check_resumed(finished, [1, 2, 3])
    with pytest.raises(FinalError, match="renders differently now"):  # a template changed between two tries
        check_resumed(finished, [1, 2, 4])


CONCURRENCY = 16  # over four servers: least-outstanding routing alone scatters a conversation's turns


def _turns_through_four_servers(folder: Path, renderer: ChatRenderer, affinity: bool) -> tuple[float, float]:
    """The on-policy sample through four fresh simulators: the share of later turns sent to the endpoint that
    answered the turn before, and the share of prompt tokens the servers' prefix caches held."""
    prepared, storage = prepare_sample(folder / "root", renderer, DATASET, shard_size=100)
    with contextlib.ExitStack() as servers:
        urls = [servers.enter_context(start_simulator(folder, "--decode-ms-per-token", "2")).url for _ in range(4)]
        settings = GenerateSettings(urls, Sampling().as_params(), concurrency=CONCURRENCY)
        shards = [run_generate(s, storage, dataclasses.replace(settings, endpoint_affinity=affinity), renderer)
                  for s in prepared.shards]  # fmt: skip
    answers = {a["id"]: a for s in shards for a in raw_answers(storage, s.raw_key)}
    later = [a for a in answers.values() if _previous_turn(a["id"]) in answers]
    same = sum(a["endpoint"] == answers[_previous_turn(a["id"])]["endpoint"] for a in later) / len(later)
    reports = [s.generation for s in shards if s.generation]
    return same, sum(r.cached_tokens for r in reports) / sum(r.prompt_tokens for r in reports)


def _previous_turn(answer_id: str) -> str:
    return turn_id(sample_of(answer_id), int(answer_id.rpartition(TURN)[2]) - 1)


def test_a_conversations_turns_go_back_to_the_server_holding_its_history(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    same_off, cached_off = _turns_through_four_servers(tmp_path / "off", renderer, affinity=False)
    same_on, cached_on = _turns_through_four_servers(tmp_path / "on", renderer, affinity=True)
    # Measured: 0.5 to 0.87 -> 1.0 of the later turns on the server that answered the turn before, 0.35 to 0.43 ->
    # 0.46 cached (least-busy routing is sticky by chance when few requests overlap; test_fleet.py has the rule's
    # own deterministic test, bench_affinity.py the figures at 64 in flight).
    assert same_on >= 0.9 and same_on >= same_off and cached_on >= cached_off, (
        same_off,
        same_on,
        cached_off,
        cached_on,
    )


def test_an_answer_with_an_id_outside_the_vocabulary_ends_its_conversation(renderer: ChatRenderer) -> None:
    """Found by generated runs on a fleet that answers with defects: an on-policy turn whose answer held an id past
    the vocabulary failed its generate task on every try (IndexError) instead of ending its conversation."""
    roles = renderer.roles
    ids = [*renderer.tokenizer.encode("Fine.", add_special_tokens=False), 2**31 + 1, min(roles.eos_ids)]
    history = [{"role": "user", "content": "Hi"}]
    ended = assistant_message(ids, list(roles.generation_suffix), roles, renderer.profile, renderer.decode, history, [])
    assert isinstance(ended, Ended) and ended.reason == Reason.EARLIER_TURN_UNUSABLE
    assert f"id {2**31 + 1} outside the vocabulary" in ended.detail


@pytest.mark.parametrize(("order", "base"), [("larger", None), ("smaller", 7), (None, 3)])
def test_chain_priority_raises_each_turn_by_the_work_its_conversation_has_left(
    tmp_path: Path, renderer: ChatRenderer, order: str | None, base: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a fleet that admits by priority (its order from check_server), each turn carries the run's priority (0 when
    null) moved towards the preferred end by a level a doubling of the reference tokens its conversation has left
    from it on (a turn without a reference: the median turn's), at most 9; without an order, the run's own priority,
    as ever. The sample's references are a few tokens long: a level is a doubling from 1 token here, not 128."""
    import math

    from regen.stages.generate import conversations

    monkeypatch.setattr(conversations, "CHAIN_UNIT", 1)
    prepared, storage = prepare_sample(tmp_path / "root", renderer, DATASET, shard_size=100, by_length=True)
    smaller_first = ("--schedule-low-priority-values-first",) if order == "smaller" else ()
    flags = ("--enable-priority-scheduling", *smaller_first)
    with start_simulator(tmp_path, *flags) as simulator:
        settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=4, priority=base)
        [shard] = [run_generate(s, storage, dataclasses.replace(settings, priority_order=order), renderer)
                   for s in prepared.shards]  # fmt: skip
        sent = {answer_id_of(r["rid"]): r for r in simulator.records()}
    references = {t: n for shard in prepared.shards for t, n in reference_turns(storage, shard).items()}
    known = sorted(n for n in references.values() if n is not None)
    median = known[len(known) // 2]
    levels = set()
    for answer_id, record in sent.items():
        sample, turn = sample_of(answer_id), int(answer_id.rpartition(TURN)[2])
        later = [n for t, n in references.items() if sample_of(t) == sample and int(t.rpartition(TURN)[2]) >= turn]
        left = sum(median if n is None else n for n in later)
        level = min(max(int(math.log2(max(left, 1))), 0), 9)
        levels.add(level)
        if order is None:
            assert record["priority"] == base
        else:
            assert record["priority"] == (base or 0) + (level if order == "larger" else -level), answer_id
    assert len(levels) > 2  # turns with more and less work after them were asked
    assert shard.stats["generate"].kept == len(sent)


def reference_turns(storage: Storage, shard: ShardManifest) -> dict[str, int | None]:
    """Every turn of the shard's conversations and its reference answer's length (prepare's turn_tokens), or None."""
    from regen.records import read_prompts

    prompts = read_prompts(storage, shard.prompts_key, ["id", "prompt_ids", "messages", "tools", "turn_tokens"])
    turns = prompts.answer_ids(lambda later: turn_count(later))
    return {t: prompts.turn_tokens(t) for t in turns}
