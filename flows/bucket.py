"""Stage ``bucket``: Easy / Hard / Very easy / Extremely hard and mixtures (science §2).

Problems are assigned to buckets by their avg@k, each bucket is split into a
training set and a fixed-size in-domain validation set with a seeded split,
and the split is stored.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import flow

from rollscale.core.problems.buckets import assign_buckets, bucket_counts, make_splits, splits_table
from rollscale.files import write_parquets_atomic
from tasks.common import ARTIFACTS, retried_task, read_params, refresh_duckdb


@retried_task(name="bucket-splits")
def bucket_splits(profile: pd.DataFrame, bucket_params, more_problems: str = "data.size") -> pd.DataFrame:
    b = bucket_params
    membership = assign_buckets(
        profile, {"easy": b.easy, "hard": b.hard, "very_easy": b.very_easy}, extremely_hard=b.extremely_hard
    )
    splits = make_splits(membership, b.val_size, b.seed, b.used, {k: list(v) for k, v in b.mixtures.items()},
                         more_problems)
    return splits_table(splits)


@flow(name="bucket")
def bucket_flow(params_path: str = "params.yaml", artifacts: str = str(ARTIFACTS)) -> pd.DataFrame:
    params = read_params(params_path)
    profile_path = Path(artifacts) / "profile" / "profile.parquet"
    if not profile_path.exists():
        raise FileNotFoundError(f"{profile_path} not found: run the 'profile' stage first (dvc repro profile)")
    profile = pd.read_parquet(profile_path)
    if params.bucket.extremely_hard and "n_correct_extreme" not in profile:
        raise ValueError("bucket.extremely_hard needs profile.k_extreme > 0 (the profile has no n_correct_extreme)")
    table = bucket_splits(profile, params.bucket, params.data.more_problems)
    counts = bucket_counts(table, len(profile))
    out = Path(artifacts) / "bucket"
    write_parquets_atomic({out / "buckets.parquet": table, out / "bucket_counts.parquet": counts})  # all at once
    refresh_duckdb(Path(artifacts))
    print("bucket counts:\n" + counts.to_string(index=False, float_format=lambda x: f"{x:.1%}"))
    return table


if __name__ == "__main__":
    bucket_flow()
