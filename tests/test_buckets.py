"""Buckets and seeded splits (science §2)."""

import numpy as np
import pandas as pd
import pytest

from rollscale.core.problems.buckets import BucketError, assign_buckets, bucket_counts, make_splits, splits_table

BOUNDS = {"easy": (0.3, 0.6), "hard": (0.0, 0.0625), "very_easy": (0.6, 0.9)}


def profile(avg, extreme=None):
    avg = np.asarray(avg, float)
    df = pd.DataFrame({"problem_id": [f"p{i:03d}" for i in range(len(avg))], "avg_at_k": avg,
                       "n_correct": np.round(avg * 16).astype(int)})
    if extreme is not None:
        df["n_correct_extreme"] = extreme
    return df


def test_assign_closed_intervals_and_extremely_hard():
    df = profile([0.0, 0.0, 0.0625, 0.3, 0.6, 0.9, 1.0, 0.2], extreme=[0, 3, 1, 5, 10, 14, 16, 3])
    m = assign_buckets(df, BOUNDS)
    by = m.groupby("bucket")["problem_id"].apply(set).to_dict()
    assert by["hard"] == {"p000", "p001", "p002"}
    assert by["easy"] == {"p003", "p004"}
    assert by["very_easy"] == {"p004", "p005"}  # 0.6 sits in both closed intervals
    assert by["extremely_hard"] == {"p000"}  # zero at k and at k_extreme


def test_assign_needs_extreme_column():
    with pytest.raises(ValueError, match="n_correct_extreme"):
        assign_buckets(profile([0.0]), BOUNDS, extremely_hard=True)


def test_splits_seeded_disjoint_and_independent_of_row_order():
    rng = np.random.default_rng(0)
    df = profile(rng.uniform(0, 1, 400), extreme=np.zeros(400, int))
    m = assign_buckets(df, BOUNDS, extremely_hard=False)
    s1 = make_splits(m, 10, seed=3, used=["easy"], mixtures={"mix": [("easy", 0.5), ("very_easy", 0.5)]})
    s2 = make_splits(m.sample(frac=1, random_state=1), 10, seed=3, used=["easy"],
                     mixtures={"mix": [("easy", 0.5), ("very_easy", 0.5)]})
    s3 = make_splits(m, 10, seed=4, used=["easy"])
    assert s1["easy"].val == s2["easy"].val and s1["mix"].train == s2["mix"].train
    assert s1["easy"].val != s3["easy"].val
    for s in s1.values():
        assert not set(s.train) & set(s.val)
    assert len(s1["easy"].val) == 10
    # a mixture's validation problems come from its parts' validation sets only
    assert set(s1["mix"].val) <= set(s1["easy"].val) | set(s1["very_easy"].val)
    assert len(s1["mix"].val) == 10
    table = splits_table(s1)
    counts = bucket_counts(table, len(df)).set_index("bucket")
    assert counts.loc["easy", "val"] == 10 and counts.loc["easy", "total"] == len(
        m[m.bucket == "easy"])


def test_used_bucket_too_small_is_an_error_unused_is_a_warning(caplog):
    m = assign_buckets(profile([0.4, 0.5, 0.0, 0.0, 0.0, 0.0]), BOUNDS, extremely_hard=False)
    with pytest.raises(BucketError, match=r"bucket 'easy' has 2 problems, not more than bucket.val_size = 2"):
        make_splits(m, 2, seed=0, used=["easy"])
    with pytest.raises(BucketError, match=r"bucket 'very_easy' is empty"):
        make_splits(m, 2, seed=0, used=["very_easy"])
    splits = make_splits(m, 2, seed=0, used=["hard"])
    assert splits["easy"].val == [] and "easy" in caplog.text


def test_bounds_holding_a_pool_no_problem_of_which_is_between_0_and_1_is_none():
    """A model that solves every problem always or never (a pilot of a random model): no bounds hold any, and the
    answer is None, not an error."""
    from rollscale.core.problems.buckets import bounds_holding

    assert bounds_holding([0.0, 0.0, 1.0], 1, (0.3, 0.6)) is None
    assert bounds_holding([0.0, 0.5, 1.0], 1, (0.3, 0.6)) == (0.3, 0.6)
