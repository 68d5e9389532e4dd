"""What a published version must hold, written from docs/data.md and docs/guarantees.md, never from the code.

It imports nothing of the pipeline it judges: a version is read as the docs lay it out (manifest.json, the splits'
Parquet files, prompts/, rejected/), and what it should hold is worked out from the dataset's own rows and turn mode
(`expected_prompts`), as the docs define a prompt, a source prompt and a held-out split. Where a property says it more
simply than a prediction (the held-out share of distinct sources, a split that only grows with the share), the
property is stated instead.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

SPLITS = ("train", "validation", "truncated")
TURN = "/turn-"  # docs/data.md: an on-policy turn's id is its conversation's, this, and the turn's number
# docs/guarantees.md: the reasons that are the fleet's, not the data's
FLEET_REASONS = {"server_rejected", "server_aborted", "count_mismatch"}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def sample_of(answer_id: str) -> str:
    sample, sep, turn = answer_id.rpartition(TURN)
    return sample if sep and turn.isdigit() else answer_id


def opening(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """docs/data.md: the messages before the first assistant turn that follows a user turn."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        return messages
    after = next((i for i in range(first_user, len(messages)) if messages[i]["role"] == "assistant"), len(messages))
    return messages[:after]


def source(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """A source prompt: its opening and its tools. Every row cut from it is on one side (docs/data.md)."""
    return canonical({"opening": opening(messages), "tools": tools})


def cuts(messages: list[dict[str, Any]]) -> list[int]:
    """Where a prompt ends (docs/configuration.md, `turns`): before each assistant turn that follows a user turn (a
    run of assistant messages is one turn), and at the end of a conversation that waits for the assistant."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        return []
    found = [
        i
        for i in range(first_user + 1, len(messages))
        if messages[i]["role"] == "assistant" and messages[i - 1]["role"] != "assistant"
    ]
    return found + ([len(messages)] if messages[-1]["role"] != "assistant" else [])


@dataclass(frozen=True)
class Expected:
    """What prepare keeps of a dataset's rows: each distinct prompt and the answers it asks for."""

    prompts: dict[str, int]  # canonical (messages, tools[, later]) -> answers (turns of an on-policy conversation)
    no_user_turn: int  # rows with no prompt to cut
    empty_content: int  # rows with a blank message


def blank(message: dict[str, Any]) -> bool:
    """docs/data.md, `empty_content`: a message with no text, other than a tool result or an assistant's tool call,
    rejects its row."""
    return not str(message.get("content") or "").strip() and message["role"] != "tool" and "tool_calls" not in message


def expected_prompts(rows: list[dict[str, Any]], turns: str) -> Expected:
    prompts: dict[str, int] = {}
    no_user = empty = 0
    for row in rows:
        messages, tools = row["messages"], row.get("tools") or []
        if any(blank(m) for m in messages):
            empty += 1
            continue
        at = cuts(messages)
        if not at:
            no_user += 1
            continue
        if turns == "on_policy":
            prompts[canonical([messages[: at[0]], tools, messages[at[0] :]])] = len(at)
        else:
            for cut in at[-1:] if turns == "final" else at:
                prompts[canonical([messages[:cut], tools, []])] = 1
    return Expected(prompts, no_user, empty)


@dataclass
class Version:
    """A published version as docs/data.md lays it out."""

    path: Path
    manifest: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # split -> its records
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)  # prompts/ rows by sample id
    rejected: list[dict[str, Any]] = field(default_factory=list)  # every rejected/ line

    @classmethod
    def read(cls, manifest_path: str | Path) -> Version:
        path = Path(manifest_path)
        manifest = json.loads(path.read_text())
        root = Path(manifest["root"])
        version = cls(path, manifest, {split: [] for split in SPLITS})
        for key in sorted(manifest["files"]):
            parts = key.split("/")
            if parts[-2] in SPLITS and key.endswith(".parquet"):
                version.rows[parts[-2]] += pq.read_table(root / key).to_pylist()
            elif parts[-2] == "prompts" and key.endswith(".parquet"):
                for row in pq.read_table(root / key).to_pylist():
                    version.prompts[row["id"]] = row
            elif parts[-2] == "rejected" and key.endswith(".jsonl"):
                version.rejected += [json.loads(line) for line in (root / key).read_text().split("\n") if line]
        return version

    @property
    def share(self) -> float:
        return float(self.manifest.get("validation_share") or 0.0)

    def prompt_key(self, row: dict[str, Any]) -> str:
        later = json.loads(row["later"]) if row.get("later") else []
        return canonical([json.loads(row["messages"]), json.loads(row["tools"] or "[]"), later])

    def source_of(self, answer_id: str) -> str:
        row = self.prompts[sample_of(answer_id)]
        return source(json.loads(row["messages"]), json.loads(row["tools"] or "[]"))

    def sides(self) -> dict[str, set[str]]:
        """Each source prompt's sides among this version's records (truncated/ says its side in `side`)."""
        found: dict[str, set[str]] = defaultdict(set)
        for split in ("train", "validation"):
            for record in self.rows[split]:
                found[self.source_of(record["id"])].add(split)
        for record in self.rows["truncated"]:
            found[self.source_of(record["id"])].add(record["side"])
        return found


