"""SGLang's own chat layer as an oracle: run by the pinned SGLang environment (`make sglang-env`), never imported.

It builds `OpenAIServingChat` the way `http_server.lifespan` does, over a tokenizer loaded by SGLang's own
`get_tokenizer` and a template chosen by its own `TemplateManager`, with a stand-in only for the two objects that
need a GPU process behind them (the tokenizer manager's scheduler link and the model config, reduced to the fields
the chat layer reads). Then, line by line on stdin (JSON), it answers on stdout (JSON):

- `{"kind": "prompt", "request": BODY}`: what `/v1/chat/completions` would send the engine for BODY:
  `{"ids": [...]}` from `_validate_request` + `_process_messages`, or `{"refused": "..."}` where the server answers 400.
- `{"kind": "answer", "request": BODY, "output_ids": [...]}`: the assistant message a client receives when the
  engine returns these ids (ending in the matched EOS) for BODY: the detokenizer's trim and decode, then
  `_build_chat_response` (reasoning parser, tool-call parser, `_process_tool_call_id`).

Facts it cannot take from SGLang are stated where used: the detokenizer's text is `batch_decode` of the ids before
the matched stop id with the request's `skip_special_tokens` and `spaces_between_special_tokens` (its incremental
decode reaches the same text at the end of a request).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def restore_transformers4_imports() -> None:
    """The project's Kimi-layout stand-in imports `bytes_to_unicode` where transformers 4 kept it (regen.chat does the
    same before loading remote code); the tokenizer file is the project's, the fix is not SGLang's."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.gpt2 import tokenization_gpt2

    if not hasattr(tokenization_gpt2, "bytes_to_unicode"):
        tokenization_gpt2.bytes_to_unicode = bytes_to_unicode


class ModelConfig:
    """The fields of `ModelConfig` the chat layer reads for a text request."""

    def __init__(self, model_type: str, architecture: str, multimodal: bool) -> None:
        self.is_multimodal = multimodal
        self.hf_config = SimpleNamespace(model_type=model_type, architectures=[architecture])

    def get_default_sampling_params(self) -> dict[str, Any]:
        return {}


class TokenizerManager:
    """The fields of `TokenizerManager` the chat layer reads; `config_value` answers from the real ServerArgs."""

    def __init__(self, tokenizer: Any, model_config: ModelConfig, server_args: Any) -> None:
        self.tokenizer, self.processor, self.model_config = tokenizer, None, model_config
        self.server_args = server_args
        self.served_model_name = server_args.served_model_name or server_args.model_path

    def config_value(self, name: str) -> Any:
        return getattr(self.server_args, name)


class Oracle:
    def __init__(self, args: argparse.Namespace) -> None:
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
        from sglang.srt.parser.template_manager import TemplateManager
        from sglang.srt.runtime_context import get_context
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

        restore_transformers4_imports()
        server_args = ServerArgs(
            model_path=args.tokenizer,
            trust_remote_code=args.trust_remote_code,
            tool_call_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            chat_template=args.chat_template,
            device="cpu",
            skip_server_warmup=True,
        )
        get_context().set_server_args(server_args)
        tokenizer = get_tokenizer(args.tokenizer, trust_remote_code=args.trust_remote_code)
        self.multimodal = args.multimodal
        manager = TokenizerManager(
            tokenizer, ModelConfig(args.model_type, args.architecture, args.multimodal), server_args
        )
        templates = TemplateManager()
        templates.initialize_templates(manager, model_path=args.tokenizer, chat_template=args.chat_template)
        self.tokenizer = tokenizer
        self.chat = OpenAIServingChat(manager, templates)

    def _request(self, body: dict[str, Any]) -> Any:
        from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

        return ChatCompletionRequest(**{"model": "oracle", **body})

    def prompt(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            request = self._request(body)
        except ValueError as e:  # pydantic's ValidationError: FastAPI answers it with a 400
            return {"refused": f"request: {e}"}
        error = self.chat._validate_request(request)
        if error:
            return {"refused": error}
        try:
            result = self.chat._process_messages(request, self.multimodal)
        except ValueError as e:  # serving_chat answers a ValueError from here with a 400
            return {"refused": str(e)}
        if self.multimodal and not self.chat._can_reuse_text_only_prompt_ids(result, True):
            raise RuntimeError("a multimodal path that re-tokenizes the text: not what this oracle models")
        return {"ids": [int(i) for i in result.prompt_ids]}

    def answer(self, body: dict[str, Any], output_ids: list[int]) -> dict[str, Any]:
        request = self._request(body)
        self.chat._process_messages(request, self.multimodal)  # sets skip_special_tokens as serving does
        finish = {"type": "stop", "matched": output_ids[-1]}
        kwargs = request.chat_template_kwargs or {}  # protocol.py to_sampling_params: the detokenizer's flag
        text = self.tokenizer.batch_decode(
            [output_ids[:-1]],
            skip_special_tokens=request.skip_special_tokens,
            spaces_between_special_tokens=kwargs.get("spaces_between_special_tokens", True),
        )[0]
        ret = [
            {
                "text": text,
                "output_ids": output_ids,
                "meta_info": {
                    "id": "oracle",
                    "finish_reason": finish,
                    "prompt_tokens": 1,
                    "completion_tokens": len(output_ids),
                    "cached_tokens": 0,
                    "weight_version": "default",
                },
            }
        ]
        response = self.chat._build_chat_response(request, ret, created=0)
        choice = response.choices[0]
        message = choice.message.model_dump()
        calls = [
            {"id": c["id"], "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for c in message.get("tool_calls") or []
        ]
        return {
            "content": message.get("content"),
            "reasoning_content": message.get("reasoning_content"),
            "tool_calls": calls,
            "finish_reason": choice.finish_reason,
        }

    def handle(self, case: dict[str, Any]) -> dict[str, Any]:
        if case["kind"] == "prompt":
            return self.prompt(case["request"])
        return self.answer(case["request"], case["output_ids"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a tokenizer directory, loaded as --model-path")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--chat-template", default=None, help="a .jinja file, as --chat-template")
    parser.add_argument("--tool-call-parser", required=True)
    parser.add_argument("--reasoning-parser", required=True)
    parser.add_argument("--model-type", required=True, help="hf_config.model_type of the served model")
    parser.add_argument("--architecture", required=True, help="hf_config.architectures[0] of the served model")
    parser.add_argument("--multimodal", action="store_true", help="the served model is a vision-language model")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    # Answers go out on the original stdout alone: anything the libraries print goes to stderr.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    oracle = Oracle(args)
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    for line in sys.stdin:
        case = json.loads(line)
        try:
            answer = oracle.handle(case)
        except Exception:  # the test shows what SGLang raised, case by case
            answer = {"crashed": traceback.format_exc(limit=6)}
        answers.write(json.dumps(answer, ensure_ascii=False) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
