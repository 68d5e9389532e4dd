"""A /generate request as SGLang 0.5.23 reads it, and refused where it refuses it: the batch split (single, batch,
`n`, rids), sampling-parameter validation, the context checks, each refusal a 400 in the shape SGLang sends it (the
engine's {"error": {"message"}}, its request parser's {"error": "..."}, the schema check's {"message"}). The engine
that answers what passes is regen.simulator.server.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "n": 1,
    "stop_token_ids": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "sampling_seed": None,
}


# The sampling fields SGLang 0.5.23's /generate takes; any other is refused with a 400 whose `error` is a string
# (its request parser's message), not the engine's {"message": ...} (tests/e2e/test_simulator_matches_real_sglang.py).
SAMPLING_FIELDS = (
    "max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p frequency_penalty presence_penalty "
    "repetition_penalty min_new_tokens n json_schema regex ebnf structural_tag ignore_eos skip_special_tokens "
    "spaces_between_special_tokens no_stop_trim stream_interval logit_bias sampling_seed custom_params beam_width "
    "watermark choice"
).split()


class EngineError(ValueError):
    """What SGLang's engine raises as ValueError: 400 {"error": {"message": ...}}."""


class UnknownField(ValueError):
    """A sampling field SGLang does not know: 400 {"error": "unknown field ..."}."""


def schema_error(message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return web.json_response(body, status=400)


def engine_error(message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=400)


def verify_sampling(params: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """SGLang's SamplingParams.verify, the checks a client can trip."""
    for name in params:
        if name not in SAMPLING_FIELDS:
            expected = ", ".join(f"`{field}`" for field in SAMPLING_FIELDS)
            raise UnknownField(f"unknown field `{name}`, expected one of {expected}")
    merged = {**SAMPLING_DEFAULTS, **params}
    if merged["temperature"] < 0.0:
        raise EngineError(f"temperature must be a non-negative finite number, got {merged['temperature']}.")
    if not 0.0 < merged["top_p"] <= 1.0:
        raise EngineError(f"top_p must be in (0, 1], got {merged['top_p']}.")
    if merged["top_k"] < 1 and merged["top_k"] != -1:
        raise EngineError(f"top_k must be -1 (disable), or at least 1, got {merged['top_k']}.")
    if not 0.0 <= merged["min_p"] <= 1.0:
        raise EngineError(f"min_p must be in [0, 1], got {merged['min_p']}.")
    if merged["max_new_tokens"] is not None and merged["max_new_tokens"] < 0:
        raise EngineError(f"max_new_tokens must be at least 0, got {merged['max_new_tokens']}.")
    if merged["n"] < 1:
        raise EngineError(f"n must be at least 1, got {merged['n']}.")
    for token_id in merged["stop_token_ids"] or []:
        if not 0 <= token_id < vocab_size:
            raise EngineError(f"stop_token_ids contains {token_id}, outside the vocabulary of {vocab_size}.")
    return merged


def split_batch(body: dict[str, Any]) -> tuple[list[list[int]], list[dict[str, Any]], list[str | None], bool]:
    """The prompts, each one's sampling params and rid, and whether the body was a batch, as SGLang pairs them: a
    batch's single rid is suffixed `_i`, a single sampling dict serves every prompt."""
    given = [key for key in ("text", "input_ids", "input_embeds") if body.get(key) is not None]
    if len(given) != 1:
        raise EngineError("Either text, input_ids or input_embeds should be provided.")
    if given[0] != "input_ids":
        raise EngineError(f"The simulator accepts input_ids only, got {given[0]}.")
    input_ids = body["input_ids"]
    if not isinstance(input_ids, list) or not input_ids:
        raise EngineError("input_ids cannot be empty.")
    is_batch = isinstance(input_ids[0], list)
    prompts = input_ids if is_batch else [input_ids]
    if any(not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompts):
        raise EngineError("input_ids cannot be empty." if any(not p for p in prompts) else "input_ids must be ints.")
    sampling = body.get("sampling_params") or {}
    samplings = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
    if len(samplings) != len(prompts):
        raise EngineError("The number of sampling_params does not match the batch size.")
    rid = body.get("rid")
    if isinstance(rid, list):
        rids = rid
    elif is_batch and rid is not None:
        rids = [f"{rid}_{i}" for i in range(len(prompts))]
    else:
        rids = [rid] * len(prompts)
    if len(rids) != len(prompts):
        raise EngineError("The number of rids does not match the batch size.")
    return prompts, samplings, rids, is_batch


def check_context(prompt_tokens: int, max_new_tokens: int | None, context_length: int) -> None:
    """SGLang's two refusals of a request the context cannot hold: the prompt alone, or with its answer."""
    if prompt_tokens >= context_length:
        raise EngineError(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    total = prompt_tokens + (max_new_tokens or 0)
    if total > context_length:
        raise EngineError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. You "
            f"requested a total of {total} tokens: {prompt_tokens} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input messages "
            "or the completion to fit within the limit."
        )
