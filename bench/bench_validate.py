"""Validate + export against the floor of a plain pyarrow read and write of the same training records, on one core.

    .venv/bin/python bench/bench_validate.py                 # 3,000 records of about 3.6k tokens
    .venv/bin/python bench/bench_validate.py --records 500   # quicker

A shard of Kimi-shaped records is built with the mini tokenizer: prompts rendered from messages by the profile's
template, answers `reasoning, reasoning end, answer, EOS` (a third of them a tool call in the profile's grammar),
`text` as the server sends it.
Then, each timed as process CPU seconds (one core: nothing here runs threads that matter):
- the floor: pyarrow reads the training records (train/shard.parquet) and writes them again, zstd, as export does;
- validate (every check, with the re-render and re-tokenization samples off) plus export: the stage pair's cost;
- the re-render check (1% of prompts, at least 16) and the re-tokenization drift (5%, at least 16) on their own;
- what export spends on the held-out split (the default share, 2%: each sample's side from its messages) and on
  counting the train split's tokens (regen.vocab, as export counts them), as shares of export.
It also prints the bytes per token of raw/, train/ and the whole version folder, against the previous raw format
(JSON Lines that repeated the prompt ids, uncompressed), computed from the same records.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regen.chat import ChatRenderer  # noqa: E402
from regen.holdout import side_of, source_key  # noqa: E402
from regen.layout import DatasetLocation  # noqa: E402
from regen.manifest import ShardManifest  # noqa: E402
from regen.profiles import SectionCalls, lookup  # noqa: E402
from regen.records import RawAnswer, ShardPrompts, encode_answer, read_prompts, text_digest, write_raw  # noqa: E402
from regen.stages.export import ExportSettings, run_export  # noqa: E402
from regen.stages.validate import ValidateSettings, check_render_drift, run_validate  # noqa: E402
from regen.storage import LocalStorage  # noqa: E402
from regen.tool_calls import write_tagged  # noqa: E402
from regen.vocab import add_counts, counts_from_table, counts_table, dense_counts  # noqa: E402


def tool_call_text(renderer: ChatRenderer, name: str, arguments: str) -> str:
    """One call in the profile's grammar (for sections, its id in the profile's format)."""
    grammar, profile = renderer.profile.tool_calls, renderer.profile
    if grammar is None:
        raise ValueError(f"profile {profile.name!r} declares no tool-call grammar")
    if not isinstance(grammar, SectionCalls):
        return f"{grammar.call_begin}{write_tagged(grammar.format, name, json.loads(arguments))}{grammar.call_end}"
    call_id = profile.tool_call_id_format.format(name=name, index=0, id=f"call_{name}")
    return (
        f"{grammar.section_begin}{grammar.call_begin}{call_id}{grammar.argument_begin}{arguments}"
        f"{grammar.call_end}{grammar.section_end}"
    )


TOOL = {
    "type": "function",
    "function": {
        "name": "run_tests",
        "description": "Run the unit tests of a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def _prose(rng: random.Random, words: list[str], tokens: int, renderer: ChatRenderer) -> list[int]:
    ids: list[int] = []
    while len(ids) < tokens:
        sentence = " ".join(rng.choice(words) for _ in range(12)).capitalize() + ". "
        ids += renderer.tokenizer.encode(sentence, add_special_tokens=False)
    return ids[:tokens]


def build_shard(root: Path, renderer: ChatRenderer, records: int, seed: int = 0) -> tuple[LocalStorage, ShardManifest]:
    """prompts/ and raw/ of one shard, as prepare and generate write them."""
    import pyarrow as pa

    from regen.stages.prepare.normalize import Conversation
    from regen.stages.prepare.prepare import PROMPT_SCHEMA

    rng = random.Random(seed)
    words = (ROOT / "include/regen/tokenizers/corpus.txt").read_text().split()
    storage = LocalStorage(root)
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "bench", "v1")
    tok = renderer.tokenizer
    think_end, eos = renderer.roles.reasoning_end, next(iter(sorted(renderer.roles.eos_ids, reverse=True)))
    if think_end is None:
        raise ValueError(f"profile {renderer.profile.name!r} does not reason: these records need a reasoning end")
    rows, answers = [], []
    for i in range(records):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(900, 1300)))
        tools = [TOOL] if i % 3 == 0 else []
        conversation = Conversation([{"role": "user", "content": f"{i}: {question}"}], tools)
        prompt_ids = renderer.render_ids(conversation.messages, tools or None)
        output = [*_prose(rng, words, rng.randint(900, 1300), renderer), think_end]
        if tools:
            output += tok.encode(tool_call_text(renderer, "run_tests", '{"path": "a.py"}'), add_special_tokens=False)
        else:
            output += _prose(rng, words, rng.randint(500, 900), renderer)
        output.append(eos)
        rows.append(
            {
                "id": conversation.sample_id,
                "source_index": i,
                "source": "bench",
                "messages": json.dumps(conversation.messages),
                "tools": json.dumps(tools),
                "source_key": source_key(conversation.messages, tools),  # as prepare records it
                "meta": "{}",
                "prompt_ids": prompt_ids,
            }
        )
        meta = {"finish_reason": {"type": "stop", "matched": eos}, "prompt_tokens": len(prompt_ids)}
        meta |= {"completion_tokens": len(output), "cached_tokens": 0, "e2e_latency": 1.0}
        digest, tail = text_digest(renderer.decode(output))
        answers.append(RawAnswer(conversation.sample_id, output, meta, digest, tail, f"r{i}", "e", 1))
    shard = ShardManifest(location, 0, location.shard(0).prompts, "", records)
    path = root.parent / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA), path, compression="zstd")
    storage.put_file(shard.prompts_key, path)
    raw_key = shard.keys.raw
    write_raw(root.parent / "raw.zst", (encode_answer(a) for a in answers))
    storage.put_file(raw_key, root.parent / "raw.zst")
    old_raw = sum(
        len(json.dumps({**_as_dict(a), "text": renderer.decode(a.output_ids), "prompt_ids": r["prompt_ids"]}))
        for a, r in zip(answers, rows, strict=True)
    )
    (root.parent / "old_raw_bytes").write_text(str(old_raw))
    return storage, ShardManifest(location, 0, shard.prompts_key, "", records, raw_key=raw_key)


def _as_dict(answer: RawAnswer) -> dict[str, Any]:
    import msgspec

    return msgspec.structs.asdict(answer)


def cpu(fn: Any) -> tuple[float, Any]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def best_of(runs: int, fn: Any) -> tuple[float, Any]:
    """The least CPU time of a few runs, alternating nothing: these machines are noisy, the minimum is the signal."""
    results = [cpu(fn) for _ in range(runs)]
    return min(t for t, _ in results), results[-1][1]


def records_wanted(argv: list[str] | None, doc: str | None) -> int:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=3000)
    return int(parser.parse_args(argv).records)


@contextmanager
def built_shard(records: int, prefix: str) -> Iterator[tuple[Path, ChatRenderer, LocalStorage, ShardManifest]]:
    """A folder, the mini profile's renderer, and one shard of `records` records (build_shard) in a root there."""
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        print(f"building {records} records ...", flush=True)
        storage, shard = build_shard(Path(tmp) / "root", renderer, records)
        yield Path(tmp), renderer, storage, shard


