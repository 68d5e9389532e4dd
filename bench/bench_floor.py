"""The floor: what any pipeline doing this job must spend in CPU, measured with plain library calls on the same rows.

    .venv/bin/python bench/bench_floor.py ROWS.jsonl [--rows N] [--answer-tokens 1000] [--chunk 2000]

Per chunk of rows (a shard's worth, so memory stays flat at any N), each step CPU-timed (process time: every thread
of this process, so the tokenizer's Rust threads count too):
  parse      orjson.loads per row, and the row's OpenAI messages and tools picked out (no validation)
  template   tokenizer.apply_chat_template(messages, tools=..., tokenize=False) per row: the kimi-k2.5-mini profile's
             tokenizer, loaded as the project loads it (regen.tokenizers.loading.load_tokenizer), with its kwargs
  encode     the tokenizer's batch call on the rendered texts
  request    orjson of every /generate request body (input_ids, sampling_params, rid)
  response   orjson decoding of response bodies of the answer's length (text, output_ids, meta_info as SGLang sends)
  parquet    a pyarrow table of (id, input_ids list<int32>, loss_mask list<int8>) and its zstd Parquet write
  sha256     of the written Parquet files
`run_floor(path, rows)` returns the table as a dict (bench_scale.py sets it beside the pipeline's own CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

STEPS = ("parse", "template", "encode", "request", "response", "parquet", "sha256")
SAMPLING = {"max_new_tokens": 4096, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


def messages_of(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The prompt of a row in the shapes scale_rows.py writes: everything before its last assistant turn."""
    if "messages" in row:
        messages = row["messages"]
    elif "conversations" in row:
        messages = [{"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in row["conversations"]]
    else:
        text = row.get("instruction") or row["input"]
        messages = [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:last], row.get("tools")


class Clock:
    def __init__(self) -> None:
        self.cpu = dict.fromkeys(STEPS, 0.0)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.process_time()
        try:
            yield
        finally:
            self.cpu[name] += time.process_time() - started


def response_bodies(rng: np.random.Generator, prompt_lens: list[int], answer_tokens: int, vocab: int) -> list[bytes]:
    """What /generate sends back, at the answer length: the ids, their text (~4 bytes a token) and meta_info."""
    bodies = []
    for n, prompt_len in enumerate(prompt_lens):
        length = int(rng.integers(answer_tokens // 2, answer_tokens * 3 // 2))
        ids = rng.integers(0, vocab, size=length).tolist()
        meta = {
            "id": f"{n:032x}",
            "finish_reason": {"type": "stop", "matched": ids[-1]},  # the stop token ends the ids
            "prompt_tokens": prompt_len,
            "weight_version": "default",
            "completion_tokens": length,
            "cached_tokens": 0,
            "e2e_latency": 12.5,
        }
        bodies.append(orjson.dumps({"text": "word " * (length * 4 // 5), "output_ids": ids, "meta_info": meta}))
    return bodies


def load_profile_tokenizer(profile_name: str) -> tuple[Any, dict[str, Any]]:
    from regen.config import find_profile
    from regen.tokenizers.loading import load_tokenizer

    profile = find_profile(profile_name)
    kwargs = dict(profile.chat_template_kwargs)
    if profile.chat_template:
        kwargs["chat_template"] = Path(profile.chat_template).read_text(encoding="utf-8")
    return load_tokenizer(profile.tokenizer, profile.revision, profile.trust_remote_code), kwargs


def one_chunk(
    clock: Clock,
    lines: list[bytes],
    tokenizer: Any,
    kwargs: dict[str, Any],
    answer_tokens: int,
    writer: Callable[[pa.Table], None],
) -> tuple[int, int, int]:
    rng = np.random.default_rng(len(lines))
    with clock.step("parse"):
        prompts = [messages_of(orjson.loads(line)) for line in lines]
    with clock.step("template"):
        texts = [
            tokenizer.apply_chat_template(m, tools=t, tokenize=False, add_generation_prompt=True, **kwargs)
            for m, t in prompts
        ]
    with clock.step("encode"):
        prompt_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    with clock.step("request"):
        for n, ids in enumerate(prompt_ids):
            orjson.dumps({"input_ids": ids, "sampling_params": SAMPLING, "rid": f"r{n}"})
    bodies = response_bodies(rng, [len(p) for p in prompt_ids], answer_tokens, len(tokenizer))  # not timed
    with clock.step("response"):
        answers = [orjson.loads(body)["output_ids"] for body in bodies]
    with clock.step("parquet"):
        records = [p + a for p, a in zip(prompt_ids, answers, strict=True)]
        masks = [[0] * len(p) + [1] * len(a) for p, a in zip(prompt_ids, answers, strict=True)]
        table = pa.table(
            {
                "id": pa.array([f"s{n}" for n in range(len(records))]),
                "input_ids": pa.array(records, type=pa.list_(pa.int32())),
                "loss_mask": pa.array(masks, type=pa.list_(pa.int8())),
            }
        )
        writer(table)
    return len(lines), sum(map(len, prompt_ids)), sum(map(len, answers))


def run_floor(
    paths: Sequence[Path], rows: int | None = None, answer_tokens: int = 1000, chunk: int = 2000
) -> dict[str, Any]:
    """CPU seconds per step over the first `rows` rows of the files, one after the other (all: None), and what they
    amounted to."""
    tokenizer, kwargs = load_profile_tokenizer("kimi-k2.5-mini")
    clock, counts = Clock(), [0, 0, 0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="regen-floor-") as tmp, ExitStack() as opened:
        files: list[Path] = []
        source = chain.from_iterable(opened.enter_context(path.open("rb")) for path in paths)

        def write(table: pa.Table) -> None:
            files.append(Path(tmp) / f"shard-{len(files):05d}.parquet")
            pq.write_table(table, files[-1], compression="zstd")

        lines = islice(source, rows)
        while batch := list(islice(lines, chunk)):
            for i, n in enumerate(one_chunk(clock, batch, tokenizer, kwargs, answer_tokens, write)):
                counts[i] += n
        with clock.step("sha256"):
            for file in files:
                digest = hashlib.sha256()
                with file.open("rb") as f:
                    while block := f.read(1 << 20):
                        digest.update(block)
        written = sum(f.stat().st_size for f in files)
    return {
        "rows": counts[0],
        "prompt_tokens_mean": round(counts[1] / max(1, counts[0]), 1),
        "answer_tokens_mean": round(counts[2] / max(1, counts[0]), 1),
        "parquet_bytes": written,
        "cpu_s": {k: round(v, 3) for k, v in clock.cpu.items()},
        "cpu_s_total": round(sum(clock.cpu.values()), 3),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def print_floor(floor: dict[str, Any]) -> None:
    rows = floor["rows"]
    print(
        f"floor over {rows} rows (prompt {floor['prompt_tokens_mean']} tokens, answer {floor['answer_tokens_mean']} "
        f"tokens on average; {floor['parquet_bytes'] / 2**20:.1f} MiB of Parquet)"
    )
    print(f"  {'step':<10} {'cpu_s':>10} {'us/row':>10}")
    for step, cpu in floor["cpu_s"].items():
        print(f"  {step:<10} {cpu:>10.2f} {cpu / max(1, rows) * 1e6:>10.1f}")
    print(f"  {'total':<10} {floor['cpu_s_total']:>10.2f} {floor['cpu_s_total'] / max(1, rows) * 1e6:>10.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows_files", type=Path, nargs="+")
    parser.add_argument("--rows", type=int, default=None, help="the first N rows (default: all)")
    parser.add_argument("--answer-tokens", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=2000)
    args = parser.parse_args(argv)
    print_floor(run_floor(args.rows_files, args.rows, args.answer_tokens, args.chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
