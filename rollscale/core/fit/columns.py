"""Shared pieces of the study-level analysis tables (science §7): columns, families, fit rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

__all__ = ["CONFIG", "EVAL_COLUMNS", "FAMILY", "RUN_COLUMNS", "families", "fit_row", "fits_frame", "require"]

RUN_COLUMNS = ("run_id", "n", "b_problem")
EVAL_COLUMNS = ("run_id", "step", "c", "avg_at_k")
FAMILY = ["bucket", "rule"]
CONFIG = ["bucket", "rule", "n", "b_problem", "c_max"]  # runs that differ only by seed
FIT_ID = ["kind", "design", "bucket", "rule", "fixed", "key"]


def require(df: Any, name: str, columns: Sequence[str]) -> pd.DataFrame:
    """``df`` itself, or a ValueError naming the table and its missing columns."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{name}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: missing columns {missing} (has {list(df.columns)})")
    return df


def families(df: pd.DataFrame) -> list[tuple[tuple[str, str], pd.DataFrame]]:
    """Runs of one bucket and one allocation rule: never pooled with another."""
    return [((str(b), str(r)), g) for (b, r), g in df.groupby(FAMILY, sort=True)]


def fit_row(kind: str, design: str, bucket: str | None, rule: str | None, fixed: str | None, key: Any,
            **values: Any) -> dict:
    """One row of the ``fits`` table."""
    return {"kind": kind, "design": design, "bucket": bucket, "rule": rule, "fixed": fixed, "key": key, **values}


def fits_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows of the ``fits`` table with the id columns first, ``key`` nullable int."""
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=[*FIT_ID, "n_points", "status"])
    for col in FIT_ID:
        if col not in df.columns:
            df[col] = None
    df["key"] = pd.array([None if v is None or pd.isna(v) else int(v) for v in df["key"]], dtype="Int64")
    df["n_points"] = pd.to_numeric(df["n_points"]).fillna(0).astype(int)
    rest = [c for c in df.columns if c not in FIT_ID]
    return df[FIT_ID + rest]
