"""The ``data`` section of params.yaml: the problem pool that is profiled and bucketed
(science §2), and the schema of a user's own problem tables.

Re-exported by :mod:`rollscale.config`; the loading itself is
:mod:`rollscale.core.problems.sources` and :mod:`rollscale.core.problems.sets`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollscale.config.sections import Section
from rollscale.plugins import import_reference, is_reference

__all__ = ["TABLE_SUFFIXES", "DataParams", "TableParams"]

# local problem-table files: JSONL is read line by line, the others through `datasets`
TABLE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


class TableParams(Section):
    """Where a problem table is and how its columns map to problems (a ``data.tables`` entry).

    Exactly one of ``path`` (local file, which must exist) and ``hub_id`` (hub
    dataset, with ``hub_config`` and ``split``). ``name`` is the source part of
    every problem id; give the same name to the same set wherever it is stored.
    ``answer_format``: ``raw`` (the value as is), ``gsm8k`` (the number after the
    last ``####``), ``boxed`` (the last ``\\boxed{}``). Numeric answers are stored
    in canonical form.
    """

    # a local .jsonl / .json / .parquet / .csv file, or a Hugging Face hub dataset id
    path: Path | None = None
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "train"
    # the source part of every problem id; default: the file's stem or the hub id
    name: str | None = None
    # prompt column: a string or TRL's list of {role, content} messages
    prompt: str = "prompt"
    # answer column, dotted for nested records (verl: reward_model.ground_truth)
    answer: str = "answer"
    answer_format: Literal["raw", "gsm8k", "boxed"] = "raw"
    system_prompt: str | None = None
    # numeric | math (math-verify, boxed) | exact | a user's "module:function"
    reward: str = "math"
    # share in a mix of several tables (mix_problems)
    weight: float = Field(1.0, gt=0)

    @field_validator("path")
    @classmethod
    def _readable_file(cls, v: Path | None) -> Path | None:
        if v is not None:
            if v.suffix.lower() not in TABLE_SUFFIXES:
                raise ValueError(f"expected a {', '.join(TABLE_SUFFIXES)} file, got {os.fspath(v)}")
            if not v.is_file():
                raise ValueError(f"file not found: {os.fspath(v)}")
            if v.stat().st_size == 0:
                raise ValueError(f"data file {os.fspath(v)} is empty")
        return v

    @field_validator("reward")
    @classmethod
    def _verifier_imports(cls, v: str) -> str:
        # a user's module:function must import now, not mid-study (built-in names: rollscale.core.problems.rewards)
        if is_reference(v):
            import_reference(v, "verifier")
        return v

    @model_validator(mode="after")
    def _one_place(self) -> "TableParams":
        if (self.path is None) == (self.hub_id is None):
            raise ValueError("give exactly one of path (a local file) and hub_id (a hub dataset)")
        return self

    @property
    def label(self) -> str:
        """The source name in problem ids."""
        if self.name:
            return self.name
        return self.path.stem if self.path is not None else str(self.hub_id)


class DataParams(Section):
    """The problem pool that is profiled and bucketed (science §2)."""

    # table = your own problem set(s), listed under `tables`
    source: Literal["reasoning_gym", "gsm8k", "math", "table"] = "reasoning_gym"
    # reasoning-gym: dataset name, its difficulty config, pool size and seed
    name: str = "chain_sum"
    config: dict[str, Any] = Field(
        default_factory=lambda: {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2}
    )
    size: int = Field(2000, ge=1)
    # reasoning-gym generator seed; for source table, the seed of the weighted mix
    seed: int = 1
    # "expression" = compact "12+7-45=" for the character-level tiny model
    prompt_style: Literal["question", "expression"] = "expression"
    # gsm8k / math: a local JSONL file, or null for the Hugging Face hub
    path: Path | None = None
    hub_id: str | None = None
    split: str = "test"
    skip_malformed: bool = False
    # at most this many problems (source table: the size of the weighted mix; null = all the weights allow)
    limit: int | None = Field(None, ge=1)
    # source table: your own problem tables (fields: TableParams above)
    tables: list[TableParams] = Field(default_factory=list)

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: Path | None) -> Path | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"file not found: {v} (expected an existing JSONL file or null for the hub)")
        if v is not None and Path(v).stat().st_size == 0:
            raise ValueError(f"data file {v} is empty (expected one JSON problem per line)")
        return v

    @property
    def more_problems(self) -> str:
        """How to profile more problems with this source, for an error's fix: a table or a file takes
        ``limit`` (reasoning-gym's ``size`` is ignored there)."""
        if self.source == "reasoning_gym":
            return "data.size"
        return "data.limit, or a larger table" if self.source == "table" else "data.limit"

    @model_validator(mode="after")
    def _tables(self) -> "DataParams":
        if self.source == "table" and not self.tables:
            raise ValueError("data.tables: source 'table' needs at least one table (path or hub_id)")
        if self.tables and self.source != "table":
            raise ValueError(f"data.tables is set but data.source is {self.source!r}; set data.source: table")
        return self
