"""The simulator plants every output defect validation must catch: exactly the drawn one, where the record says.

One subprocess simulator (`--defect-rate 1`) answers a mixed batch over HTTP; each answer's recorded defect is
checked in its ids, meta_info and text. The rest runs the model and the app in-process.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from aiohttp.test_utils import TestClient, TestServer

from regen.chat import ChatRenderer, TokenRoles
from regen.profiles import lookup
from regen.simulator.__main__ import defect_model, main, parse_args
from regen.simulator.app import build_app
from regen.simulator.defects import BY_NAME, DEFECT_KINDS, DEFECTS, OUT_OF_VOCAB_ID, DefectModel
from regen.simulator.model import ModelBehaviour, SimulatedModel, typescript_functions
from regen.simulator.server import LatencyModel, SimulatorState
from regen.tool_calls import ToolCallIds
from tests.conftest import Simulator, start_simulator

# What the pipeline sends: text must then be exactly decode(output_ids, skip_special_tokens=False).
PIPELINE = {
    "max_new_tokens": 4096,
    "temperature": 0.7,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "no_stop_trim": True,
}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
TS_TOOLS = (
    "# Tools\n\n## functions\nnamespace functions {\n// Weather of a city\ntype get_weather = (_: {\n"
    '  // the city\n  city: string,\n  days?: number,\n  unit?: "c" | "f",\n  where: {\n    lat: number\n  },\n'
    "  [k: string]: never\n}) => any;\ninterface Point {\n  x?: number\n}\n"
    "// no arguments\ntype ping = (_: {}) => any;\n}\n"
)


@dataclass(frozen=True)
class Sent:
    """One answer as the client saw it, with what the simulator recorded planting."""

    prompt_ids: list[int]
    declares_tools: bool
    body: dict[str, Any]
    defect: str | None

    @property
    def output_ids(self) -> list[int]:
        return list(self.body["output_ids"])

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.body["meta_info"])


def calls(roles: TokenRoles) -> ToolCallIds:
    assert roles.tool_calls is not None
    return roles.tool_calls


def call_parts(sent: Sent, roles: TokenRoles, renderer: ChatRenderer) -> tuple[str, str]:
    """The decoded call id and arguments of the answer's (first) tool call."""
    out, grammar = sent.output_ids, calls(roles)
    begin, argument, end = out.index(grammar.call_begin), out.index(grammar.argument_begin), out.index(grammar.call_end)
    return renderer.decode(out[begin + 1 : argument]), renderer.decode(out[argument + 1 : end])


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


Check = Callable[[Sent, TokenRoles, ChatRenderer], bool]
CHECKS: dict[str, Check] = {
    "reasoning_start_in_output": lambda s, roles, r: roles.reasoning_start in s.output_ids[1:],
    "runaway_turn": lambda s, roles, r: bool(roles.role_ids.intersection(s.output_ids[:-1])),
    "eos_in_middle": lambda s, roles, r: bool(roles.eos_ids.intersection(s.output_ids[:-1])),
    "no_eos_at_end": lambda s, roles, r: (
        s.output_ids[-1] not in roles.eos_ids
        and s.meta["finish_reason"]["type"] == "stop"
        and s.meta["finish_reason"]["matched"] in roles.eos_ids
    ),
    "reasoning_end_repeated": lambda s, roles, r: s.output_ids.count(roles.reasoning_end) == 2,
    "reasoning_end_missing": lambda s, roles, r: (
        roles.reasoning_end not in s.output_ids and calls(roles).section_begin not in s.output_ids
    ),
    "tool_section_unclosed": lambda s, roles, r: (
        s.declares_tools
        and calls(roles).section_begin in s.output_ids
        and calls(roles).section_end not in s.output_ids
        and calls(roles).call_end not in s.output_ids
    ),
    "tool_call_bad_id": lambda s, roles, r: (
        s.declares_tools and not calls(roles).call_id.fullmatch(call_parts(s, roles, r)[0])
    ),
    "tool_call_bad_arguments": lambda s, roles, r: s.declares_tools and not is_json_object(call_parts(s, roles, r)[1]),
    "tool_call_undeclared": lambda s, roles, r: (
        s.declares_tools and not call_parts(s, roles, r)[0].startswith("functions.get_weather:")
    ),
    "tool_call_without_tools": lambda s, roles, r: (
        not s.declares_tools
        and calls(roles).call_id.fullmatch(call_parts(s, roles, r)[0]) is not None
        and is_json_object(call_parts(s, roles, r)[1])
        and s.output_ids[-2] == calls(roles).section_end
    ),
    "id_out_of_vocab": lambda s, roles, r: max(s.output_ids) == OUT_OF_VOCAB_ID,
    "count_mismatch": lambda s, roles, r: abs(s.meta["completion_tokens"] - len(s.output_ids)) == 1,
    "prompt_tokens_mismatch": lambda s, roles, r: s.meta.get("prompt_tokens") != len(s.prompt_ids),
    "text_mismatch": lambda s, roles, r: s.body["text"] != r.decode(s.output_ids),
}


