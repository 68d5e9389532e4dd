"""N production-like prompt rows, deterministic from a seed, in the formats `format: auto` reads.

    .venv/bin/python bench/scale_rows.py OUT.jsonl --rows 1000000 [--shape production|short] [--seed 0]
        [--on-policy OUT_ON_POLICY.jsonl --on-policy-share 0.01]

`production` (default): the user's text is lognormal, median ~165 tokens of the kimi-k2.5-mini tokenizer, cut at
4,700 tokens; about 440 tokens on average once rendered (median ~250) with system prompts, history and tool
declarations (measured on 4,000 rows). 10% are multi-turn OpenAI `messages` (history with reference answers), 8%
declare tools (OpenAI function schemas; six distinct tool lists, reused, as real datasets reuse them); the rest are
single-turn rows in OpenCodeInstruct (`input` + metadata columns), OpenAI-messages, ShareGPT and Alpaca shapes.
`short`: one ~15-word instruction per row, like data/samples (~75 tokens rendered).

`--on-policy` also writes C1-style conversations (ShareGPT, 2 to 4 user turns) for a dataset with
`turns: on_policy`: `--on-policy-share` of `--rows` go there instead of the main file.

Every row starts with its own index, so no two rows are duplicates. Text is cut from one corpus of words drawn once
(numpy) at random word offsets: no per-word Python work, so 1M rows take seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

WORDS_PER_TOKEN = 0.276  # kimi-k2.5-mini (a small vocabulary) on these words: 3.6 tokens a word, measured
MEDIAN_TOKENS, SIGMA, MAX_TOKENS = 165, 1.0, 4700
CORPUS_WORDS = 4_000_000
MULTI_TURN, WITH_TOOLS = 0.10, 0.08

SYLLABLES = "ka lo mi ne ru ta se vi po da fe gu hi jo ze bar cor den fin gal hul ost pre qui res tan ver win".split()
COMMON = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do their time "
    "if will way about many then them write would like so these her long make thing see him two has look more day "
    "could go come did number sound no most people my over know water than call first who may down side been now "
    "find function return value list error test code file data class string array python java rust query table"
).split()
SYSTEMS = [
    "You are a helpful assistant.",
    "You are a careful programming tutor. Answer with working code and explain the trade-offs.",
    "You are an expert software engineer. Think step by step before you answer.",
    "You are a helpful assistant with access to functions. Use them if required.",
]


def vocabulary(rng: np.random.Generator) -> list[str]:
    """Common English words and ~3,000 made-up ones: text that tokenizes like prose, some words in pieces."""
    made = {"".join(rng.choice(SYLLABLES, size=int(rng.integers(2, 5)))) for _ in range(3000)}
    return COMMON + sorted(made)


class Corpus:
    """One long string of words; `text(n)` is n consecutive words from a random offset (a C-level slice)."""

    def __init__(self, rng: np.random.Generator) -> None:
        words = vocabulary(rng)
        # Zipf-like: the common words far more often, as in prose.
        weights = 1.0 / np.arange(1, len(words) + 1) ** 0.9
        drawn = rng.choice(len(words), size=CORPUS_WORDS, p=weights / weights.sum())
        chosen = [words[i] for i in drawn]
        self.string = " ".join(chosen)
        lengths = np.fromiter((len(w) + 1 for w in chosen), dtype=np.int64, count=len(chosen))
        self.starts = np.concatenate(([0], np.cumsum(lengths)))
        self.rng = rng

    def text(self, words: int) -> str:
        words = max(1, min(words, CORPUS_WORDS - 1))
        start = int(self.rng.integers(0, CORPUS_WORDS - words))
        return self.string[self.starts[start] : self.starts[start + words] - 1]


def tool_lists(rng: np.random.Generator, corpus: Corpus) -> list[list[dict[str, Any]]]:
    """Six distinct tool lists of one to five functions each, OpenAI schemas."""
    lists = []
    for k in range(6):
        tools = []
        for j in range(int(rng.integers(1, 6))):
            properties = {
                f"arg_{p}": {"type": ["string", "number", "boolean"][p % 3], "description": corpus.text(3)}
                for p in range(int(rng.integers(1, 5)))
            }
            function = {
                "name": f"tool_{k}_{j}",
                "description": corpus.text(int(rng.integers(3, 12))),
                "parameters": {"type": "object", "properties": properties, "required": ["arg_0"]},
            }
            tools.append({"type": "function", "function": function})
        lists.append(tools)
    return lists


class Rows:
    def __init__(self, seed: int, shape: str) -> None:
        self.rng = np.random.default_rng(seed)
        self.corpus = Corpus(self.rng)
        self.tools = tool_lists(self.rng, self.corpus)
        self.shape = shape

    def prompt_words(self, count: int) -> np.ndarray:
        if self.shape == "short":
            return self.rng.integers(12, 18, size=count)  # ~50 tokens: ~70 rendered
        tokens = np.minimum(self.rng.lognormal(np.log(MEDIAN_TOKENS), SIGMA, size=count), MAX_TOKENS)
        return np.maximum(3, (tokens * WORDS_PER_TOKEN).astype(np.int64))

    def user(self, i: int, words: int) -> str:
        return f"Request {i}: {self.corpus.text(int(words))}"

    def words(self, low_tokens: int, high_tokens: int) -> str:
        return self.corpus.text(int(self.rng.integers(low_tokens, high_tokens) * WORDS_PER_TOKEN))

    def main_rows(self, start: int, count: int) -> Iterator[dict[str, Any]]:
        words = self.prompt_words(count)
        kinds = self.rng.random(count)
        for n in range(count):
            i, kind = start + n, float(kinds[n])
            if self.shape == "short":
                yield {"input": self.user(i, words[n]), "output": "reference", "domain": "generic"}
            elif kind < MULTI_TURN:
                yield self.multi_turn(i, int(words[n]), with_tools=kind < MULTI_TURN * WITH_TOOLS)
            elif kind < MULTI_TURN + WITH_TOOLS:
                yield self.tool_row(i, int(words[n]))
            else:
                yield self.single_turn(i, int(words[n]), kind)

    def single_turn(self, i: int, words: int, kind: float) -> dict[str, Any]:
        text = self.user(i, words)
        if kind < 0.55:  # OpenCodeInstruct: the instruction, a reference answer, metadata columns
            return {
                "id": f"oci-{i}",
                "input": text,
                "output": "reference",
                "domain": "generic",
                "generation_algorithm": "self-instruct",
                "average_test_score": "1",
            }
        if kind < 0.75:
            system = SYSTEMS[i % 3]
            messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
            return {"messages": [*messages, {"role": "assistant", "content": "reference"}]}
        if kind < 0.9:
            return {"id": f"sg-{i}", "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "r"}]}
        return {"instruction": text, "input": "", "output": "reference"}

    def tool_row(self, i: int, words: int) -> dict[str, Any]:
        tools = self.tools[i % len(self.tools)]
        messages = [
            {"role": "system", "content": SYSTEMS[3]},
            {"role": "user", "content": self.user(i, words)},
            {"role": "assistant", "content": "reference"},
        ]
        return {"messages": messages, "tools": tools}

    def multi_turn(self, i: int, words: int, with_tools: bool) -> dict[str, Any]:
        """History of one to three earlier exchanges (reference answers), then the turn that is regenerated."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEMS[i % 3]}]
        for _ in range(int(self.rng.integers(1, 4))):
            messages += [
                {"role": "user", "content": self.words(10, 120)},
                {"role": "assistant", "content": self.words(50, 700)},
            ]
        messages += [{"role": "user", "content": self.user(i, words)}, {"role": "assistant", "content": "reference"}]
        row: dict[str, Any] = {"messages": messages}
        if with_tools:
            row["tools"] = self.tools[i % len(self.tools)]
        return row

    def on_policy_rows(self, start: int, count: int) -> Iterator[dict[str, Any]]:
        """C1-style ShareGPT chats: every user turn is asked again, each after the target's own earlier answers."""
        for n in range(count):
            turns = [{"from": "system", "value": SYSTEMS[n % 3]}]
            for t in range(int(self.rng.integers(2, 5))):
                text = self.user(start + n, 30) if t == 0 else self.words(10, 120)
                turns += [{"from": "human", "value": text}, {"from": "gpt", "value": "reference, off-policy"}]
            yield {"id": f"c1-{start + n}", "conversations": turns}


def write_rows(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    count = 0
    with path.open("wb", buffering=1 << 22) as out:
        for row in rows:
            out.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
            count += 1
    return count


def generate(
    out: Path, rows: int, shape: str = "production", seed: int = 0, on_policy: Path | None = None, share: float = 0.01
) -> dict[str, int]:
    """Writes the rows; returns how many went to each file."""
    source = Rows(seed, shape)
    conversations = int(rows * share) if on_policy is not None else 0
    written = {"main": write_rows(out, source.main_rows(0, rows - conversations))}
    if on_policy is not None:
        written["on_policy"] = write_rows(on_policy, source.on_policy_rows(rows - conversations, conversations))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shape", choices=["production", "short"], default="production")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--on-policy", type=Path, help="also write C1-style conversations here")
    parser.add_argument("--on-policy-share", type=float, default=0.01)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    written = generate(args.out, args.rows, args.shape, args.seed, args.on_policy, args.on_policy_share)
    print(f"{written} rows in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
