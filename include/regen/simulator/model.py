"""What the simulated target model says: answers shaped by the profile (Kimi-K2.5 by default), deterministic.

With thinking on (the prompt ends with the reasoning-open token) an answer is `reasoning </think> answer <EOS>`; when
the prompt declares tools, some answers are a well-formed call, in the profile's grammar, to one of them. The same
prompt and seed always give the same ids. Every token with a role (EOS, reasoning, tool-call grammar, turn markers)
comes from the profile's resolved roles, so planted defects (defects.py) follow the profile too.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from regen.chat import ChatRenderer
from regen.profiles import Profile
from regen.simulator.defects import BY_NAME, OUT_OF_VOCAB_ID, DefectModel, applies
from regen.tool_calls import write_tagged

WORDS = (
    "the user wants a clear answer so I will check each step and then explain the result with an example "
    "function value list string number loop return input output first second because therefore however "
    "let me think about the edge cases compute verify code test simple efficient"
).split()
SENTENCES = 512  # pre-encoded once: answering costs list slicing, not tokenization
TOOL_OBJECT = re.compile(r'\{\s*"(?:type|function)"\s*:')  # where a JSON tool declaration may start
TS_FUNCTION = re.compile(r"^type ([A-Za-z_][\w.-]*) = \(")
TS_PARAMETER = re.compile(r"^\s*([A-Za-z_]\w*)\??:\s*(.*?)[,;]?\s*$")
ALWAYS = -1  # defect_at of a defect that shows whatever the cut
LENGTH_HINT = re.compile(r"\[\[answer (\d+) tokens\]\]")  # with `length_hint`: the whole answer's length
HINT_TAIL = 96  # the prompt's last tokens, where its last user message's hint is (before the generation prompt)
# Tool defects validation sees when the call ends (its arguments parsed, its name looked up).
CALL_END_KINDS = frozenset(
    {"tool_call_bad_arguments", "tool_call_undeclared", "tool_call_without_tools", "tool_call_malformed"}
)


@dataclass(frozen=True)
class ModelBehaviour:
    seed: int = 0
    min_tokens: int = 16  # per part (reasoning, answer)
    max_tokens: int = 96
    # Heavy-tailed answers, as a thinking model's are: the whole answer's length (reasoning and answer, which share
    # it evenly) lognormal around this median, within the parts' bounds. None: each part uniform in them.
    length_median: int | None = None
    length_sigma: float = 1.0
    # A benchmark's on-policy turns: a later turn's prompt holds the answers before it, which no benchmark can
    # foresee, so the length a turn is to get is spelt in its own prompt (LENGTH_HINT, in its last user message).
    length_hint: bool = False
    tool_call_rate: float = 0.5  # among prompts that declare tools
    omit_think_end_rate: float = 0.0  # the known Kimi quirk: no </think> before a tool-call section
    defects: DefectModel = field(default_factory=DefectModel)


@dataclass(frozen=True)
class Answer:
    ids: list[int]  # the whole answer with no length limit, EOS included
    defect: str | None = None
    defect_at: int = ALWAYS  # the defect is in every prefix of `ids` longer than this
    variant: int = 0  # seeds the server's choices for the defects it plants in meta_info or text


class SimulatedModel:
    def __init__(self, profile: Profile, behaviour: ModelBehaviour) -> None:
        self.renderer = ChatRenderer(profile)
        self.roles = self.renderer.roles
        self.tokenizer = self.renderer.tokenizer
        self.behaviour = behaviour
        self.eos_id = self.renderer.token_id(profile.eos_tokens[0])
        self.reasoning_end = self.roles.reasoning_end
        self.vocab_size = len(self.tokenizer)
        missing = behaviour.defects.missing_roles(self.roles)
        if missing:
            raise ValueError(f"profile {profile.name!r} has no token for these defects' roles: {missing}")
        rng = random.Random(behaviour.seed)
        self.sentences = [self._encode(_sentence(rng)) for _ in range(SENTENCES)]
        self.next_turn = self._next_turn() if self.roles.role_ids else []

    def _rng(self, prompt_ids: list[int], seed: int | None, stream: str = "") -> random.Random:
        digest = hashlib.sha256()
        key = [prompt_ids, self.behaviour.seed if seed is None else seed]
        digest.update(json.dumps([*key, stream] if stream else key).encode())
        return random.Random(digest.digest())

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _prose(self, rng: random.Random, length: int | None = None) -> list[int]:
        length = length or rng.randint(self.behaviour.min_tokens, self.behaviour.max_tokens)
        ids: list[int] = []
        while len(ids) < length:
            ids += rng.choice(self.sentences)
        return ids[:length]

    def _next_turn(self) -> list[int]:
        """How the template opens a user turn (its role markers and the role's name): what a runaway answer writes."""
        marker = "\ue000"  # private use: appears nowhere else in a rendered turn
        text = self.renderer.render_text([{"role": "user", "content": marker}], None)
        ids = [i for i in self._encode(text.split(marker)[0]) if i not in self.roles.eos_ids]
        return ids if self.roles.role_ids.intersection(ids) else [min(self.roles.role_ids), *ids]

    def _declared_tools(self, prompt_ids: list[int]) -> list[dict[str, Any]]:
        """The functions the prompt declares, whatever the template: JSON tool objects (`{"type": "function",
        "function": {...}}`, as a list or one by one) wherever they appear, else a TypeScript `namespace functions`
        block (Kimi's declaration)."""
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return json_functions(text) or typescript_functions(text)

    def answer(self, prompt_ids: list[int], seed: int | None = None) -> Answer:
        """The whole answer the model would give with no length limit, EOS included, and the defect planted in it."""
        rng, defect_rng = self._rng(prompt_ids, seed), self._rng(prompt_ids, seed, "defects")
        thinking = self.roles.phase_after(prompt_ids[-len(self.roles.generation_suffix) :]) == "reasoning"
        tools = self._declared_tools(prompt_ids) if self.roles.tool_calls else []
        kind = self.behaviour.defects.draw(defect_rng)
        if kind is not None and not applies(BY_NAME[kind], bool(tools), thinking):
            kind = None  # e.g. a tool defect on a prompt with no tools: it would carry a second defect
        calls_tool = bool(tools) and rng.random() < self.behaviour.tool_call_rate
        if kind is not None and BY_NAME[kind].answer != "any":
            calls_tool = BY_NAME[kind].answer == "tool_call"
        part = self._part_length(prompt_ids, seed, thinking)
        reasoning = self._prose(rng, part) if thinking else []
        omit_end = calls_tool and thinking and rng.random() < self.behaviour.omit_think_end_rate
        end = self.reasoning_end
        close = [end] if end is not None and thinking and not omit_end and kind != "reasoning_end_missing" else []
        if calls_tool:
            tools = tools or [_synthetic_tool(defect_rng)]
            body, body_at = self._tool_call_section(rng, defect_rng, prompt_ids, tools, kind)
        else:
            body, body_at = self._prose(rng, part), ALWAYS
        ids, at = self._plant(kind, defect_rng, thinking, reasoning, close, body)
        if body_at != ALWAYS:
            at = len(reasoning) + len(close) + body_at
        return Answer([*ids, self.eos_id], kind, at, defect_rng.getrandbits(32))

    def answer_tokens(self, prompt_ids: list[int], seed: int | None = None) -> int | None:
        """With `length_median`: the whole answer's length this model gives the prompt (reasoning and answer), what
        a benchmark writes its rows' reference answers from; None without."""
        part = self._part_length(prompt_ids, seed, thinking=True)
        return None if part is None else 2 * part

    def _part_length(self, prompt_ids: list[int], seed: int | None, thinking: bool) -> int | None:
        """With `length_median`: each prose part's length, from a stream of its own (the same prompt and seed, the
        same length)."""
        b = self.behaviour
        hinted = LENGTH_HINT.findall(self.tokenizer.decode(prompt_ids[-HINT_TAIL:])) if b.length_hint else []
        if hinted:
            total = float(hinted[-1])
        elif b.length_median is None:
            return None
        else:
            total = b.length_median * math.exp(b.length_sigma * self._rng(prompt_ids, seed, "length").gauss(0.0, 1.0))
        return max(b.min_tokens, min(b.max_tokens, round(total / (2 if thinking else 1))))

    def _plant(
        self,
        kind: str | None,
        rng: random.Random,
        thinking: bool,
        reasoning: list[int],
        close: list[int],
        body: list[int],
    ) -> tuple[list[int], int]:
        """The answer before its EOS with the id-level defect in it, and the first index where the defect shows."""
        ids = [*reasoning, *close, *body]
        # Roles a kind needs are there: SimulatedModel refuses a profile that lacks them (DefectModel.missing_roles).
        inserted = {
            "reasoning_start_in_output": self.roles.reasoning_start,
            "eos_in_middle": rng.choice(sorted(self.roles.eos_ids)),
            "id_out_of_vocab": OUT_OF_VOCAB_ID,
            "reasoning_end_repeated": self.reasoning_end,
        }
        token = inserted.get(kind or "")
        if token is not None and kind == "reasoning_end_repeated":  # a second one, in the answer
            at = rng.randint(len(reasoning) + len(close), len(ids))
            return [*ids[:at], token, *ids[at:]], at
        if token is not None:  # into the first prose: the reasoning, or the answer when reasoning is off
            start, stop = (0, len(reasoning)) if thinking else (len(reasoning) + len(close), len(ids))
            at = rng.randint(min(start + 1, stop), stop)  # never at 0: a model may open its reasoning there
            return [*ids[:at], token, *ids[at:]], at
        if kind == "runaway_turn":
            at = len(ids) + next(i for i, t in enumerate(self.next_turn) if t in self.roles.role_ids)
            return [*ids, *self.next_turn, *self._prose(rng)], at
        if kind in ("reasoning_end_missing", "no_eos_at_end", "tool_section_unclosed"):
            return ids, len(ids)  # an absence: only an answer that reaches its EOS shows it
        return ids, ALWAYS

    def _tool_call_section(
        self,
        rng: random.Random,
        defect_rng: random.Random,
        prompt_ids: list[int],
        tools: list[dict[str, Any]],
        kind: str | None,
    ) -> tuple[list[int], int]:
        """One call in the profile's grammar, and where in it a tool defect shows (ALWAYS: none in the call).

        Where validation sees it: the call id when the argument token arrives, a tagged call's body and every call's
        arguments and name at the call end, and a missing end token only at the EOS.
        """
        calls = self.roles.tool_calls
        assert calls is not None  # a profile with no tool-call grammar never gets tools parsed into a call
        function = rng.choice(tools)
        arguments = _arguments(rng, function)
        name = str(function["name"])
        if kind == "tool_call_undeclared":
            name = _undeclared_name(defect_rng, {str(t.get("name")) for t in tools})
        if not calls.sectioned:
            body = self._tagged_call(calls.format, name, arguments, defect_rng, kind)
            ids = [calls.call_begin, *self._encode(body), calls.call_end]
            at = len(ids) - 1 if kind in CALL_END_KINDS else ALWAYS
            return (ids[:-1] if kind == "tool_section_unclosed" else ids), at
        assert calls.section_begin is not None and calls.section_end is not None and calls.argument_begin is not None
        assert calls.call_id is not None
        index = prompt_ids.count(calls.call_begin)
        text = json.dumps(arguments, ensure_ascii=False)
        call_id = self.renderer.profile.tool_call_id_format.format(name=name, index=index, id=f"call_{index}")
        if kind == "tool_call_bad_id":
            call_id = next(c for c in (f"call_{defect_rng.getrandbits(48):012x}", "") if not calls.call_id.fullmatch(c))
        if kind == "tool_call_bad_arguments":
            text = _bad_arguments(defect_rng, text)
        head = [calls.section_begin, calls.call_begin, *self._encode(call_id), calls.argument_begin]
        ids = [*head, *self._encode(text), calls.call_end]
        at = len(head) - 1 if kind == "tool_call_bad_id" else len(ids) - 1 if kind in CALL_END_KINDS else ALWAYS
        # Unclosed: the call itself, which SGLang's detector then loses (a section left open it reads all the same).
        return (ids[:-1] if kind == "tool_section_unclosed" else [*ids, calls.section_end]), at

    @staticmethod
    def _tagged_call(format: str, name: str, arguments: dict[str, Any], rng: random.Random, kind: str | None) -> str:
        """A tagged call's body as the template writes one (regen.tool_calls), or with the drawn defect in it."""
        quoted = json.dumps(name, ensure_ascii=False)
        if kind == "tool_call_malformed":  # the call names no function
            naming = f'"name": {quoted}, ' if format == "tagged_json" else f"<function={name}>"
            return write_tagged(format, name, arguments).replace(naming, "", 1)
        if kind == "tool_call_bad_arguments" and format == "tagged_json":
            return f'\n{{"name": {quoted}, "arguments": {_bad_arguments(rng, "{}")}}}\n'
        if kind == "tool_call_bad_arguments":  # XML: a parameter given twice
            key = next(iter(arguments), "value")
            body = write_tagged(format, name, {key: arguments.get(key, "x")})
            return body.replace("</function>", f"<parameter={key}>\nagain\n</parameter>\n</function>")
        return write_tagged(format, name, arguments)

    def decode_text(self, ids: list[int], skip_special_tokens: bool, spaces_between_special_tokens: bool) -> str:
        """`text` as the server's detokenizer writes it; with a mismatched tokenizer, as another vocabulary reads it."""
        if self.behaviour.defects.text_tokenizer_mismatch:
            ids = [(i + 1) % self.vocab_size for i in ids]  # every id read as its neighbour
        return str(
            self.tokenizer.decode(
                ids,
                skip_special_tokens=skip_special_tokens,
                spaces_between_special_tokens=spaces_between_special_tokens,
            )
        )


def json_functions(text: str) -> list[dict[str, Any]]:
    """Every `{"type": "function", "function": {"name": ...}}` object in the text (keys in any order), each once."""
    decoder, found, seen = json.JSONDecoder(), [], set()
    position = 0
    while match := TOOL_OBJECT.search(text, position):
        try:
            value, end = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            position = match.end()
            continue
        position = end
        function = value.get("function") if isinstance(value, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"] not in seen:
            seen.add(function["name"])
            found.append(function)
    return found


def typescript_functions(body: str) -> list[dict[str, Any]]:
    """Functions of a `namespace functions { type NAME = (_: { param: type, ... }) => any; }` declaration, with the
    parameters at the top level of each; nested objects and `interface` blocks (`$defs`) are not followed."""
    start = body.find("namespace functions {")
    if start < 0:
        return []
    functions: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None  # the parameters of the function being read
    depth = 0  # braces open inside the namespace
    for line in body[start:].splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("//"):
            continue
        match = TS_FUNCTION.match(stripped) if depth == 0 else None
        if match:
            current = {}
            functions.append({"name": match.group(1), "parameters": {"properties": current}})
        parameter = TS_PARAMETER.match(line)
        if current is not None and depth == 1 and parameter:
            current[parameter.group(1)] = _typescript_schema(parameter.group(2))
        depth += stripped.count("{") - stripped.count("}")
        if depth == 0:
            current = None
        if depth < 0:
            break  # the namespace closed
    return functions


def _typescript_schema(kind: str) -> dict[str, Any]:
    literals = re.findall(r'"([^"]*)"', kind)
    if kind.startswith('"') and literals:
        return {"enum": literals}
    if kind.endswith("[]") or kind.startswith("Array<"):
        return {"type": "array"}
    if kind.startswith("{"):
        return {"type": "object"}
    return {"type": kind if kind in ("number", "integer", "boolean") else "string"}


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + ". "


def _arguments(rng: random.Random, function: dict[str, Any]) -> dict[str, Any]:
    properties = (function.get("parameters") or {}).get("properties") or {}
    return {name: _fake_value(rng, schema) for name, schema in properties.items()}


def _fake_value(rng: random.Random, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in ("integer", "number"):
        return rng.randint(1, 100)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [rng.choice(WORDS)]
    if kind == "object":
        return {}
    if isinstance(schema, dict) and schema.get("enum"):
        return rng.choice(schema["enum"])
    return rng.choice(WORDS)


def _synthetic_tool(rng: random.Random) -> dict[str, Any]:
    """A function for a call in answer to a prompt that declares none."""
    return {"name": f"{rng.choice(WORDS)}_{rng.choice(WORDS)}", "parameters": {"properties": {"query": {}}}}


def _undeclared_name(rng: random.Random, declared: set[str]) -> str:
    name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
    return name if name not in declared else f"{name}_undeclared"


def _bad_arguments(rng: random.Random, arguments: str) -> str:
    """Never a JSON object: a proper prefix of one, an array, or a bare word."""
    values = list(json.loads(arguments).values())
    return rng.choice(
        (
            arguments[: max(1, len(arguments) // 2)],
            json.dumps(values or [1, 2]),
            rng.choice(WORDS),
        )
    )