def agrees_with_itself(sent: Sent, renderer: ChatRenderer, but: str | None = None) -> bool:
    """The server-side checks an answer passes unless its one defect is that check."""
    roles = renderer.roles
    return (
        (but == "text_mismatch" or sent.body["text"] == renderer.decode(sent.output_ids))
        and (but == "count_mismatch" or sent.meta["completion_tokens"] == len(sent.output_ids))
        and (but == "prompt_tokens_mismatch" or sent.meta.get("prompt_tokens") == len(sent.prompt_ids))
        and (but == "no_eos_at_end" or sent.output_ids[-1] in roles.eos_ids)
        and (but == "id_out_of_vocab" or max(sent.output_ids) < roles.vocab_size)
    )


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, renderer: ChatRenderer) -> Iterator[tuple[Simulator, list[Sent]]]:
    """Prompts with tools, without, and with reasoning turned off, two samples each, every answer drawing a defect."""
    sim = start_simulator(tmp_path_factory.mktemp("defects"), "--defect-rate", "1", "--tool-call-rate", "0.5")
    try:
        prompts: list[tuple[list[int], bool]] = []
        for i in range(150):
            tools = [TOOL] if i % 2 else None
            prompt = renderer.render_ids([{"role": "user", "content": f"question {i}"}], tools)
            if i % 5 == 0:  # `<think></think>`: reasoning off
                prompt = [*prompt, renderer.roles.reasoning_end]
            prompts.append((prompt, tools is not None))
        body = {"input_ids": [p for p, _ in prompts], "sampling_params": {**PIPELINE, "n": 2, "sampling_seed": 11}}
        answers = requests.post(f"{sim.url}/generate", json={**body, "rid": "mix"}, timeout=60).json()
        records = {r["rid"]: r["defect"] for r in sim.records()}
        sent = [Sent(*prompts[i // 2], answer, records[answer["meta_info"]["id"]]) for i, answer in enumerate(answers)]
        yield sim, sent
    finally:
        sim.stop()


# Kinds Kimi's grammar can carry; the tagged-only ones are planted and judged in test_tool_call_grammars.py.
KIMI_KINDS = [kind for kind in DEFECT_KINDS if "sections" in BY_NAME[kind].formats]


def test_every_kind_is_declared_once_with_a_check_a_flag_and_a_reason() -> None:
    assert set(CHECKS) == set(KIMI_KINDS) and len(DEFECT_KINDS) == len(set(DEFECT_KINDS)) == 16
    assert set(DEFECT_KINDS) - set(KIMI_KINDS) == {"tool_call_malformed"}
    args = vars(parse_args([]))
    assert all(args[kind.flag[2:].replace("-", "_")] is None for kind in DEFECTS)  # one flag per kind, unset
    assert BY_NAME["runaway_turn"].reason.value == "role_token_in_output"


@pytest.mark.parametrize("kind", [pytest.param(kind, id=kind) for kind in KIMI_KINDS])
def test_the_planted_defect_is_in_the_answer(
    mixed: tuple[Simulator, list[Sent]], renderer: ChatRenderer, kind: str
) -> None:
    planted = [s for s in mixed[1] if s.defect == kind]
    assert planted, f"no answer drew {kind}"
    for sent in planted:
        assert CHECKS[kind](sent, renderer.roles, renderer), (kind, renderer.decode(sent.output_ids))
        assert agrees_with_itself(sent, renderer, but=kind)  # and no second defect rides along


def test_answers_without_a_defect_are_clean(mixed: tuple[Simulator, list[Sent]], renderer: ChatRenderer) -> None:
    clean = [s for s in mixed[1] if s.defect is None]
    assert clean  # tool kinds drawn for prompts with no tools (and the reverse) plant nothing
    roles = renderer.roles
    for sent in clean:
        assert agrees_with_itself(sent, renderer)
        assert not any(CHECKS[kind](sent, roles, renderer) for kind in ("runaway_turn", "eos_in_middle"))
        thinking = sent.prompt_ids[-1] != roles.reasoning_end
        assert sent.output_ids.count(roles.reasoning_end) <= (1 if thinking else 0)


def test_stats_and_record_count_the_planted_defects(mixed: tuple[Simulator, list[Sent]]) -> None:
    sim, sent = mixed
    assert sim.stats()["defects"] == dict(Counter(s.defect for s in sent if s.defect))


def test_the_same_prompt_and_seed_carry_the_same_defect(mixed: tuple[Simulator, list[Sent]]) -> None:
    """A retried request gets the same defect back: a count mismatch is one on every attempt."""
    sim, sent = mixed
    first = sent[:40]  # the first 20 prompts, two samples each: the same seeds as in the mixed batch
    prompts = [s.prompt_ids for s in first[::2]]
    body = {"input_ids": prompts, "sampling_params": {**PIPELINE, "n": 2, "sampling_seed": 11}}
    again = requests.post(f"{sim.url}/generate", json={**body, "rid": "again"}, timeout=60).json()
    records = {r["rid"]: r["defect"] for r in sim.records()}
    assert [records[a["meta_info"]["id"]] for a in again] == [s.defect for s in first]
    assert [a["output_ids"] for a in again] == [s.output_ids for s in first]


def model_with(rates: dict[str, float], **behaviour: Any) -> SimulatedModel:
    return SimulatedModel(lookup("kimi-k2.5-mini"), ModelBehaviour(defects=DefectModel(rates), **behaviour))


@pytest.mark.parametrize(
    "rates,message",
    [
        pytest.param({"runaway_turn": -0.1}, "must be >= 0", id="negative"),
        pytest.param({"runaway_turn": 0.6, "text_mismatch": 0.6}, "sum to at most 1", id="sum"),
        pytest.param({"runaway": 0.1}, "unknown defect kinds ['runaway']", id="unknown"),
    ],
)
def test_rates_are_validated(rates: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        DefectModel(rates)


def test_cli_spreads_defect_rate_over_kinds_without_their_own() -> None:
    model = defect_model(parse_args(["--defect-rate", "0.7", "--defect-runaway-turn-rate", "0.3"]))
    assert model.rates["runaway_turn"] == 0.3
    assert model.rates["text_mismatch"] == pytest.approx(0.7 / (len(DEFECT_KINDS) - 1))
    assert sum(model.rates.values()) == pytest.approx(1.0)
    with pytest.raises(SystemExit, match="sum to at most 1"):
        main(["--defect-rate", "1.5"])


def test_the_defect_stream_leaves_other_answers_unchanged(renderer: ChatRenderer) -> None:
    clean, defective = model_with({}), model_with({"runaway_turn": 0.5, "text_mismatch": 0.2})
    planted = 0
    for i in range(20):
        prompt = renderer.render_ids([{"role": "user", "content": f"q {i}"}], [TOOL] if i % 2 else None)
        answer = defective.answer(prompt, seed=3)
        if answer.defect in (None, "text_mismatch"):  # planted by the server, not in the ids
            assert answer.ids == clean.answer(prompt, seed=3).ids
        planted += answer.defect == "runaway_turn"
    assert 0 < planted < 20


@pytest.mark.parametrize(
    "kind", ["reasoning_start_in_output", "runaway_turn", "eos_in_middle", "reasoning_end_repeated", "id_out_of_vocab"]
)
def test_defect_at_points_at_the_planted_token(renderer: ChatRenderer, kind: str) -> None:
    model, roles = model_with({kind: 1.0}), renderer.roles
    expected = {
        "reasoning_start_in_output": {roles.reasoning_start},
        "runaway_turn": roles.role_ids,
        "eos_in_middle": roles.eos_ids,
        "reasoning_end_repeated": {roles.reasoning_end},
        "id_out_of_vocab": {OUT_OF_VOCAB_ID},
    }[kind]
    for thinking in (True, False):
        prompt = renderer.render_ids([{"role": "user", "content": "hi"}], None)
        prompt = prompt if thinking else [*prompt, roles.reasoning_end]
        answer = model.answer(prompt)
        if kind == "reasoning_end_repeated" and not thinking:
            assert answer.defect is None  # with reasoning off any reasoning end is a different defect
            continue
        assert answer.defect == kind and answer.ids[answer.defect_at] in expected and answer.defect_at > 0
        assert answer.ids[-1] == model.eos_id


def post(state: SimulatorState, body: dict[str, Any]) -> Any:
    async def run() -> Any:
        async with TestClient(TestServer(build_app(state))) as client:
            return await (await client.post("/generate", json=body)).json()

    return asyncio.run(run())


def state_of(model: SimulatedModel) -> SimulatorState:
    return SimulatorState(model, lookup("kimi-k2.5-mini"), LatencyModel(), 16384, None)


def test_a_cut_before_the_defect_sends_a_clean_answer(renderer: ChatRenderer) -> None:
    model = model_with({"runaway_turn": 1.0})
    prompt = renderer.render_ids([{"role": "user", "content": "hi"}], None)
    at = model.answer(prompt).defect_at
    state = state_of(model)
    cut = post(state, {"input_ids": prompt, "sampling_params": {**PIPELINE, "max_new_tokens": at}})
    whole = post(state, {"input_ids": prompt, "sampling_params": PIPELINE})
    assert cut["meta_info"]["finish_reason"]["type"] == "length"
    assert not renderer.roles.role_ids.intersection(cut["output_ids"])
    assert renderer.roles.role_ids.intersection(whole["output_ids"][:-1])
    assert state.counters.defects == {"runaway_turn": 1}


def test_text_is_the_decode_of_output_ids(renderer: ChatRenderer) -> None:
    state = state_of(model_with({}))
    prompt = renderer.render_ids([{"role": "user", "content": "hi"}], [TOOL])
    for limit in (1, 7, 4096):
        body = post(state, {"input_ids": prompt, "sampling_params": {**PIPELINE, "max_new_tokens": limit}})
        assert body["text"] == renderer.decode(body["output_ids"])
    accents = renderer.tokenizer.encode("été", add_special_tokens=False)
    cut = accents[:1]  # byte-level BPE: a cut inside a character decodes to U+FFFD, as SGLang's final text does
    assert state.model.decode_text(cut, False, False) == renderer.decode(cut)


def test_text_tokenizer_mismatch_covers_every_answer_probes_included(renderer: ChatRenderer) -> None:
    model = SimulatedModel(lookup("kimi-k2.5-mini"), ModelBehaviour(defects=DefectModel({}, True)))
    state = state_of(model)
    prompt = renderer.render_ids([{"role": "user", "content": "hi"}], None)
    for limit in (1, 4096):  # a one-token probe, and a whole answer
        body = post(state, {"input_ids": prompt, "sampling_params": {**PIPELINE, "max_new_tokens": limit}})
        assert body["text"] != renderer.decode(body["output_ids"])
    assert state.counters.defects == {}  # a server setting, not a planted defect


def test_typescript_tool_declarations(renderer: ChatRenderer) -> None:
    assert typescript_functions(TS_TOOLS) == [
        {
            "name": "get_weather",
            "parameters": {
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "number"},
                    "unit": {"enum": ["c", "f"]},
                    "where": {"type": "object"},
                }
            },
        },
        {"name": "ping", "parameters": {"properties": {}}},
    ]
    text = renderer.render_text([{"role": "user", "content": "weather?"}], None)
    prompt = renderer.tokenizer.encode(
        f"<|im_system|>tool_declare<|im_middle|>{TS_TOOLS}<|im_end|>{text}", add_special_tokens=False
    )
    model = SimulatedModel(lookup("kimi-k2.5-mini"), ModelBehaviour(tool_call_rate=1.0))
    names = set()
    for seed in range(8):
        sent = Sent(prompt, True, {"output_ids": model.answer(prompt, seed).ids, "meta_info": {}}, None)
        call_id, arguments = call_parts(sent, renderer.roles, renderer)
        names.add(call_id.split(":")[0])
        assert set(json.loads(arguments)) == ({"city", "days", "unit", "where"} if "weather" in call_id else set())
    assert names == {"functions.get_weather", "functions.ping"}


def test_a_defect_the_profile_cannot_plant_is_refused(renderer: ChatRenderer) -> None:
    model = DefectModel({"runaway_turn": 1.0})
    assert model.missing_roles(renderer.roles) == {}
    stripped = TokenRoles(generation_suffix=(1,), eos_ids=frozenset({2}), vocab_size=10)
    assert model.missing_roles(stripped) == {"runaway_turn": ["role_ids"]}
