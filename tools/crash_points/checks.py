"""The run the harness makes, and what it checks after each crash point: its deployment (three datasets, held-out
prompts on both sides), what each dataset's latest.json delivers split by split, and what killed writers left."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools.crash_points.dag import TASK_RETRIES

SPLITS = ("train", "validation", "truncated")
PROFILE, DATASETS = "crashpoint-mini", ("tools", "chats", "parts")
IN_FLIGHT, CHECKPOINT_EVERY = 2, 2
# Of source prompts held out: each dataset here has some on each side (their digests: chats 0.04, 0.11 | 0.53; parts
# four of eight below 0.3; tools 0.24, 0.28 | 0.52, 0.89), so a record in the wrong split is a record that differs.
VALIDATION_SHARE = 0.3
DATA = Path(__file__).resolve().parents[2] / "data" / "samples"


def write_deployment(folder: Path, storage_root: str, defaults: dict[str, Any] | None = None) -> Path:
    """The run's config and sources: tools at two temperatures, on-policy conversations, and a dataset in parts whose
    first part loses most of its prompts at tokenize (too long), so its shard numbers have a gap. `defaults`: over the
    config's (a fleet's: tools/crash_points/fleet.py)."""
    from importlib.resources import files

    folder.mkdir(parents=True, exist_ok=True)
    tools = [json.loads(line) for line in (DATA / "B1_glaive.jsonl").read_text().splitlines()[:4]]
    chats = [json.loads(line) for line in (DATA / "C1_multiturn.jsonl").read_text().splitlines()[:3]]
    short = [json.loads(line) for line in (DATA / "B2_opencodeinstruct.jsonl").read_text().splitlines()[:8]]
    long = [{**row, "id": f"long-{i}", "input": f"(long {i}) " + "word " * 1500} for i, row in enumerate(short[:4])]
    for name, rows in (("tools", tools), ("chats", chats), ("parts", [*long, *short])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    builtin = yaml.safe_load(files("regen").joinpath("builtin_profiles.yaml").read_text())
    profile = {**builtin["kimi-k2.5-mini"], "max_prompt_tokens": 1024}
    config = {
        "defaults": {
            "profile": PROFILE,
            "storage_root": storage_root,
            "shard_size": 3,
            "in_flight": IN_FLIGHT,
            "checkpoint_every": CHECKPOINT_EVERY,
            "checkpoint_s": 60,  # never reached: a try's parts are whole parts of CHECKPOINT_EVERY, in every run
            "tokenize_workers": 1,
            "prepare_part_prompts": 6,
            "shard_task_limit": 5,
            "task_retries": TASK_RETRIES,
            "fleet_wait_s": 5,
            "validation_share": VALIDATION_SHARE,
            "sampling": {"max_new_tokens": 160},
            **(defaults or {}),
        },
        "governance": {"allowed_endpoints": ["127.0.0.1"], "allowed_storage_roots": [storage_root]},
        "profiles": {PROFILE: profile},
        "datasets": {
            "tools": {"format": "openai_messages", "paths": [str(folder / "tools.jsonl")], "temperatures": [0.6, 1.0]},
            "chats": {"format": "auto", "turns": "on_policy", "paths": [str(folder / "chats.jsonl")]},
            "parts": {"format": "input_output", "paths": [str(folder / "parts.jsonl")]},
        },
    }
    path = folder / "regen.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Delivered:
    """What a run left for one dataset, as a trainer would find it: through latest.json."""

    version: str | None = None
    records: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # split -> id -> input_ids
    rejected: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)  # the manifest's, by name


def delivered(root: str, profile: str, dataset: str, s3_client: Any) -> Delivered:
    from regen.storage import open_storage
    from regen.verify import manifest_uri_of, verify_version

    found = Delivered()
    try:
        uri, sha256 = manifest_uri_of(dataset, root, profile, s3_client)
    except ValueError as e:
        found.problems.append(f"nothing published: {e}")
        return found
    result = verify_version(uri, s3_client, manifest_sha256=sha256)  # regen verify's verifier
    found.problems += result.problems
    found.version = result.manifest.get("version")
    found.shards = [shard["shard"] for shard in result.manifest.get("shards", [])]
    _read_records(found, uri, sha256, s3_client)
    storage = open_storage(root, s3_client)
    for key in result.manifest.get("files", {}):
        if "/rejected/" in key:
            lines = storage.get_bytes(key).splitlines()
            found.rejected |= {json.loads(line)["id"] for line in lines if json.loads(line).get("id")}
    published = {i for split in found.records.values() for i in split}
    if both := found.rejected & published:
        found.problems.append(f"{len(both)} samples both published and rejected, e.g. {sorted(both)[:2]}")
    return found


def _read_records(found: Delivered, uri: str, sha256: str | None, s3_client: Any) -> None:
    from regen.verify import read_training_data

    seen: set[str] = set()
    for split in SPLITS:
        records = found.records.setdefault(split, {})
        for batch in read_training_data(uri, s3_client, split, ["id", "input_ids"], sha256):
            for sample_id, input_ids in zip(
                batch.column("id").to_pylist(), batch.column("input_ids").to_pylist(), strict=True
            ):
                if sample_id in seen:
                    found.problems.append(f"{sample_id} published twice")
                seen.add(sample_id)
                records[sample_id] = tuple(input_ids)


def differences(dataset: str, got: Delivered, want: Delivered, version: str) -> list[str]:
    """What a crash point's run delivered against the fault-free run's: the same records in the same splits."""
    found = [f"{dataset}: {p}" for p in got.problems]
    if got.version != version:
        found.append(f"{dataset}: latest.json names version {got.version}, not {version}")
    for split in SPLITS:
        mine, theirs = got.records.get(split, {}), want.records.get(split, {})
        if mine != theirs:
            missing, extra = theirs.keys() - mine.keys(), mine.keys() - theirs.keys()
            changed = [i for i in theirs.keys() & mine.keys() if theirs[i] != mine[i]]
            found.append(
                f"{dataset}: {split}/ differs: {len(missing)} missing, {len(extra)} extra, {len(changed)} changed"
            )
    if got.rejected != want.rejected:
        found.append(f"{dataset}: rejections differ: {sorted(got.rejected ^ want.rejected)[:3]}")
    return found


def both_sides(reference: dict[str, Delivered]) -> list[str]:
    """The fault-free run's datasets with no record in train/ or in validation/: a split the harness cannot check."""
    sides = ("train", "validation")
    return [f"{d}: {s}/ is empty" for d, got in reference.items() for s in sides if not got.records[s]]


def left_temporaries(root: Path) -> list[str]:
    """The temporary files of killed writers still in a local root once a point's run (and Resume) is done."""
    left = sorted(str(path.relative_to(root)) for path in root.rglob(".tmp-*") if path.is_file())
    return [f"{len(left)} temporary files left by killed writers: {left[:3]}"] if left else []
