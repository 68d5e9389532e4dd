"""A tiny Qwen3ForCausalLM whose weights are written here so that greedy decoding answers in the target's format.

SGLang's CPU path runs the Qwen3 architecture (not Kimi's MLA), so the model is a one-layer Qwen3 over a profile's
tokenizer. Its weights make it a scripted state machine over a few dozen tokens, decoded greedily:

- Every token's embedding has 1 in the BIAS dimension. Each token the script emits (and the prompt's last token, the
  generation suffix's end) also has 1 in a dimension of its own (its STATE). The marker token (the last token of the
  tool name `get_weather`, which only a prompt declaring that tool holds) has 1 in MARK.
- Layer 0's attention has one working head: every query (from BIAS) attends with a score of about 64 to a key that
  only the marker has (from MARK); only the marker has a value, which o_proj writes into FLAG. So FLAG is about 7 at
  every position after a declared `get_weather` and exactly 0 otherwise. The query and key use the head's last
  dimension, the lowest RoPE frequency under rope_theta 1e9, so the score does not drift with distance. The MLP and
  the second residual branch are zero.
- lm_head maps each STATE to its successor's row with weight L=20, so each token predicts the next one of the script.
  Where the two scripts part (after the prompt and after `</think>`), the tools script's successor also gets
  +FLAG - 3 BIAS: it wins when FLAG is set, loses by 3 when it is not.

The two scripts (SCRIPTS): with `get_weather` declared, reasoning, `</think>`, one well-formed call of get_weather
with `{"city": "Paris"}`, EOS; without, reasoning, `</think>`, content, EOS. Every scripted token is spelled with a
token used nowhere else in the scripts (any byte-level spelling decodes to the same text), so each has one successor.
`build_model` checks the result by running the same arithmetic in numpy before writing it.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from regen.profiles import Profile, SectionCalls

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 128, 4, 2, 16, 128
BIAS, MARK, FLAG, FIRST_STATE = 0, 1, 2, 3
L_NEXT, M_FLAG, FLAG_THRESHOLD = 20.0, 1.0, 3.0
QK_GAIN = 4.0  # q_norm and k_norm weights: score = 16 * gain^2 / sqrt(head_dim) = 64 for the marker, 0 for others
TOOL_NAME, TOOL_CITY = "get_weather", "Paris"


@dataclass(frozen=True)
class Flavour:
    """What differs between profiles: the text around the script, in the profile's own markup."""

    reasoning_end: str
    eos: str
    plain: tuple[str, ...]  # after the prompt, without the tool: text and special tokens, in order
    tools: tuple[str, ...]


PLAIN = ("The user asks; I reply briefly", "Here is a short answer.")  # reasoning, content
TOOLS_REASONING = "I should call the weather tool"


def flavour(profile: Profile) -> Flavour:
    """The two scripts in the profile's own markup: its reasoning end, its first EOS and its tool-call grammar."""
    end, eos, calls = profile.reasoning_end, profile.eos_tokens[0], profile.tool_calls
    if end is None or calls is None:
        raise ValueError(f"{profile.name} has no reasoning end or no tool-call grammar; the tiny model needs both")
    if isinstance(calls, SectionCalls):
        call_id = calls.call_id_format.format(name=TOOL_NAME, index=0, id="call_0")
        call = (calls.call_begin, call_id, calls.argument_begin, json.dumps({"city": TOOL_CITY}), calls.call_end)
        section = (calls.section_begin, *call, calls.section_end)
        return Flavour(end, eos, (PLAIN[0], end, PLAIN[1], eos), (TOOLS_REASONING, end, *section, eos))
    # Tagged calls (Qwen's): its pre-tokenizer keeps every newline a token of its own, and "\n" ends the generation
    # suffix, so the script has none but the "\n\n" after the reasoning end.
    if calls.format == "tagged_json":
        body = json.dumps({"name": TOOL_NAME, "arguments": {"city": TOOL_CITY}})
    else:
        body = f"<function={TOOL_NAME}><parameter=city>{TOOL_CITY}</parameter></function>"
    plain = (PLAIN[0], end, "\n\n" + PLAIN[1], eos)
    return Flavour(end, eos, plain, (TOOLS_REASONING, end, "\n\n", calls.call_begin, body, calls.call_end, eos))


