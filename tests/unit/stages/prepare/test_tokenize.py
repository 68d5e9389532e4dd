from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

from regen.chat import ChatRenderer
from regen.profiles import lookup
from regen.reasons import Reason
from regen.stages.prepare.normalize import Conversation, Rejection
from regen.stages.prepare.tokenize import Rendered, render_ordered
from regen.tokenizers.slow_kimi import ensure_slow_tokenizer
from tests.messages import assistant, call

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
CONVERSATIONS = [
    Conversation([{"role": "user", "content": "Hello 世界, it's 12345 o'clock\n\n  <think>?</think>"}], []),
    Conversation(
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            assistant("", "call it", [call(0, '{"city": "Paris"}', "weather")]),
            {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "functions.weather:0"},
        ],
        TOOLS,
    ),
]


def test_rendering_in_workers_keeps_input_order_and_passes_rejections_through(renderer: ChatRenderer) -> None:
    too_long = Conversation([{"role": "user", "content": "word " * 9000}], [])
    items = [(i, [*CONVERSATIONS, Rejection(Reason.DUPLICATE, "x"), too_long][i % 4]) for i in range(70)]
    in_process = list(render_ordered(items, renderer, workers=1))
    in_workers = list(render_ordered(items, renderer, workers=2, in_process_below=0))
    assert in_workers == in_process
    assert [payload for payload, _ in in_workers] == list(range(70))
    assert [type(r).__name__ for _, r in in_workers[:4]] == ["Rendered", "Rendered", "Rejection", "Rejection"]
    assert in_workers[3][1] == Rejection(
        Reason.PROMPT_TOO_LONG, f"{len(renderer.render_ids(too_long.messages, []))} tokens > 8192"
    )
    first = in_workers[0][1]
    assert isinstance(first, Rendered) and first.prompt_ids == renderer.render_ids(CONVERSATIONS[0].messages, [])


def test_the_slow_python_tokenizer_gives_the_mini_tokenizers_ids(renderer: ChatRenderer) -> None:
    profile = renderer.profile.replaced(
        name="kimi-k2.5-mini-slow", tokenizer=str(ensure_slow_tokenizer()), trust_remote_code=True
    )
    slow = ChatRenderer(profile)
    assert not slow.tokenizer.is_fast
    assert slow.roles == renderer.roles
    for conversation in CONVERSATIONS:
        ids = slow.render_ids(conversation.messages, conversation.tools)
        assert ids == renderer.render_ids(conversation.messages, conversation.tools)
        assert slow.decode(ids) == renderer.decode(ids)


def _tokenize_in_a_daemon(results: Any) -> None:
    """A daemonic process's work, as a Celery pool process runs a task: prepare's workers, and what they said."""
    import logging

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("regen.stages.prepare.tokenize").addHandler(handler)
    logging.getLogger("regen.stages.prepare.tokenize").setLevel(logging.INFO)
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    items = [(i, c) for i, c in enumerate(CONVERSATIONS)]
    rendered = list(render_ordered(items, renderer, workers=2, in_process_below=0))
    results.put((multiprocessing.current_process().daemon, said, [r for _, r in rendered]))


def test_a_daemonic_process_tokenizes_in_worker_processes(renderer: ChatRenderer) -> None:
    """Celery runs tasks in daemonic processes, which multiprocessing forbids children: prepare still starts its
    tokenizer workers there, and their ids are those of rendering in-process."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    daemon = context.Process(target=_tokenize_in_a_daemon, args=(results,), daemon=True)
    daemon.start()
    was_daemonic, said, rendered = results.get(timeout=120)
    daemon.join(30)
    assert was_daemonic is True and daemon.exitcode == 0
    assert "tokenizing with 2 worker processes (spawn, profile kimi-k2.5-mini)" in said
    assert rendered == [r for _, r in render_ordered(enumerate(CONVERSATIONS), renderer, workers=1)]


MAIN_THAT_BREAKS_WHEN_IMPORTED = """
if __name__ != "__main__":
    raise RuntimeError("the parent's __main__ was imported again in a worker")
from regen.chat import ChatRenderer
from regen.profiles import lookup
from regen.stages.prepare.normalize import Conversation
from regen.stages.prepare.tokenize import render_ordered

renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
items = [(i, Conversation([{"role": "user", "content": f"question {i}"}], [])) for i in range(40)]
print(len(list(render_ordered(items, renderer, workers=2, in_process_below=0))))
"""


def test_workers_never_import_the_parents_main_module(tmp_path: Path) -> None:
    """In an Airflow task `__main__` is the `airflow` command, whose import fails in a child of a task process."""
    script = tmp_path / "task_main.py"
    script.write_text(MAIN_THAT_BREAKS_WHEN_IMPORTED)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "40"
