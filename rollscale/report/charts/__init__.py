"""The report's figures in order (science §2, §5, §6.2, §6.3, §7, §9.4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from rollscale.report.base import ChartSpec, bucket_bounds, check_tables, params_dict
from rollscale.report.charts.noise import chart_difficulty, chart_k_sat, chart_noise_steps
from rollscale.report.charts.curves import chart_best_worst, chart_frontier, chart_reward_vs_compute
from rollscale.report.charts.search import chart_search
from rollscale.report.charts.targets import chart_crs_prediction, chart_steps_to_target


_CHART_BUILDERS = (
    chart_difficulty,
    chart_k_sat,
    chart_noise_steps,
    chart_reward_vs_compute,
    chart_search,
    chart_frontier,
    chart_best_worst,
    chart_steps_to_target,
    chart_crs_prediction,
)


def build_charts(tables: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any] | None = None) -> list[ChartSpec]:
    """The report's nine figures, in order (science §2, §5, §6.2, §6.3, §7, §9.4).

    1. ``difficulty``: avg@k histogram with the bucket bands of
       ``params["bucket"]`` (defaults easy [0.3, 0.6], hard [0, 0.0625],
       very_easy [0.6, 0.9]).
    2. ``k_sat``: split-half K_sat against pass rate with the null |R| + 1;
       K_sat above ``params["report"]["k_sat_cap"]`` (default 4 × the largest
       n) or infinite is drawn at the cap as a distinct marker.
    3. ``noise_steps``: B_simple, K_crit, K_sat_icc (log) and rho_icc over steps.
    4. ``reward_vs_compute``: validation avg@k ± SE against C, every run, by n.
    5. ``search``: the search's runs against C, its rungs and where
       stopped runs ended, by stop rule (missing for a grid sweep).
    6. ``frontier``: F(C) coloured by n* and the fitted n*(C), per design.
    7. ``best_worst_at_k``: best@k and worst@k against C per run, peaks marked.
    8. ``steps_to_target``: S(B) and E(B) with their fits, prompt and rollout axes.
    9. ``crs_prediction``: predicted against observed best n, with y = x.

    A table that is missing (None, absent or empty) or too small gives a
    ChartSpec with ``missing`` naming the stage to run; a present table
    lacking the columns a chart needs raises ValueError.
    """
    t = check_tables(tables)
    p = params_dict(params)
    bucket_bounds(p)  # bad bounds fail before any drawing
    return [builder(t, p) for builder in _CHART_BUILDERS]