def version_problems(version: Version, expected: Expected | None, samples_per_prompt: int = 1) -> list[str]:
    """Everything docs/data.md promises of one version on its own. `expected`: what its dataset's rows make, when
    the whole dataset was asked for (no limit)."""
    problems: list[str] = []
    m, rows = version.manifest, version.rows
    if m.get("splits", {}).get("train", len(rows["train"])) != len(rows["train"]) or m["records"] != len(rows["train"]):
        problems.append(f"manifest counts {m.get('splits')} / records {m['records']}, files hold {len(rows['train'])}")
    if version.share == 0 and rows["validation"]:
        problems.append(f"validation_share 0, yet {len(rows['validation'])} validation records")
    problems += _records_problems(version)
    problems += _each_answer_once(version)
    split = {s: sides for s, sides in version.sides().items() if len(sides) > 1}
    if split:
        problems.append(f"{len(split)} source prompts on both sides, e.g. {next(iter(split))[:120]}")
    if expected is not None:
        problems += _prompts_problems(version, expected, samples_per_prompt)
    return problems


def _records_problems(version: Version) -> list[str]:
    """input_ids = the prompt sent + the answer; loss_mask 0 over the prompt, 1 over the answer."""
    bad = []
    for split in SPLITS:
        for record in version.rows[split]:
            ids, mask, cut = record["input_ids"], record["loss_mask"], record["prompt_len"]
            prompt = version.prompts.get(sample_of(record["id"]))
            single = prompt is not None and not prompt.get("later")
            if mask != [0] * cut + [1] * (len(ids) - cut) or len(ids) <= cut:
                bad.append(f"{split} {record['id']}: loss_mask is not 0 over the prompt and 1 over an answer")
            elif single and ids[:cut] != list(prompt["prompt_ids"]):
                bad.append(f"{split} {record['id']}: its prompt is not the one prompts/ holds")
    return bad[:5]


def _each_answer_once(version: Version) -> list[str]:
    """Every answer a sample asks for is in exactly one split or rejected with its reason: nothing dropped silently,
    nothing twice; an on-policy conversation's turns from 1 on, each once."""
    seen = Counter(r["id"] for split in SPLITS for r in version.rows[split])
    seen.update(r["id"] for r in version.rejected if r.get("stage") in ("generate", "validate") and r.get("id"))
    problems = [f"answer {i} {n} times" for i, n in seen.items() if n > 1][:3]
    by_sample: dict[str, set[str]] = defaultdict(set)
    for answer_id in seen:
        by_sample[sample_of(answer_id)].add(answer_id)
    for sample_id, prompt in version.prompts.items():
        answers = by_sample.get(sample_id, set())
        if not prompt.get("later"):
            if answers != {sample_id}:
                problems.append(f"sample {sample_id}: answers {sorted(answers)}, not itself once")
            continue
        turns = sorted(int(a.rpartition(TURN)[2]) for a in answers if TURN in a)
        if not turns or turns != list(range(1, len(turns) + 1)):
            problems.append(f"conversation {sample_id}: turns {turns}, not 1 to n")
    unknown = set(by_sample) - set(version.prompts)
    if unknown:
        problems.append(f"{len(unknown)} answers of no prompt, e.g. {sorted(unknown)[0]}")
    return problems[:8]


