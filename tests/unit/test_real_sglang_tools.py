"""The real-server tooling without a server: the tiny model's weights answer its scripts (the same arithmetic the
server runs, in numpy), and a request-log line is read back exactly."""

from __future__ import annotations

import numpy as np
import pytest

from regen.profiles import lookup
from regen.tokenizers.fast_kimi import load_mini_tokenizer
from tools import tiny_model
from tools.real_sglang import parse_finished

# A line of SGLang 0.5.23's log at --log-requests-level 3 (fields between input_ids and sampling_params elided).
LINE = (
    "[2026-12-04 01:08:02] Finish: obj=GenerateReqInput(rid='s-1-ab12', session_id=None, text=None, "
    "input_ids=[163594, 1, 2, 163606], input_embeds=None, image_data=None, sampling_params={'temperature': 0.0, "
    "'max_new_tokens': 8, 'stop': ['x), out={']}, stream=False, lora_path=None, kv_hints=None), out={'text': "
    "'Hi.', 'output_ids': [262, 13, 163586], 'meta_info': {'id': 's-1-ab12', 'finish_reason': {'type': 'stop', "
    "'matched': 163586}, 'prompt_tokens': 4, 'completion_tokens': 3, 'cached_tokens': 2, "
    "'cached_tokens_details': None, 'e2e_latency': 0.13}}"
)


def test_a_finish_line_is_read_back_exactly() -> None:
    record = parse_finished(LINE)
    assert record == {
        "rid": "s-1-ab12",
        "input_ids": [163594, 1, 2, 163606],
        "output_ids": [262, 13, 163586],
        "text": "Hi.",
        "meta_info": {
            "id": "s-1-ab12",
            "finish_reason": {"type": "stop", "matched": 163586},
            "prompt_tokens": 4,
            "completion_tokens": 3,
            "cached_tokens": 2,
            "cached_tokens_details": None,
            "e2e_latency": 0.13,
        },
    }
    assert parse_finished(LINE.replace("Finish:", "Receive:")) is None


def test_the_tiny_models_weights_answer_its_two_scripts() -> None:
    tokenizer = load_mini_tokenizer()
    start = tokenizer.convert_tokens_to_ids("<think>")
    plain, tools = tiny_model.script_ids(tokenizer, tiny_model.flavour(lookup("kimi-k2.5-mini")), start)
    assert tokenizer.decode(plain) == "The user asks; I reply briefly</think>Here is a short answer.<|im_end|>"
    assert tokenizer.decode(tools).endswith(
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )
    marker = tokenizer.encode(tiny_model.TOOL_NAME, add_special_tokens=False)[-1]
    weights = tiny_model.weights(len(tokenizer), start, marker, plain, tools)
    eos = {plain[-1]}
    assert tiny_model.greedy(weights, start, False, eos) == plain
    assert tiny_model.greedy(weights, start, True, eos) == tools
    # Only the marker has a key and a value: without it, attention adds exactly nothing to FLAG.
    v = weights["model.layers.0.self_attn.v_proj.weight"]
    assert np.flatnonzero(v.any(axis=0)).tolist() == [tiny_model.MARK]


def test_a_token_with_two_successors_in_one_script_is_refused() -> None:
    with pytest.raises(ValueError, match="two successors in one script"):
        tiny_model.transitions(0, [5, 6, 5, 7], [])
