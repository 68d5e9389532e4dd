"""What the simulated target model says: Kimi-K2.5-shaped answers on the profile's tokenizer, deterministic.

With thinking on (the prompt ends with the reasoning-open token) an answer is `reasoning </think> answer <EOS>`; when
the prompt declares tools, some answers are a well-formed tool-call section naming one of them. The same prompt and
seed always give the same ids.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from regen.chat import ChatRenderer, ModelProfile

WORDS = (
    "the user wants a clear answer so I will check each step and then explain the result with an example "
    "function value list string number loop return input output first second because therefore however "
    "let me think about the edge cases compute verify code test simple efficient"
).split()
SENTENCES = 512  # pre-encoded once: answering costs list slicing, not tokenisation
TOOL_DECLARE_OPEN = "<|im_system|>tool_declare<|im_middle|>"


@dataclass(frozen=True)
class ModelBehaviour:
    seed: int = 0
    min_tokens: int = 16  # per part (reasoning, answer)
    max_tokens: int = 96
    tool_call_rate: float = 0.5  # among prompts that declare tools
    omit_think_end_rate: float = 0.0  # the known Kimi quirk: no </think> before a tool-call section


class SimulatedModel:
    def __init__(self, profile: ModelProfile, behaviour: ModelBehaviour) -> None:
        self.renderer = ChatRenderer(profile)
        self.tokenizer = self.renderer.tokenizer
        self.behaviour = behaviour
        self.eos_id = self.renderer.token_id(profile.eos_tokens[0])
        self.reasoning_end = self.renderer.roles.reasoning_end
        self.vocab_size = len(self.tokenizer)
        rng = random.Random(behaviour.seed)
        self.sentences = [self._encode(_sentence(rng)) for _ in range(SENTENCES)]

    def _rng(self, prompt_ids: list[int], seed: int | None) -> random.Random:
        digest = hashlib.sha256()
        digest.update(json.dumps([prompt_ids, self.behaviour.seed if seed is None else seed]).encode())
        return random.Random(digest.digest())

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _prose(self, rng: random.Random) -> list[int]:
        length = rng.randint(self.behaviour.min_tokens, self.behaviour.max_tokens)
        ids: list[int] = []
        while len(ids) < length:
            ids += rng.choice(self.sentences)
        return ids[:length]

    def _declared_tools(self, prompt_ids: list[int]) -> list[dict[str, Any]]:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        start = text.find(TOOL_DECLARE_OPEN)
        if start < 0:
            return []
        body = text[start + len(TOOL_DECLARE_OPEN) : text.find("<|im_end|>", start)]
        try:
            tools = json.loads(body)
        except json.JSONDecodeError:
            return []  # TypeScript-rendered declarations: the simulator just answers in prose
        return [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]

    def _tool_call_section(self, rng: random.Random, prompt_ids: list[int], tools: list[dict[str, Any]]) -> list[int]:
        function = rng.choice(tools)
        index = prompt_ids.count(self.tokenizer.convert_tokens_to_ids("<|tool_call_begin|>"))
        properties = (function.get("parameters") or {}).get("properties") or {}
        arguments = {name: _fake_value(rng, schema) for name, schema in properties.items()}
        section = (
            "<|tool_calls_section_begin|><|tool_call_begin|>"
            f"functions.{function['name']}:{index}<|tool_call_argument_begin|>"
            f"{json.dumps(arguments, ensure_ascii=False)}<|tool_call_end|><|tool_calls_section_end|>"
        )
        return self._encode(section)

    def complete(self, prompt_ids: list[int], seed: int | None = None) -> list[int]:
        """The whole answer the model would give with no length limit, EOS included."""
        rng = self._rng(prompt_ids, seed)
        thinking = self.reasoning_end is not None and prompt_ids[-1] != self.reasoning_end
        tools = self._declared_tools(prompt_ids)
        calls_tool = bool(tools) and rng.random() < self.behaviour.tool_call_rate
        ids: list[int] = []
        if thinking:
            ids += self._prose(rng)
            if not (calls_tool and rng.random() < self.behaviour.omit_think_end_rate):
                ids.append(self.reasoning_end)  # type: ignore[arg-type]
        ids += self._tool_call_section(rng, prompt_ids, tools) if calls_tool else self._prose(rng)
        return [*ids, self.eos_id]


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + ". "


def _fake_value(rng: random.Random, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in ("integer", "number"):
        return rng.randint(1, 100)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [rng.choice(WORDS)]
    if isinstance(schema, dict) and schema.get("enum"):
        return rng.choice(schema["enum"])
    return rng.choice(WORDS)