class Speller:
    """Spells text with tokens not used before: the longest unused vocabulary token that starts the rest of the text."""

    def __init__(self, tokenizer: Any, reserved: set[int]) -> None:
        self.tokenizer = tokenizer
        added = set(tokenizer.added_tokens_decoder)
        ordinary = [i for i in range(len(tokenizer)) if i not in added]
        self.by_text: dict[str, list[int]] = {}
        for token_id, text in zip(ordinary, tokenizer.batch_decode([[i] for i in ordinary]), strict=True):
            if text and text.isascii() and not text.startswith("<|unused_rank_"):
                self.by_text.setdefault(text, []).append(token_id)
        self.longest = max(map(len, self.by_text))
        self.used = set(reserved)

    def special(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or self.tokenizer.decode([token_id]) != token:
            raise ValueError(f"{token!r} is not one token of this tokenizer")
        return int(token_id)

    def spell(self, parts: list[str | int], budget: int = 200_000) -> list[int]:
        """Every part (text, or an id placed as it is) in order, each text token a token used nowhere else: a
        depth-first search, longest tokens first (a character that recurs needs a different token each time)."""
        out: list[int] = []
        steps = [0]

        def search(part: int, at: int) -> bool:
            steps[0] += 1
            if steps[0] > budget:
                raise ValueError("no spelling found within the search budget: shorten the script")
            if part == len(parts):
                return True
            current = parts[part]
            if isinstance(current, int):
                out.append(current)
                if search(part + 1, 0):
                    return True
                out.pop()
                return False
            if at == len(current):
                return search(part + 1, 0)
            for size in range(min(self.longest, len(current) - at), 0, -1):
                for token in self.by_text.get(current[at : at + size], []):
                    if token in self.used:
                        continue
                    self.used.add(token)
                    out.append(token)
                    if search(part, at + size):
                        return True
                    out.pop()
                    self.used.discard(token)
            return False

        if not search(0, 0):
            raise ValueError(f"cannot spell {parts} with distinct tokens")
        return out


def script_ids(tokenizer: Any, flavour: Flavour, start: int) -> tuple[list[int], list[int]]:
    """The plain and the tools script as ids: within a script, every token but the special ones is used once."""
    speller = Speller(tokenizer, {start})
    specials = {t for t in flavour.plain + flavour.tools if t.startswith("<") and t.endswith(">") and " " not in t}
    specials = {t for t in specials if tokenizer.convert_tokens_to_ids(t) not in (None, tokenizer.unk_token_id)}

    def parts(script: tuple[str, ...]) -> list[str | int]:
        return [speller.special(t) if t in specials else t for t in script]

    plain = speller.spell(parts(flavour.plain))
    speller.used = {start}  # a token may recur in the other script: where they part, FLAG picks the successor
    return plain, speller.spell(parts(flavour.tools))


def transitions(start: int, plain: list[int], tools: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """(unconditional successor, successor when FLAG is set) per state token. The two scripts may share a token only
    where they part (the prompt's last token, `</think>`) or at their end (EOS)."""
    always: dict[int, int] = {}
    flagged: dict[int, int] = {}
    for script, is_tools in ((plain, False), (tools, True)):
        sequence = [start, *script]
        for source, target in itertools.pairwise(sequence):
            if is_tools and source in always and always[source] != target:
                flagged[source] = target
            elif source in always and always[source] != target:
                raise ValueError(f"token {source} has two successors in one script")
            else:
                always[source] = target
    return always, flagged


def weights(vocab: int, start: int, marker: int, plain: list[int], tools: list[int]) -> dict[str, np.ndarray]:
    always, flagged = transitions(start, plain, tools)
    states = sorted(always)
    if FIRST_STATE + len(states) > HIDDEN:
        raise ValueError(f"{len(states)} script states do not fit in hidden size {HIDDEN}")
    state_dim = {token: FIRST_STATE + i for i, token in enumerate(states)}
    f32 = np.float32
    embed = np.zeros((vocab, HIDDEN), f32)
    embed[:, BIAS] = 1.0
    for token, dim in state_dim.items():
        embed[token, dim] = 1.0
    embed[marker, MARK] = 1.0
    head = np.zeros((vocab, HIDDEN), f32)
    for source, target in always.items():
        head[target, state_dim[source]] += L_NEXT
    for source, target in flagged.items():
        head[target, state_dim[source]] += L_NEXT
        head[target, FLAG] += M_FLAG
        head[target, BIAS] -= FLAG_THRESHOLD * M_FLAG
    q = np.zeros((HEADS * HEAD_DIM, HIDDEN), f32)
    k = np.zeros((KV_HEADS * HEAD_DIM, HIDDEN), f32)
    v = np.zeros((KV_HEADS * HEAD_DIM, HIDDEN), f32)
    o = np.zeros((HIDDEN, HEADS * HEAD_DIM), f32)
    last = HEAD_DIM - 1  # head 0's lowest RoPE frequency, in both the NeoX and the interleaved layout
    q[last, BIAS], k[last, MARK], v[0, MARK], o[FLAG, 0] = 1.0, 1.0, 1.0, 1.0
    prefix = "model.layers.0."
    return {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": head,
        "model.norm.weight": np.ones(HIDDEN, f32),
        prefix + "input_layernorm.weight": np.ones(HIDDEN, f32),
        prefix + "post_attention_layernorm.weight": np.ones(HIDDEN, f32),
        prefix + "self_attn.q_proj.weight": q,
        prefix + "self_attn.k_proj.weight": k,
        prefix + "self_attn.v_proj.weight": v,
        prefix + "self_attn.o_proj.weight": o,
        prefix + "self_attn.q_norm.weight": np.full(HEAD_DIM, QK_GAIN, f32),
        prefix + "self_attn.k_norm.weight": np.full(HEAD_DIM, QK_GAIN, f32),
        prefix + "mlp.gate_proj.weight": np.zeros((INTERMEDIATE, HIDDEN), f32),
        prefix + "mlp.up_proj.weight": np.zeros((INTERMEDIATE, HIDDEN), f32),
        prefix + "mlp.down_proj.weight": np.zeros((HIDDEN, INTERMEDIATE), f32),
    }


def greedy(tensors: dict[str, np.ndarray], start: int, flag: bool, eos: set[int], limit: int = 200) -> list[int]:
    """The model's greedy answer after a prompt ending in `start`, by the same arithmetic (FLAG about 7 after a
    declared tool; the RMS norms scale a position's logits uniformly, so argmax ignores them)."""
    embed, head = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"]
    out: list[int] = []
    token = start
    while len(out) < limit:
        x = embed[token].copy()
        if flag:
            x[FLAG] += 7.0
        token = int(np.argmax(head @ x))
        out.append(token)
        if token in eos:
            break
    return out


def config(vocab: int, eos_ids: list[int], bos_id: int | None, context: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e9,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e9},
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "use_cache": True,
    }


def build_model(directory: Path, tokenizer: Any, flavour: Flavour, start: int, context: int = 16384) -> None:
    """Write config.json, generation_config.json and model.safetensors into `directory` (the tokenizer's files are
    the caller's). `start`: the last token of the profile's generation suffix."""
    from safetensors.numpy import save_file

    vocab = -(-len(tokenizer) // 256) * 256  # padded like real checkpoints; every tokenizer id is in range
    marker = tokenizer.encode(TOOL_NAME, add_special_tokens=False)[-1]
    plain, tools = script_ids(tokenizer, flavour, start)
    if marker in plain:
        raise ValueError(f"the marker token {marker} is in the plain script")
    tensors = weights(vocab, start, marker, plain, tools)
    eos = {plain[-1], tools[-1]}
    for flag, expected in ((False, plain), (True, tools)):
        if (got := greedy(tensors, start, flag, eos)) != expected:
            raise AssertionError(f"the weights answer {got[:40]}, not the script {expected[:40]}")
    eos_ids = sorted({int(tokenizer.convert_tokens_to_ids(flavour.eos)), int(tokenizer.eos_token_id), *eos})
    bos = tokenizer.bos_token_id
    (directory / "config.json").write_text(json.dumps(config(vocab, eos_ids, bos, context), indent=1))
    generation = {"eos_token_id": eos_ids, "do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=1))
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
