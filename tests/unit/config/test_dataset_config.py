from __future__ import annotations

from pathlib import Path

import pytest

from regen.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "regen.yaml"
    path.write_text(text)
    return path


def test_dataset_sources_formats_and_turns_load(tmp_path: Path) -> None:
    text = """
defaults: {tokenize_workers: 2}
datasets:
  files: {paths: ["data/*.jsonl.gz", "s3://bucket/glaive/*.parquet"], format: glaive, turns: every_assistant_turn}
  hub: {hf: {id: glaiveai/glaive-function-calling-v2, split: train, revision: main}}
  saved: {hf: {path: saved/oci}, format: input_output}
"""
    config = load_config(write(tmp_path, text))
    assert config.defaults.tokenize_workers == 2
    assert config.dataset("files").turns == "every_assistant_turn"
    assert config.dataset("hub").format == "auto" and config.dataset("hub").turns == "final"
    hf = config.dataset("hub").hf
    assert hf is not None and (hf.id, hf.subset, hf.split, hf.revision) == (
        "glaiveai/glaive-function-calling-v2",
        None,
        "train",
        "main",
    )


@pytest.mark.parametrize(
    "dataset,message",
    [
        pytest.param("{description: x}", "exactly one source: 'paths'", id="no-source"),
        pytest.param("{paths: [a.jsonl], hf: {id: x/y}}", "exactly one source: 'paths'", id="both-sources"),
        pytest.param("{paths: []}", "paths", id="empty-paths"),
        pytest.param("{hf: {split: train}}", "exactly one of 'id'", id="hf-neither"),
        pytest.param("{hf: {id: x/y, path: d}}", "exactly one of 'id'", id="hf-both"),
        pytest.param("{hf: {path: d, revision: main}}", "apply to a hub 'id'", id="hf-revision-on-disk"),
        pytest.param("{paths: [a.jsonl], format: csv}", "format", id="format"),
        pytest.param("{paths: [a.jsonl], turns: all}", "turns", id="turns"),
        pytest.param("{paths: [a.jsonl], hf_id: x}", "hf_id", id="typo"),
    ],
)
def test_bad_dataset_entries_fail_with_what_to_fix(tmp_path: Path, dataset: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, f"datasets: {{d: {dataset}}}"))


def test_tokenize_workers_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokenize_workers"):
        load_config(write(tmp_path, "defaults: {tokenize_workers: 0}\ndatasets: {d: {paths: [a.jsonl]}}"))
