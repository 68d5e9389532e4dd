"""What `regen check-config` and `regen plan` tell, without running anything: a config file's problems, one line
each, and what a run's conf would run (datasets, their sources' sizes, endpoints redacted, storage root, version).
Nothing here sends a request or writes: plan's live checks (the profile's tokenizer, a storage write, the fleet)
stay the DAG's.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from regen.config import ConfigError, RegenConfig, explain
from regen.run_params import RunSpec, check_fleet_pool


def config_problems(path: Path) -> tuple[RegenConfig | None, list[str]]:
    """The config and no problems, or no config and every problem as one line (`where: what`)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        return None, [f"{path}: cannot read it ({e.strerror or e}); set REGEN_CONFIG or give the path"]
    except yaml.YAMLError as e:
        return None, [f"{path}: not valid YAML: {' '.join(str(e).split())}"]
    if not isinstance(raw, dict):
        return None, [f"{path}: must be a mapping with 'defaults' and 'datasets'"]
    try:
        config = RegenConfig(**raw, base_dir=path.resolve().parent)
    except ValidationError as e:
        return None, [" ".join(line.split()) for line in explain(e, RegenConfig)]
    try:
        check_fleet_pool(config.defaults.shard_tasks, config.defaults.pool_slots)
    except ConfigError as e:
        return config, [str(e)]
    return config, []


def config_summary(config: RegenConfig) -> dict[str, Any]:
    d = config.defaults
    return {
        "datasets": list(config.datasets),
        "profiles": config.profile_names,
        "default_profile": d.profile,
        "endpoints": [str(url) for url in d.endpoints],
        "storage_root": str(config.storage_root),
        "shard_tasks": d.shard_tasks,
        "fleet_pool_slots": d.pool_slots,
        "schedule": d.schedule,
    }


def plan_summary(params: dict[str, Any], config: RegenConfig, run_id: str) -> dict[str, Any]:
    """The run a conf makes, as plan checks it (governance, the pool, the params); ConfigError says what to fix."""
    run = RunSpec.from_params(params, run_id, config)
    return {
        "version": run.version,
        "profile": run.profile,
        "endpoints": [str(url) for url in run.endpoints],
        "storage_root": str(run.storage_root),
        "shard_size": run.shard_size,
        "in_flight": params.get("in_flight") or config.defaults.in_flight,
        "shard_tasks": config.defaults.shard_tasks,
        "requests_per_shard_task": run.concurrency,
        "limit": run.limit,
        "sampling": {k: run.sampling[k] for k in ("max_new_tokens", "temperature", "top_p", "top_k", "min_p")},
        "skip_unchanged": run.skip_unchanged,
        "datasets": {name: _dataset_plan(run, name) for name in run.datasets},
    }


def _dataset_plan(run: RunSpec, name: str) -> dict[str, Any]:
    """What can be told of a dataset before reading it: its local files and their bytes; the rest is prepare's."""
    dataset = run.dataset(name)
    samples = len(dataset.temperatures or [None]) * dataset.samples_per_prompt
    plan: dict[str, Any] = {"turns": dataset.turns, "answers_per_prompt": samples}
    if dataset.hf is not None:
        plan["source"] = f"hf:{dataset.hf.id or dataset.hf.path} (counted at prepare)"
        return plan
    local = [run.resolve(p) for p in dataset.paths or [] if "://" not in p]
    found = {pattern: [f for f in glob.glob(pattern, recursive=True) if Path(f).is_file()] for pattern in local}
    files = sorted({f for matches in found.values() for f in matches})
    plan["files"] = len(files)
    plan["bytes"] = sum(Path(f).stat().st_size for f in files)
    missing = [pattern for pattern, matches in found.items() if not matches]
    if missing:
        plan["missing"] = missing  # prepare would fail on these, naming them
    remote = [p for p in dataset.paths or [] if "://" in p]
    if remote:
        plan["remote_paths"] = remote  # listed at prepare, with the deployment's credentials
    if run.limit is not None:
        plan["shards_at_most"] = -(-run.limit * samples // run.shard_size)
    return plan
