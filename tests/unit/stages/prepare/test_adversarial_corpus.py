"""Prepare over an adversarial corpus of more than 10,000 rows, in a child process whose whole process tree (the
tokenizer workers included) is watched for memory: it never crashes, stays under the memory target, rejects every
bad row with its reason, and accounts for every line, item and Parquet row. Sources that cannot be read at all (a
truncated gzip, a damaged Parquet file) fail that dataset with the file's name and leave no prompts behind.

The corpus is built deterministically: a seeded generator for the known kinds of hostile row, and rows that
hypothesis generates (derandomized, so every run sees the same corpus).
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings

from regen.reasons import Reason
from regen.stages.prepare.sources import MAX_DEPTH, MAX_ROW_BYTES
from tests.unit.stages.prepare.test_prepare_properties import rows as hypothesis_rows

# Peak RSS of prepare's whole process tree (the task process and its two tokenizer workers), whatever the input.
# Measured on this corpus: about 600 MB, most of it three interpreters with transformers loaded; 1,070 MB when the
# over-long messages were tokenized rather than rejected by their byte length (docs/data.md, "Hostile input").
MEMORY_TARGET_MB = 1024
PREPARE_REASONS = {reason.value for reason in Reason if reason.stage == "prepare"}


class Corpus:
    """Lines written to the corpus files, each with the reason it must be rejected for (None: any outcome, as long
    as it is accounted for; "kept": a well-formed row)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.expected: dict[str, str | None] = {}  # "file:line" or "file[item]" or "file:row n" -> expectation

    def jsonl(self, name: str, lines: list[tuple[bytes, str | None]], *, bom: bool = False, crlf: bool = False) -> None:
        end = b"\r\n" if crlf else b"\n"
        body = b"".join(line + end for line, _ in lines)
        (self.folder / name).write_bytes((b"\xef\xbb\xbf" if bom else b"") + body)
        for number, (_, expect) in enumerate(lines, start=1):
            self.expected[f"{name}:{number}"] = expect


def good(rng: random.Random, n: int) -> bytes:
    kind = n % 4
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "λ", "数据", "🙂"]) for _ in range(8))
    if kind == 0:
        return json.dumps({"messages": [{"role": "user", "content": f"{n}: {words}"}]}).encode()
    if kind == 1:
        return json.dumps({"conversations": [{"from": "human", "value": f"{n} {words}"}]}).encode()
    if kind == 2:
        return json.dumps({"instruction": f"{n} {words}", "input": "", "output": "x"}, ensure_ascii=False).encode()
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    return json.dumps({"messages": [{"role": "user", "content": f"call {n}"}], "tools": [tool]}).encode()


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


WRONG_TYPES = [
    b'{"messages": 7}',
    b'{"messages": "hello"}',
    b'{"messages": null}',
    b'{"messages": {"role": "user"}}',
    b'{"messages": [7, 8]}',
    b'{"messages": [{"role": 3, "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": {"a": 1}}]}',
    b'{"messages": [{"role": "user", "content": [1, 2, 3]}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "tools": "not a list"}',
    b'{"messages": [{"role": "user", "content": "x"}], "tools": [5]}',
    b'{"messages": [{"role": "assistant", "content": null, "tool_calls": 4}]}',
    b'{"conversations": [{"from": 1, "value": 2}]}',
    b'{"conversations": "text"}',
    b'{"instruction": ["a"], "output": 1}',
    b'{"prompt": 12}',
    b'{"prompt": [{"role": null}]}',
    b"[1, 2, 3]",
    b'"just a string"',
    b"42",
    b"null",
    b"true",
    b"{}",
]


def user_row(payload: bytes, content: bytes) -> bytes:
    return b'{"messages": [{"role": "user", "content": "' + payload + b" " + content + b'"}]}'


