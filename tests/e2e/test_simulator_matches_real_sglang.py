"""The simulator answers as the real SGLang 0.5.23 server does (tests/real_sglang.py), request for request: status
codes, body shapes, `meta_info` keys and their types, `finish_reason` shapes, and the shape and meaning of every error.
Texts and ids differ (the models differ); what a client can rely on does not. Every case here once differed: the
simulator took an unknown sampling field and a `max_new_tokens` past the context, did not stream, sent fewer
`meta_info` keys, and named `n > 1` answers after the rid.

Not compared: an input id outside the vocabulary. The real 0.5.23 server dies of it (no range check; an IndexError in
the embedding ends the process); the simulator answers 400, and the pipeline never sends one (check_server compares
the vocabularies, generate refuses such a prompt)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from regen.simulator.request_checks import SAMPLING_FIELDS
from tests.conftest import start_simulator
from tools.real_sglang import CONTEXT, RealServer, start_real_servers

pytestmark = pytest.mark.e2e
PROMPT = [1000, 1001, 1002, 1003]


def _body(input_ids: Any = PROMPT, **sampling: Any) -> dict[str, Any]:
    return {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0.0, **sampling}}


CASES = {
    "an answer": _body(),
    "empty input_ids": _body([]),
    "a prompt longer than the context": _body([1000] * (CONTEXT + 600)),
    "max_new_tokens past the context": _body(max_new_tokens=CONTEXT + 100),
    "prompt and max_new_tokens past the context": _body([1000] * (CONTEXT - 4), max_new_tokens=8),
    "max_new_tokens 0": _body(max_new_tokens=0),
    "an unknown sampling field": _body(bogus=1),
    "temperature -1": _body(temperature=-1),
    "n 3": {**_body(n=3, temperature=0.7), "rid": "asked"},
    "a batch": {**_body([[1000, 1001], [1002, 1003]]), "rid": "batch"},
    "top_p 0": _body(top_p=0.0),
}


@pytest.fixture(scope="module")
def simulator_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("simulator")
    with start_simulator(folder, "--context-length", str(CONTEXT), "--enable-metrics") as simulator:
        yield simulator.url


def shape(value: Any) -> Any:
    """A JSON value with every leaf replaced by its type's name, and a list by its first item's shape."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def answer_of(url: str, body: dict[str, Any], timeout_s: float = 120) -> tuple[int, Any]:
    response = requests.post(f"{url}/generate", json=body, timeout=timeout_s)
    return response.status_code, response.json()


def comparable(status: int, body: Any) -> Any:
    """What a client may rely on: the status, the error's shape and the message's first words (the sentence
    names the limit it broke), or the answer's shape. A cached-prefix detail differs by cache state, not by server:
    its presence varies on the real server too (None for a cold prompt)."""
    if status != 200:
        error = body["error"]
        words = (error["message"] if isinstance(error, dict) else error).split()[:3]
        return status, "dict" if isinstance(error, dict) else "str", words
    answers = body if isinstance(body, list) else [body]
    for answer in answers:
        answer["meta_info"].pop("cached_tokens_details")
    return status, shape(body), len(answers)


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulator_answers_each_request_as_the_real_server_does(
    case: str, real_sglang: RealServer, simulator_url: str
) -> None:
    real = comparable(*answer_of(real_sglang.url, CASES[case]))
    simulated = comparable(*answer_of(simulator_url, CASES[case]))
    assert simulated == real
    assert real_sglang.alive()


def test_n_answers_each_get_an_id_of_their_own_not_the_rid(real_sglang: RealServer, simulator_url: str) -> None:
    for url in (real_sglang.url, simulator_url):
        _, answers = answer_of(url, CASES["n 3"])
        ids = [a["meta_info"]["id"] for a in answers]
        assert len(set(ids)) == 3 and "asked" not in ids, (url, ids)
        _, batch = answer_of(url, CASES["a batch"])
        assert [a["meta_info"]["id"] for a in batch] == ["batch_0", "batch_1"], url


