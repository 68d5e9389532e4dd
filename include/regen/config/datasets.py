"""The config's `datasets` and `decontamination` sections: where a dataset's prompts come from, how its rows are read
and answered, and the eval suites no prompt may hold. Models only (regen.config loads and checks the file)."""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A dataset's (or an eval suite's) name becomes a storage key.
DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


SourceFormat = Literal["auto", "openai_messages", "sharegpt", "glaive", "input_output", "alpaca", "prompt"]


class HubDataset(BaseModel):
    """A Hugging Face dataset: a hub `id` (streamed) or a `path` written by `Dataset.save_to_disk`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str | None = Field(None, description="a hub dataset, streamed (one of `id` or `path`)")
    path: str | None = Field(None, description="a folder written by `Dataset.save_to_disk`")
    subset: str | None = Field(None, description="the hub dataset's subset (config name)")
    split: str = Field("train", description="the split to read")
    revision: str | None = Field(
        None,
        description="the hub revision to pin; without one the dataset cannot be compared and is regenerated nightly",
    )

    @model_validator(mode="after")
    def _one_source(self) -> HubDataset:
        if (self.id is None) == (self.path is None):
            raise ValueError("hf: give exactly one of 'id' (a hub dataset) or 'path' (a dataset saved to disk)")
        if self.path is not None and (self.subset is not None or self.revision is not None):
            raise ValueError("hf: 'subset' and 'revision' apply to a hub 'id', not to a dataset saved to disk")
        return self


class DatasetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    paths: list[str] | None = Field(
        None,
        min_length=1,
        description="local files, globs or s3:// URIs (globs too): .jsonl/.ndjson, .json (array or JSON Lines), "
        ".parquet, optionally .gz/.zst; read as a stream. One of `paths` or `hf`",
    )
    hf: HubDataset | None = Field(None, description="a Hugging Face dataset instead of `paths`")
    format: SourceFormat = Field(
        "auto",
        description="auto: per row, by its fields (messages, conversations, chat, instruction, input, prompt); "
        "input_output is OpenCodeInstruct's (other columns kept as metadata)",
    )
    turns: Literal["final", "every_assistant_turn", "on_policy"] = Field(
        "final",
        description="final: the last assistant turn is regenerated, history kept; every_assistant_turn: one sample "
        "per assistant turn, with the dataset's conversation up to it; on_policy: every assistant turn, turn by turn, "
        "each after the target's own answers to the turns before it (regen.on_policy)",
    )
    samples_per_prompt: int = Field(
        1,
        ge=1,
        le=64,
        description="each prompt answered this many times at each temperature, every sample with its own id "
        "(`<prompt id>@t<temperature>#<index>`) and a sampling_seed derived from it; 1 with no temperatures keeps the "
        "prompt's id and sends no seed",
    )
    temperatures: list[float] | None = Field(
        None, min_length=1, description="temperatures to answer each prompt at, each once; null: the run's"
    )
    tool_result_names: Literal["as_given", "from_call"] = Field(
        "as_given",
        description="a tool result's turn header: as_given, the name the data gives or `tool` without one (what "
        "production renders for OpenAI-SDK clients); from_call: the function of the call it answers",
    )
    description: str = Field("", description="free text, shown with the dataset")

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if (self.paths is None) == (self.hf is None):
            raise ValueError("a dataset needs exactly one source: 'paths' (files, globs, s3:// URIs) or 'hf'")
        if self.temperatures is not None:
            if any(t < 0 for t in self.temperatures):
                raise ValueError(f"temperatures {self.temperatures}: each must be 0 or more")
            if len(set(self.temperatures)) != len(self.temperatures):
                raise ValueError(f"temperatures {self.temperatures}: each once (samples_per_prompt repeats them)")
        return self


class EvalSuite(BaseModel):
    """An eval suite prompts are cleaned against (regen.stages.prepare.eval_suites): a file's items, or a built-in
    one."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=DATASET_NAME.pattern, description="how rejections and the manifest name the suite")
    path: str = Field(description="a .jsonl, .json or .parquet file (local, or s3://), or builtin:humaneval")
    field: str = Field("prompt", description="the item's text, a dotted path (turns; conversation.0.content)")
    id_field: str | None = Field(None, description="the item's id, a dotted path; null: its position, #1 on")


MessageRole = Literal["system", "developer", "user", "assistant", "tool"]


class DecontaminationConfig(BaseModel):
    """Prompts holding an eval item are rejected at prepare (`eval_overlap`), compared by hashed word n-grams."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    suites: list[EvalSuite] = Field(default_factory=list, description="none: no prompt is checked")
    ngram: int = Field(13, ge=4, le=64, description="words per n-gram (13, as GPT-3's contamination study)")
    threshold: float = Field(0.5, gt=0.0, le=1.0, description="share of an item's n-grams in a prompt that rejects it")
    min_item_words: int = Field(4, ge=1, description="items with fewer words are left out: too generic to judge by")
    roles: list[MessageRole] = Field(
        default_factory=lambda: list(get_args(MessageRole)),
        min_length=1,
        description="the messages read, besides the tool declarations: by default every one a prompt shows",
    )

    @model_validator(mode="after")
    def _names_once(self) -> DecontaminationConfig:
        names = [suite.name for suite in self.suites]
        if len(set(names)) != len(names):
            raise ValueError(f"decontamination.suites: each name once, got {names}")
        if self.min_item_words > self.ngram:
            raise ValueError("decontamination.min_item_words: at most ngram (shorter items are matched whole)")
        return self