def hostile_lines(rng: random.Random, count: int) -> list[tuple[bytes, str | None]]:
    """`count` lines cycling through every kind of hostile row, with well-formed rows between them."""
    prose = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(200_000))
    lines: list[tuple[bytes, str | None]] = []
    for n in range(count):
        kind, payload = n % 16, f"row {n}".encode()
        if kind <= 5:
            lines.append((good(rng, n), "kept"))
        elif kind == 6:
            depth = rng.choice([MAX_DEPTH + 1, 500, 985, 5_000])
            where = rng.choice([b'"tools": ', b'"meta": ', b'"messages": '])
            lines.append((b'{"input": "' + payload + b'", ' + where + nested(depth) + b"}", "too_deep"))
        elif kind == 7:
            depth = rng.choice([MAX_DEPTH + 1, 2_000])
            lines.append(
                (b'{"input": "' + payload + b'", "m": ' + b'{"a": ' * depth + b"1" + b"}" * (depth + 1), "too_deep")
            )
        elif kind == 8:
            digits = rng.choice([4_301, 5_000, 100_000])
            lines.append((b'{"input": "' + payload + b'", "n": ' + b"9" * digits + b"}", "number_too_long"))
        elif kind == 9:
            token = rng.choice([b"NaN", b"Infinity", b"-Infinity"])
            lines.append((b'{"input": "' + payload + b'", "score": ' + token + b"}", "non_finite_number"))
        elif kind == 10:
            wrong = rng.choice(WRONG_TYPES)
            if wrong.startswith(b"{") and wrong != b"{}":
                wrong = wrong[:-1] + b', "n": ' + str(n).encode() + b"}"
            lines.append((wrong, None))
        elif kind == 11:
            lines.append((rng.choice([b"", b"   ", b"\t", b" \r"]), "blank_line"))
        elif kind == 12:
            broken = rng.choice([b'{"input": "' + payload, b'{"input": "x"\x00}', b"{'input': 'x'}", b"\xff\xfe{}"])
            lines.append((broken, None))
        elif kind == 13:  # NUL, lone surrogates and control characters inside strings: valid JSON
            content = rng.choice([b"a\\u0000b", b"\\ud800 alone", b"\\udfff\\ud800", b"tab\\there", b"\\u2028"])
            lines.append((user_row(payload, content), None))
        elif kind == 14 and n % 32 == 14:  # far more text than max_prompt_tokens can hold
            size = rng.choice([50_000, 200_000, 1_000_000])
            lines.append((user_row(payload, prose[:size].encode()), "prompt_too_long"))
        elif kind == 15 and n % 3_200 == 15:  # past the row size bound: read past, never held
            lines.append((b'{"input": "' + b"q" * (MAX_ROW_BYTES + 1) + b'"}', "row_too_large"))
        else:
            lines.append((good(rng, n), "kept"))
    return lines


