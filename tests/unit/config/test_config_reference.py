"""The configuration reference is generated from the config models: every field has a description (the one source of
what it means), and the committed page is what the generator writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from regen.__main__ import main
from regen.config import Defaults
from regen.config import reference as config_reference

PAGE = Path(__file__).resolve().parents[3] / "docs" / "config-reference.md"
REGENERATE = ".venv/bin/regen config-reference --output docs/config-reference.md"


def test_the_committed_reference_is_what_the_models_generate() -> None:
    assert PAGE.read_text(encoding="utf-8") == config_reference.render(), f"out of date: run `{REGENERATE}`"


def test_the_reference_gives_the_codes_defaults_not_the_sample_files() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")[2] for line in PAGE.read_text().splitlines()[1:]
            if line.startswith("| `")}  # fmt: skip
    assert rows["defaults.sampling.max_new_tokens"] == f"`{Defaults().sampling.max_new_tokens}`" == "`2048`"
    assert rows["defaults.shard_tasks"] == "`4`"
    assert rows["profiles.<name>.tool_calls[format: sections].call_id_format"] == '`"{id}"`'
    assert rows["datasets.<name>.paths"] == "`null`"


def test_a_field_without_a_description_fails_the_generator() -> None:
    class Section(BaseModel):
        described: int = Field(1, description="has one")
        bare: int = 2

    with pytest.raises(ValueError, match=r"Section\.bare has no description"):
        list(config_reference.rows(Section, "x"))


def test_the_command_writes_the_page(tmp_path: Path) -> None:
    assert main(["config-reference", "--output", str(tmp_path / "page.md")]) == 0
    assert (tmp_path / "page.md").read_text() == config_reference.render()
