"""The storage layout lives in one module: every key is the documented one, and no stage imports another for a key."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from regen import layout
from regen.layout import DatasetLocation

LIBRARY = Path(layout.__file__).parent
STAGES = {
    "regen.stages.prepare.prepare": LIBRARY / "stages" / "prepare" / "prepare.py",
    "regen.stages.generate.generate": LIBRARY / "stages" / "generate" / "generate.py",
    "regen.stages.validate": LIBRARY / "stages" / "validate.py",
    "regen.stages.export": LIBRARY / "stages" / "export.py",
    "regen.stages.publish.publish": LIBRARY / "stages" / "publish" / "publish.py",
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stage_imports_no_other_stage(stage: str) -> None:
    others = set(STAGES) - {stage}
    assert imported_modules(STAGES[stage]) & others == set()


def test_the_check_finds_a_stage_importing_another(tmp_path: Path) -> None:
    planted = tmp_path / "stage.py"
    planted.write_text("def f():\n    from regen.stages.export import run_export\n")
    assert "regen.stages.export" in imported_modules(planted)


def test_every_key_of_a_version_is_the_documented_one() -> None:
    location = DatasetLocation("s3://bucket/prefix", "kimi-k2.5", "B1_glaive", "nightly-1")
    shard = location.shard(42)
    version = "kimi-k2.5/B1_glaive/nightly-1"
    assert {
        "latest": location.latest,
        "manifest": location.manifest,
        "prepared": location.prepared,
        "prompts folder": location.prompts_folder,
        "prepare rejections": location.prepare_rejections,
        "report": location.report_file("report.html"),
        "prompts": shard.prompts,
        "checkpoints": shard.checkpoints,
        "raw": shard.raw,
        "generation": shard.generation,
        "generate rejections": shard.rejected("generate"),
        "verdicts": shard.verdicts,
        "shard report": shard.report,
        "after generate": shard.stage_manifest("generate"),
        "train": shard.split("train"),
        "truncated as JSON Lines": shard.split("truncated", "jsonl"),
        "run report": layout.run_report_key("kimi-k2.5", "nightly-1"),
    } == {
        "latest": "kimi-k2.5/B1_glaive/latest.json",
        "manifest": f"{version}/manifest.json",
        "prepared": f"{version}/prompts/prepare.json",
        "prompts folder": f"{version}/prompts/",
        "prepare rejections": f"{version}/rejected/prepare.jsonl",
        "report": f"{version}/report.html",
        "prompts": f"{version}/prompts/shard-00042.parquet",
        "checkpoints": f"{version}/raw/shard-00042/",
        "raw": f"{version}/raw/shard-00042.jsonl.zst",
        "generation": f"{version}/raw/shard-00042.generation.json",
        "generate rejections": f"{version}/rejected/shard-00042-generate.jsonl",
        "verdicts": f"{version}/reports/shard-00042-verdicts.parquet",
        "shard report": f"{version}/reports/shard-00042.json",
        "after generate": f"{version}/reports/shard-00042.generate.json",
        "train": f"{version}/train/shard-00042.parquet",
        "truncated as JSON Lines": f"{version}/truncated/shard-00042.jsonl",
        "run report": "kimi-k2.5/runs/nightly-1.json",
    }


@pytest.mark.parametrize("name", ["..", ".hidden", "a/b", "/abs", "", "x" * 129, "tab\tname"])
def test_a_name_that_could_leave_the_root_reaches_no_key(name: str) -> None:
    with pytest.raises(ValueError, match="cannot name a storage folder"):
        layout.latest_key("kimi-k2.5", name)
    with pytest.raises(ValueError, match="cannot name a storage folder"):
        layout.run_report_key(name, "v1")
    with pytest.raises(ValueError, match="unknown split"):
        DatasetLocation("/r", "p", "d", "v").shard(0).split("../train")
    with pytest.raises(ValueError, match="unknown stage"):
        DatasetLocation("/r", "p", "d", "v").shard(0).stage_manifest("../x")


def test_names_the_layout_uses_itself_are_refused() -> None:
    """A dataset `runs` would be the run reports' folder; a version `latest.json` the dataset's pointer."""
    with pytest.raises(ValueError, match="dataset 'runs' is a name the storage layout uses itself"):
        layout.latest_key("kimi-k2.5", "runs")
    for version in ("latest", "latest.json"):
        with pytest.raises(ValueError, match=f"version '{version}' is a name the storage layout uses"):
            DatasetLocation("/r", "kimi-k2.5", "B1_glaive", version).manifest  # noqa: B018
        with pytest.raises(ValueError, match="is a name the storage layout uses"):
            layout.run_report_key("kimi-k2.5", version)
    from regen.config import RegenConfig

    with pytest.raises(ValueError, match="dataset name 'runs' is a folder the storage layout uses"):
        RegenConfig.model_validate({"defaults": {}, "datasets": {"runs": {"paths": ["x.jsonl"]}}})
