"""Outlier handling and summaries of per-prompt K_sat (science §6.3).

The essay's IQR filter, unfiltered and filtered statistics, and the table by
pass-rate quintile, as the report shows them beside the null value of K_sat.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["iqr_filter", "quintile_table", "summary_stats"]




def _as_values(values: np.ndarray, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {v.shape}")
    if np.any(np.isnan(v)):
        raise ValueError(f"{name}: expected numbers (inf allowed), found NaN")
    return v


def iqr_filter(values: np.ndarray) -> np.ndarray:
    """Keep-mask of the essay's IQR filter (science §6.3).

    Keeps values inside ``[Q1 - 1.5 IQR, Q3 + 1.5 IQR]``, the quartiles
    taken (linear interpolation) over the finite values only. Infinite
    values (K_sat of a group with rho <= 0) are always dropped: they are
    outliers by definition, and letting them into the quartiles would make
    the fences infinite. With no finite values nothing is kept.
    """
    v = _as_values(values, "values")
    finite = np.isfinite(v)
    if not finite.any():
        return np.zeros(v.shape, dtype=bool)
    q1, q3 = np.percentile(v[finite], [25.0, 75.0])
    iqr = q3 - q1
    return finite & (v >= q1 - 1.5 * iqr) & (v <= q3 + 1.5 * iqr)


def _stats(v: np.ndarray) -> dict[str, float]:
    if v.size == 0:
        return {"count": 0, "mean": math.nan, "median": math.nan, "std": math.nan, "max": math.nan}
    return {
        "count": int(v.size),
        "mean": float(np.mean(v)),
        "median": float(np.median(v)),
        "std": float(np.std(v, ddof=1)) if v.size > 1 else math.nan,
        "max": float(np.max(v)),
    }


def summary_stats(values: np.ndarray) -> dict[str, float]:
    """Unfiltered and IQR-filtered count, mean, median, std, max (science §6.3).

    Keys: ``count, mean, median, std, max`` (all values) and the same with a
    ``_filtered`` suffix (after :func:`iqr_filter`). ``std`` is the sample
    std (ddof = 1), as pandas reports it. Unfiltered statistics keep
    infinities as they are: any inf makes ``mean`` and ``max`` inf and
    ``std`` NaN.
    """
    v = _as_values(values, "values")
    out: dict[str, float] = {}
    with np.errstate(invalid="ignore"):
        out.update(_stats(v))
        out.update({f"{key}_filtered": val for key, val in _stats(v[iqr_filter(v)]).items()})
    return out


def quintile_table(
    pass_rates: np.ndarray, k_sats: np.ndarray, drop_outliers: bool = True
) -> pd.DataFrame:
    """K_sat by pass-rate quintile: count, mean, median, std (science §6.3).

    Bins are the quintiles of ``pass_rates`` (``pandas.qcut``); tied
    quintile edges (pass rates are multiples of 1/n) merge bins, so fewer
    than five rows can come back, and one row when all pass rates are equal.
    With ``drop_outliers`` the global :func:`iqr_filter` removes K_sat
    outliers first (binning still uses every prompt) and ``n_outliers``
    counts what was dropped per bin. Index: the pass-rate interval.
    """
    pr = _as_values(pass_rates, "pass_rates")
    ks = _as_values(k_sats, "k_sats")
    if pr.shape != ks.shape:
        raise ValueError(
            f"pass_rates, k_sats: expected equal lengths, got {pr.shape[0]} and {ks.shape[0]}"
        )
    if pr.size == 0:
        raise ValueError("pass_rates: expected at least one value")
    if not np.all(np.isfinite(pr)):
        raise ValueError("pass_rates: expected finite values")
    if np.unique(pr).size == 1:
        bins = pd.Categorical([pd.Interval(pr[0], pr[0], closed="both")] * pr.size)
    else:
        bins = pd.qcut(pr, 5, duplicates="drop")
    keep = iqr_filter(ks) if drop_outliers else np.ones(ks.shape, dtype=bool)
    frame = pd.DataFrame({"bin": bins, "k_sat": ks, "keep": keep})
    with np.errstate(invalid="ignore"):
        grouped = frame[frame["keep"]].groupby("bin", observed=False)["k_sat"]
        table = grouped.agg(["count", "mean", "median", "std"])
    if drop_outliers:
        dropped = (~frame["keep"]).groupby(frame["bin"], observed=False).sum()
        table["n_outliers"] = dropped.astype(int)
    table.index.name = "pass_rate_quintile"
    return table