def main(argv: list[str] | None = None) -> None:
    with built_shard(records_wanted(argv, __doc__), "bench-validate-") as (tmp, renderer, storage, shard):
        old_raw_bytes = int((tmp / "old_raw_bytes").read_text())
        core = ValidateSettings(
            render_check_fraction=1e-9, render_check_minimum=0, retokenize_fraction=0.0, retokenize_minimum=0
        )
        t_validate, validated = cpu(lambda: run_validate(shard, storage, renderer, core))
        t_plain, _ = cpu(lambda: run_export(validated, storage))  # no held-out split: the baseline
        t_export, exported = cpu(lambda: run_export(validated, storage, ExportSettings(validation_share=0.02)))
        outputs = [pq.read_table(storage.uri(exported.train_key), columns=["input_ids", "prompt_len"])]
        pairs = ((t["input_ids"].to_numpy(False), t["prompt_len"].to_numpy()) for t in outputs)
        answers = [ids[n:] for column, lengths in pairs for ids, n in zip(column, lengths, strict=True)]
        t_count, _ = best_of(3, lambda: counts_table(dense_counts(answers)))
        shard_counts = counts_table(dense_counts(answers))
        shards_at_200k = 200_000 // 2_000  # the default shard size

        def publish_sum() -> None:  # publish's sum over a 200k-prompt version's shards, each one's table in turn
            total = np.zeros(163_840, np.int64)
            for _ in range(shards_at_200k):
                total = add_counts(total, counts_from_table(shard_counts))

        t_sum, _ = best_of(3, publish_sum)
        held = read_prompts(storage, shard.prompts_key, ["id", "prompt_ids"], sides=True)
        t_sides, _ = best_of(3, lambda: [side_of(held, i, 0.02) for i in held.ids])
        train = Path(storage.uri(exported.train_key))

        def floor() -> None:
            pq.write_table(pq.read_table(train), Path(tmp) / "floor.parquet", compression="zstd")

        t_floor, _ = best_of(3, floor)
        table = pq.read_table(train, columns=["input_ids", "loss_mask"])
        tokens = sum(len(x) for x in table.column("input_ids").to_pylist())
        output_tokens = sum(sum(m) for m in table.column("loss_mask").to_pylist())
        prompts = ShardPrompts(pq.read_table(storage.uri(shard.prompts_key)))
        t_render, rendered = cpu(lambda: check_render_drift(prompts.table, renderer))
        sampled = ValidateSettings(render_check_fraction=0, render_check_minimum=0)
        t_with_drift, _ = best_of(3, lambda: run_validate(shard, storage, renderer, sampled))

        pair = t_validate + t_export
        print(f"records {exported.stats['export'].kept} (train), tokens {tokens:,} ({output_tokens:,} output)")
        print(f"floor (pyarrow read + write of train/): {t_floor:.2f} s CPU = {tokens / t_floor / 1e6:.1f}M tokens/s")
        rate = tokens / pair / 1e6
        print(f"validate {t_validate:.2f} s + export {t_export:.2f} s = {pair:.2f} s CPU = {rate:.1f}M tokens/s")
        print(f"ratio validate+export / floor: {pair / t_floor:.2f}x (target <= 3x)")
        print(f"export without a held-out split {t_plain:.2f} s CPU; with 2% held out {t_export:.2f} s CPU")
        print(f"token counting of train/ (in export): {t_count:.3f} s CPU = {t_count / t_export:.1%} of export")
        print(f"publish's sum of {shards_at_200k} shards' counts (200k prompts): {t_sum:.3f} s CPU")
        print(f"held-out sides of every sample (in export): {t_sides:.3f} s CPU = {t_sides / t_export:.1%} of export")
        print(
            f"re-render check: {rendered} prompts in {t_render:.2f} s CPU ({t_render / pair:.2f}x of validate+export)"
        )
        drift_cost = t_with_drift - t_validate
        share = drift_cost / pair
        print(f"re-tokenization drift sample (5%, >=16): +{drift_cost:.2f} s CPU ({share:.2f}x of validate+export)")
        version = tmp / "root" / shard.location.prefix
        sizes = {
            folder: sum(f.stat().st_size for f in (version / folder).rglob("*") if f.is_file())
            for folder in ("prompts", "raw", "train", "reports")
        }
        whole = sum(sizes.values())
        print("bytes per token (all tokens of the training records):")
        print(f"  raw/ before (JSON Lines repeating prompt_ids): {old_raw_bytes / tokens:.2f}")
        print(f"  raw/ now (zstd JSON Lines, output ids only):    {sizes['raw'] / tokens:.2f}")
        print(f"  train/: {sizes['train'] / tokens:.2f}   prompts/: {sizes['prompts'] / tokens:.2f}")
        print(f"  whole version folder / train/: {whole / sizes['train']:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