def test_finish_reasons_have_the_real_shapes(real_sglang: RealServer, simulator_url: str) -> None:
    for url in (real_sglang.url, simulator_url):
        _, answer = answer_of(url, _body(max_new_tokens=3))
        assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        assert len(answer["output_ids"]) == answer["meta_info"]["completion_tokens"] == 3
        _, empty = answer_of(url, _body(max_new_tokens=0))
        assert empty["output_ids"] == [] and empty["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def stream_of(url: str) -> list[Any]:
    body = {**_body(max_new_tokens=5), "stream": True}
    with requests.post(f"{url}/generate", json=body, timeout=120, stream=True) as response:
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        events = [line.decode() for line in response.iter_lines() if line]
    assert all(event.startswith("data: ") for event in events)
    return [event.removeprefix("data: ") for event in events]


def test_a_stream_is_cumulative_and_ends_with_done(real_sglang: RealServer, simulator_url: str) -> None:
    seen = {}
    for url in (real_sglang.url, simulator_url):
        *chunks, done = stream_of(url)
        assert done == "[DONE]"
        parsed = [json.loads(chunk) for chunk in chunks]
        ids = [chunk["output_ids"] for chunk in parsed]
        assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids)), ids
        assert [chunk["meta_info"]["finish_reason"] for chunk in parsed[:-1]] == [None] * (len(parsed) - 1)
        assert parsed[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
        for chunk in parsed:
            chunk["meta_info"].pop("cached_tokens_details", None)
        # The first chunk, the ones between (each alike), the last: a busy server sends two tokens in one chunk at
        # times (measured: the last two, in 7 streams of 30), so the number of chunks is not the server's to keep.
        between = sorted({json.dumps(shape(chunk)) for chunk in parsed[1:-1]})
        seen[url] = [shape(parsed[0]), between, shape(parsed[-1])]
    assert seen[simulator_url] == seen[real_sglang.url]


def test_abort_request_answers_alike(real_sglang: RealServer, simulator_url: str) -> None:
    for url in (real_sglang.url, simulator_url):
        response = requests.post(f"{url}/abort_request", json={"rid": "no-such-request"}, timeout=30)
        assert (response.status_code, response.text) == (200, ""), url


def test_the_simulator_knows_the_real_servers_sampling_fields(real_sglang: RealServer) -> None:
    _, refused = answer_of(real_sglang.url, _body(bogus=1))
    assert refused["error"].endswith(", ".join(f"`{field}`" for field in SAMPLING_FIELDS))


# Asked while one long answer holds the only running slot, in this order (name, priority): admitted as they wait.
WAITING = [("a", 1), ("b", 5), ("none", None), ("d", 5), ("e", 3)]


def admission_order(url: str) -> list[str]:
    """The order the waiting requests got the running slot: one long answer takes it, the others arrive one after
    another behind it (each seen waiting before the next is sent), and each is answered in one short step after it.
    The long one has a priority within 10 of theirs: SGLang preempts a running request for one more preferred by
    more than --priority-scheduling-preemption-threshold (10), which the simulator does not."""
    import threading

    finished: list[tuple[float, str]] = []  # by when the server sent each answer: threads wake in any order
    long_body = _body(max_new_tokens=800, ignore_eos=True) | {"priority": 3}  # tens of seconds on CPU
    long = threading.Thread(target=answer_of, args=(url, long_body, 600), daemon=True)
    long.start()

    def load() -> tuple[int, int]:
        [rank] = requests.get(f"{url}/v1/loads", timeout=10).json()["loads"]
        return rank["num_running_reqs"], rank["num_waiting_reqs"]

    wait_for(lambda: load()[0] == 1)

    def ask(name: str, priority: int | None) -> None:
        body = _body(max_new_tokens=1) | ({} if priority is None else {"priority": priority})
        status, answer = answer_of(url, body, 600)  # it waits behind the long one: minutes on a loaded CPU
        assert status == 200
        finished.append((answer["meta_info"]["response_sent_to_client_ts"], name))

    threads = []
    for waiting, (name, priority) in enumerate(WAITING, 1):
        threads.append(threading.Thread(target=ask, args=(name, priority), daemon=True))
        threads[-1].start()
        wait_for(lambda waiting=waiting: load()[1] == waiting)
    assert load() == (1, len(WAITING))  # all of them waited together behind the long one
    for thread in [long, *threads]:
        thread.join(600)
    return [name for _, name in sorted(finished)]


def wait_for(condition: Any, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_priority_scheduling_admits_the_waiting_queue_as_the_real_server_does(tmp_path: Path) -> None:
    """With --enable-priority-scheduling and one running slot: the waiting requests by priority, then arrival, one
    without a priority last, in either direction (two real servers started together, one each way, and a simulator
    beside each); the flags are reported by /get_server_info alike."""
    both = ("--enable-priority-scheduling",)
    smaller = ("--schedule-low-priority-values-first",)
    real = start_real_servers(
        [tmp_path / "larger.log", tmp_path / "smaller.log"],
        extra_args=("--max-running-requests", "1", *both),
        each_args=[(), smaller],
        ready_timeout_s=600,  # two start-ups at once beside the session's own servers
    )
    try:
        for server, low_values_first in zip(real, (False, True), strict=True):
            flags = (*both, *(smaller if low_values_first else ()))
            folder = tmp_path / ("smaller" if low_values_first else "larger")
            folder.mkdir()
            slow = ("--max-running", "1", "--decode-ms-per-token", "10", "--min-tokens", "300", "--max-tokens", "300")
            with start_simulator(folder, *slow, *flags) as simulator:
                simulated, served = admission_order(simulator.url), admission_order(server.url)
                info = {u: requests.get(f"{u}/get_server_info", timeout=10).json() for u in (simulator.url, server.url)}
            expected = ["a", "e", "b", "d", "none"] if low_values_first else ["b", "d", "e", "a", "none"]
            assert served == expected  # the contract, from SGLang's scheduler: priority, then arrival; none last
            assert simulated == served
            reported = {"enable_priority_scheduling": True, "schedule_low_priority_values_first": low_values_first}
            for key, value in reported.items():
                assert info[simulator.url][key] == info[server.url][key] == value
    finally:
        for server in real:
            server.stop()