def _prompts_problems(version: Version, expected: Expected, samples_per_prompt: int) -> list[str]:
    kept = Counter(version.prompt_key(row) for row in version.prompts.values())
    problems = []
    missing, extra = set(expected.prompts) - set(kept), set(kept) - set(expected.prompts)
    if missing or extra:
        example = next(iter(missing or extra))[:200]
        reasons = Counter(r.get("reason") for r in version.rejected if r.get("stage") == "prepare")
        problems.append(
            f"prompts kept: {len(missing)} of the rows' missing, {len(extra)} not theirs "
            f"(prepare rejected {dict(reasons)}), e.g. {example}"
        )
    if any(n != samples_per_prompt for n in kept.values()):
        problems.append(f"samples per prompt {set(kept.values())}, not {samples_per_prompt}")
    rejected = Counter(r.get("reason") for r in version.rejected if r.get("stage") == "prepare")
    for reason, rows in (("no_user_turn", expected.no_user_turn), ("empty_content", expected.empty_content)):
        if rejected[reason] != rows:
            problems.append(f"{rejected[reason]} rows rejected as {reason}, the rows hold {rows}")
    return problems


def fleet_losses(version: Version) -> list[str]:
    """docs/guarantees.md: the answers the fleet lost (refused, aborted or miscounted on every attempt), and every
    later turn of an on-policy conversation such a loss ended."""
    rejected = {r["id"]: r["reason"] for r in version.rejected if r.get("stage") == "generate" and r.get("id")}
    first_lost: dict[str, tuple[int, str]] = {}  # conversation -> its earliest rejected turn and that turn's reason
    for answer_id, reason in rejected.items():
        if TURN in answer_id:
            turn = int(answer_id.rpartition(TURN)[2])
            conversation = sample_of(answer_id)
            if conversation not in first_lost or turn < first_lost[conversation][0]:
                first_lost[conversation] = (turn, reason)
    return [
        answer_id
        for answer_id, reason in rejected.items()
        if reason in FLEET_REASONS
        or (reason == "earlier_turn_unusable" and first_lost[sample_of(answer_id)][1] in FLEET_REASONS)
    ]


def fleet_loss_problems(version: Version, share: float = 0.02) -> list[str]:
    """A published version lost at most `max_server_rejected_share` of its answers to the fleet (one alone always)."""
    answers = sum(len(version.rows[split]) for split in SPLITS)
    answers += sum(1 for r in version.rejected if r.get("stage") in ("generate", "validate") and r.get("id"))
    lost = fleet_losses(version)
    if len(lost) > max(1, int(share * answers)):
        return [f"published with {len(lost)} of {answers} answers lost to the fleet, e.g. {sorted(lost)[:3]}"]
    return []


def held_out_share_problems(version: Version, alarm: float = 1e-6) -> list[str]:
    """The held-out sources are a fair draw at the share (docs/data.md: a digest of each, read as a fraction): the
    count held out of n distinct sources is binomial, and one whose tail probability is below `alarm` is a problem
    (a false alarm about once in a million versions)."""
    sides = version.sides()
    n, share = len(sides), version.share
    if share in (0.0, 1.0):
        return [] if share != 1.0 or not version.rows["train"] else ["share 1, yet train records"]
    held = sum("validation" in s for s in sides.values())
    tail = min(binomial_tail(n, share, held, upper=True), binomial_tail(n, share, held, upper=False))
    if tail < alarm:
        return [f"{held} of {n} distinct source prompts held out at share {share} (tail probability {tail:.1e})"]
    return []


def binomial_tail(n: int, p: float, k: int, upper: bool) -> float:
    """P(K >= k) (upper) or P(K <= k) for K ~ Binomial(n, p)."""
    counts = range(k, n + 1) if upper else range(k + 1)
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in counts)


def between_versions_problems(a: Version, b: Version) -> list[str]:
    """The same prompts held out in every version at one share, and raising the share only moves sources from
    train to validation (docs/data.md)."""
    sides_a, sides_b = a.sides(), b.sides()
    shared = set(sides_a) & set(sides_b)
    if a.share > b.share:
        a, b, sides_a, sides_b = b, a, sides_b, sides_a
    wrong = [
        s
        for s in shared
        if ("validation" in sides_a[s] and "train" in sides_b[s]) or (a.share == b.share and sides_a[s] != sides_b[s])
    ]
    return [f"{len(wrong)} sources moved against the share ({a.share} -> {b.share})"] if wrong else []


def data_of(version: Version) -> dict[str, dict[str, tuple[int, ...]]]:
    """A version's data as a trainer sees it: each split's records, id -> input_ids."""
    return {split: {r["id"]: tuple(r["input_ids"]) for r in version.rows[split]} for split in SPLITS}