def generated_rows(count: int) -> list[dict[str, Any]]:
    """Rows from the property tests' strategy, collected by running it (derandomized) as a plain function."""
    found: list[dict[str, Any]] = []

    @settings(max_examples=count, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(row=hypothesis_rows)
    def collect(row: dict[str, Any]) -> None:
        found.append(row)

    collect()
    return found


def build_corpus(folder: Path) -> Corpus:
    rng = random.Random(20261130)
    corpus = Corpus(folder)
    corpus.jsonl("hostile.jsonl", hostile_lines(rng, 6_400))
    corpus.jsonl("bom-crlf.jsonl", [(good(rng, 100_000 + n), "kept") for n in range(300)], bom=True, crlf=True)
    hyp = [(json.dumps(row, ensure_ascii=True).encode(), None) for row in generated_rows(1_500)]
    corpus.jsonl("hypothesis.jsonl", hyp)

    items = [good(rng, 200_000 + n) for n in range(1_000)]
    for n in range(0, 1_000, 10):
        items[n] = nested(rng.choice([MAX_DEPTH + 1, 20_000]))
    (folder / "array.json").write_bytes(b"[" + b", ".join(items) + b"]")
    for n, item in enumerate(items, start=1):
        corpus.expected[f"array.json[{n}]"] = "too_deep" if item.startswith(b"[[") else "kept"

    table = pa.table(
        {
            "instruction": [f"parquet row {n} " + "μ" * (n % 7) for n in range(1_000)],
            "output": ["o"] * 1_000,
            "score": [float("nan") if n % 9 == 0 else float(n) for n in range(1_000)],
            "extra": [json.dumps({"depth": nested(70).decode()}) for _ in range(1_000)],
        }
    )
    pq.write_table(table, folder / "rows.parquet")
    for n in range(1_000):
        corpus.expected[f"rows.parquet:row {n + 1}"] = "non_finite_number" if n % 9 == 0 else "kept"
    return corpus


CHILD = """
import json, sys
from pathlib import Path
from regen.chat import ChatRenderer
from regen.profiles import lookup
from regen.config import DatasetConfig
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.stages.prepare.sources import CorruptSource
from regen.layout import DatasetLocation
from regen.storage import LocalStorage

corpus, root = Path(sys.argv[1]), Path(sys.argv[2])
storage, renderer = LocalStorage(root), ChatRenderer(lookup("kimi-k2.5-mini"))
outcomes = {}
for dataset, pattern in [("corpus", "*.json*"), ("parquet", "rows.parquet"), ("gzip", "damaged/*.gz"),
                         ("damaged_parquet", "damaged/*.parquet")]:
    location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", dataset, "v1")
    config = DatasetConfig(paths=[str(corpus / pattern)])
    try:
        prepared = run_prepare(config, location, storage, renderer, PrepareSettings(2000, workers=2))
        outcomes[dataset] = {"rows_read": prepared.rows_read, "stats": prepared.stats.to_dict()}
    except CorruptSource as e:
        outcomes[dataset] = {"error": str(e), "left": storage.list_keys(location.prompts_folder)}
print(json.dumps(outcomes))
"""


def run_watched(args: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Runs a child, sampling its process tree's summed RSS every 20 ms; returns it with the peak in MB."""
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        total = 0
        try:
            for process in [root, *root.children(recursive=True)]:
                total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
        peak = max(peak, total)
        time.sleep(0.02)
    stdout, stderr = child.communicate()
    return subprocess.CompletedProcess(args, child.returncode, stdout, stderr), peak / 2**20


def damaged_sources(folder: Path) -> None:
    (folder / "damaged").mkdir()
    rows = b"".join(json.dumps({"input": f"task {i}"}).encode() + b"\n" for i in range(3_000))
    (folder / "damaged" / "rows.jsonl.gz").write_bytes(gzip.compress(rows)[:-40])
    pq.write_table(pa.table({"input": [f"p {i}" * 40 for i in range(3_000)]}), folder / "damaged" / "rows.parquet")
    data = bytearray((folder / "damaged" / "rows.parquet").read_bytes())
    data[200:5000] = bytes(4800)
    (folder / "damaged" / "rows.parquet").write_bytes(bytes(data))


def read_rejections(root: Path, dataset: str) -> list[dict[str, Any]]:
    path = root / "kimi-k2.5-mini" / dataset / "v1" / "rejected" / "prepare.jsonl"
    return [json.loads(line) for line in path.read_bytes().splitlines()]  # not str.splitlines: U+2028 is no newline


def kept_sources(root: Path, dataset: str) -> list[str]:
    found: list[str] = []
    for shard in sorted((root / "kimi-k2.5-mini" / dataset / "v1" / "prompts").glob("*.parquet")):
        found += pq.read_table(shard, columns=["source"]).column("source").to_pylist()
    return found


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Corpus, Path, dict[str, Any], float]:
    folder, root = tmp_path_factory.mktemp("corpus"), tmp_path_factory.mktemp("storage")
    corpus = build_corpus(folder)
    damaged_sources(folder)
    done, peak_mb = run_watched([sys.executable, "-c", CHILD, str(folder), str(root)])
    assert done.returncode == 0, done.stderr[-3000:]
    return corpus, root, json.loads(done.stdout.splitlines()[-1]), peak_mb


def test_the_corpus_has_over_ten_thousand_rows(prepared: tuple[Corpus, Path, dict[str, Any], float]) -> None:
    corpus, *_ = prepared
    assert len(corpus.expected) > 10_000


def test_prepare_stays_under_the_memory_target(prepared: tuple[Corpus, Path, dict[str, Any], float]) -> None:
    *_, peak_mb = prepared
    print(f"peak RSS of prepare's process tree: {peak_mb:.0f} MB (target {MEMORY_TARGET_MB} MB)")
    assert peak_mb < MEMORY_TARGET_MB


def test_every_line_is_kept_or_rejected_with_a_known_reason(
    prepared: tuple[Corpus, Path, dict[str, Any], float],
) -> None:
    corpus, root, outcomes, _ = prepared
    rejections = read_rejections(root, "corpus") + read_rejections(root, "parquet")
    kept = kept_sources(root, "corpus") + kept_sources(root, "parquet")
    assert {r["reason"] for r in rejections} <= PREPARE_REASONS
    assert all(r["detail"] for r in rejections)
    # One outcome per row (a row gives one prompt in the default `turns: final` mode), and nothing else.
    outcome = Counter([r["source"] for r in rejections] + kept)
    assert set(outcome) == set(corpus.expected), sorted(set(outcome) ^ set(corpus.expected))[:10]
    assert set(outcome.values()) == {1}
    counted = outcomes["corpus"]["rows_read"] + outcomes["parquet"]["rows_read"]
    assert counted == len(corpus.expected)


def test_every_hostile_row_is_rejected_for_its_own_reason(
    prepared: tuple[Corpus, Path, dict[str, Any], float],
) -> None:
    corpus, root, _, _ = prepared
    reasons = {r["source"]: r["reason"] for r in read_rejections(root, "corpus") + read_rejections(root, "parquet")}
    kept = set(kept_sources(root, "corpus") + kept_sources(root, "parquet"))
    wrong = {}
    for source, expect in corpus.expected.items():
        if expect == "kept" and source not in kept and reasons.get(source) != "duplicate":
            wrong[source] = reasons.get(source)
        elif expect not in (None, "kept") and reasons.get(source) != expect:
            wrong[source] = (expect, reasons.get(source))
    assert not wrong, dict(list(wrong.items())[:10])
    assert Counter(corpus.expected.values())["kept"] > 5_000


def test_unreadable_sources_fail_naming_the_file_and_leave_no_prompts(
    prepared: tuple[Corpus, Path, dict[str, Any], float],
) -> None:
    _, _, outcomes, _ = prepared
    assert "rows.jsonl.gz: the gzip stream is damaged" in outcomes["gzip"]["error"]
    assert "rows.parquet: not a readable Parquet file" in outcomes["damaged_parquet"]["error"]
    for dataset in ("gzip", "damaged_parquet"):
        assert not [key for key in outcomes[dataset]["left"] if key.endswith("prepare.json")]
