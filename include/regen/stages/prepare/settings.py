"""How a dataset is prepared, beside what (its config) and where (its location and storage): one value the entry
(`run_prepare`) and the parts share, like the other stages' settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from regen.stages.prepare.eval_suites import Decontamination
from regen.storage import S3ClientFactory


@dataclass(frozen=True)
class PrepareSettings:
    shard_size: int  # sample rows per prompt shard
    limit: int | None = None  # prompts kept at most; a limited dataset is always prepared whole
    resolve_path: Callable[[str], str] = str  # a source path as the config file's folder makes it
    s3_client: S3ClientFactory | None = None  # makes the boto3 client for s3:// sources
    workers: int | None = None  # tokenizing processes: None all cores, 1 this process
    inputs: dict[str, Any] = field(default_factory=dict)  # what the version is made from (regen.version_inputs)
    run_id: str | None = None
    part_prompts: int | None = None  # more prompts than this (and no limit): left in parts for prepare_part
    decontamination: Decontamination | None = None  # the eval suites' index: a prompt holding an item is rejected
    # each sample's answer tokens in the dataset's last version (regen.version_inputs.answer_lengths), by sample id:
    # written beside its prompt, for generate to send the longest first
    expected_tokens: Mapping[str, int] = field(default_factory=dict)
    # Deal the shards longest first (and write each sample's expected length) by those lengths, else by each prompt's
    # reference answer: what a first version orders by
    by_length: bool = False
