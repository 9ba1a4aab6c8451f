"""Difficulty buckets, mixtures and seeded train/validation splits (science §2)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

log = logging.getLogger("rollscale.core.problems.buckets")

BASE_BUCKETS = ("easy", "hard", "very_easy", "extremely_hard")


class BucketError(ValueError):
    """A bucket that later stages need is empty or smaller than its validation set."""


def assign_buckets(
    profile: pd.DataFrame,
    bounds: Mapping[str, tuple[float, float]],
    extremely_hard: bool = True,
) -> pd.DataFrame:
    """Rows (problem_id, bucket) for each bucket whose closed interval holds avg@k.

    A problem can sit in two buckets where intervals touch (0.6 is Easy and Very
    easy), as the intervals of science §2 are closed. Extremely hard = no correct
    answer in the larger k_extreme sample (needs profile column ``n_correct_extreme``).
    """
    for col in ("problem_id", "avg_at_k"):
        if col not in profile.columns:
            raise ValueError(f"profile table has no column {col!r}")
    parts = []
    for name, (lo, hi) in bounds.items():
        inside = profile["avg_at_k"].between(lo, hi, inclusive="both")
        parts.append(pd.DataFrame({"problem_id": profile.loc[inside, "problem_id"], "bucket": name}))
    if extremely_hard:
        if "n_correct_extreme" not in profile.columns:
            raise ValueError("Extremely hard needs the profile's n_correct_extreme column (profile.k_extreme > 0)")
        zero = (profile["n_correct"] == 0) & (profile["n_correct_extreme"] == 0)
        parts.append(pd.DataFrame({"problem_id": profile.loc[zero, "problem_id"], "bucket": "extremely_hard"}))
    return pd.concat(parts, ignore_index=True)


# the share of a pool a bucket is assumed to hold before its profile (Easy [0.3, 0.6] in the default study: 22 %)
EASY_SHARE = 0.2


def bounds_holding(avg_at_k: Sequence[float], need: int, around: tuple[float, float]) -> tuple[float, float] | None:
    """The narrowest widening of the closed interval ``around`` that holds ``need`` problems by their pass rates
    ``avg_at_k`` (science §2: a bucket's bounds), or None when fewer than ``need`` lie strictly between 0 and 1.

    The bounds move out to the nearest pass rates, one at a time, on the side whose next rate is nearer, and
    only to rates strictly between 0 and 1: a problem always or never solved gives GRPO's group no reward
    signal. Rounded outwards to 3 decimals, so that the bounds as written hold the same problems."""
    p = np.asarray(avg_at_k, dtype=float)
    inner = np.unique(p[(p > 0) & (p < 1)])
    lo, hi = float(around[0]), float(around[1])

    def held(a: float, b: float) -> int:
        return int(((p >= a) & (p <= b)).sum())

    if held(lo, hi) < need and held(min([lo, *inner[:1]]), max([hi, *inner[-1:]])) < need:  # no rate inside: as is
        return None
    below, above = [float(x) for x in inner[inner < lo][::-1]], [float(x) for x in inner[inner > hi]]
    while held(lo, hi) < need:
        if not above or (below and lo - below[0] <= above[0] - hi):
            lo = below.pop(0)
        else:
            hi = above.pop(0)
    return math.floor(lo * 1000) / 1000, math.ceil(hi * 1000) / 1000


def split_bucket(problem_ids: Sequence[str], val_size: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """Seeded split into (train, val) with a fixed-size validation set."""
    ids = sorted(problem_ids)  # sort first: the split must not depend on row order
    order = rng.permutation(len(ids))
    val = [ids[i] for i in order[:val_size]]
    train = [ids[i] for i in order[val_size:]]
    return train, val


@dataclass
class BucketSplit:
    bucket: str
    train: list[str]
    val: list[str]


def make_splits(
    membership: pd.DataFrame,
    val_size: int,
    seed: int,
    used: Sequence[str],
    mixtures: Mapping[str, Sequence[tuple[str, float]]] | None = None,
    more_problems: str = "data.size",
) -> dict[str, BucketSplit]:
    """Train/validation splits for every base bucket and named mixture.

    A bucket later stages use (``used``) that is empty or has no more problems
    than its validation size is a :class:`BucketError`; for other buckets it is
    a warning and the bucket is kept with what it has. A mixture takes each
    part's fraction of its train and validation sets from the parts' own
    splits, as large as the scarcest part allows, so mixture validation
    problems are never in any train split of the same bucket. ``more_problems``: the params key that
    profiles more problems, named in the error (``DataParams.more_problems``).
    """
    splits: dict[str, BucketSplit] = {}
    for i, bucket in enumerate(BASE_BUCKETS):
        ids = membership.loc[membership["bucket"] == bucket, "problem_id"].tolist()
        if not ids:
            if bucket in used:
                raise BucketError(f"bucket {bucket!r} is empty, but bucket.used needs it: widen its bounds or profile more problems")
            log.warning("bucket %s is empty", bucket)
            continue
        if len(ids) <= val_size:
            msg = f"bucket {bucket!r} has {len(ids)} problems, not more than bucket.val_size = {val_size}"
            if bucket in used:
                raise BucketError(msg + f": profile more problems ({more_problems}) or lower bucket.val_size")
            log.warning("%s; it gets no validation set", msg)
            splits[bucket] = BucketSplit(bucket, sorted(ids), [])
            continue
        train, val = split_bucket(ids, val_size, np.random.default_rng([seed, i]))
        splits[bucket] = BucketSplit(bucket, train, val)
    for j, (name, parts) in enumerate((mixtures or {}).items()):
        missing = [b for b, _ in parts if b not in splits or not splits[b].val]
        if missing:
            msg = f"mixture {name!r} needs bucket(s) {missing} with a validation set"
            if name in used:
                raise BucketError(msg)
            log.warning("%s; mixture skipped", msg)
            continue
        rng = np.random.default_rng([seed, 100 + j])
        train_total = min(len(splits[b].train) / f for b, f in parts)
        val_total = min(val_size, *(len(splits[b].val) / f for b, f in parts))
        train, val = [], []
        for b, f in parts:
            train += list(rng.choice(splits[b].train, int(train_total * f), replace=False))
            val += list(rng.choice(splits[b].val, int(val_total * f), replace=False))
        splits[name] = BucketSplit(name, sorted(train), sorted(val))
    return splits


def splits_table(splits: Mapping[str, BucketSplit]) -> pd.DataFrame:
    """The ``buckets`` table: one row per (problem, bucket) with its split."""
    rows = [
        {"problem_id": pid, "bucket": s.bucket, "split": split}
        for s in splits.values()
        for split, ids in (("train", s.train), ("val", s.val))
        for pid in ids
    ]
    return pd.DataFrame(rows, columns=["problem_id", "bucket", "split"])


def bucket_counts(table: pd.DataFrame, n_profiled: int) -> pd.DataFrame:
    """Counts per bucket and split, with the share of the profiled pool."""
    counts = table.groupby(["bucket", "split"]).size().unstack(fill_value=0)
    for col in ("train", "val"):
        if col not in counts:
            counts[col] = 0
    counts["total"] = counts["train"] + counts["val"]
    counts["share_of_pool"] = counts["total"] / max(n_profiled, 1)
    return counts.reset_index()[["bucket", "train", "val", "total", "share_of_pool"]]
