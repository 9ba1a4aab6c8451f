"""The report's figures in order: the answer and its forecast past the data, the learning curves, then difficulty and
noise (science §2-§10)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from rollscale.report.base import ChartSpec, bucket_bounds, check_tables, params_dict
from rollscale.report.charts.answer import chart_answer
from rollscale.report.charts.horizon import chart_more_compute
from rollscale.report.charts.noise import chart_difficulty, chart_k_sat, chart_noise_along, chart_noise_steps
from rollscale.report.charts.curves import chart_best_worst, chart_frontier, chart_reward_vs_compute
from rollscale.report.charts.search import chart_search
from rollscale.report.charts.targets import chart_crs_prediction, chart_steps_to_target


# the answer first (the page draws it right under the first line), the learning curves next, then what they
# rest on: difficulty and gradient noise
_CHART_BUILDERS = (
    chart_answer,
    chart_more_compute,
    chart_reward_vs_compute,
    chart_search,
    chart_frontier,
    chart_best_worst,
    chart_steps_to_target,
    chart_crs_prediction,
    chart_difficulty,
    chart_k_sat,
    chart_noise_along,
    chart_noise_steps,
)


def build_charts(tables: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any] | None = None) -> list[ChartSpec]:
    """The report's twelve figures, in order (science §9.4, §10, §7, §2, §6.2, §6.3, §6.4).

    1. ``answer``: each key's reward at C* with its interval, the leader and the ε band (the page draws it right
       under the first line; a forecast's keys, science §10, told apart from the trained ones).
    2. ``more_compute``: with 2x, 4x, 8x more compute: n*(C) and its reward with the 95 % interval against C,
       from the forecast past the data (science §10.5).
    3. ``reward_vs_compute``: validation avg@k ± SE against C, every run, by n.
    4. ``search``: the search's runs against C, its rungs and where
       stopped runs ended, by stop rule (missing for a grid sweep).
    5. ``frontier``: F(C) coloured by n* and the fitted n*(C), per design.
    6. ``best_worst_at_k``: best@k and worst@k against C per run, peaks marked.
    7. ``steps_to_target``: S(B) and E(B) with their fits, prompt and rollout axes.
    8. ``crs_prediction``: predicted against observed best n, with y = x.
    9. ``difficulty``: avg@k histogram with the bucket bands of
       ``params["bucket"]`` (defaults easy [0.3, 0.6], hard [0, 0.0625],
       very_easy [0.6, 0.9]).
    10. ``k_sat``: split-half K_sat against pass rate with the null |R| + 1;
        K_sat above ``params["report"]["k_sat_cap"]`` (default 4 × the largest
        n) or infinite is drawn at the cap as a distinct marker.
    11. ``noise_along``: |G|², B_simple and the CRS against C per key and doubling of C, with intervals, from every
        step's two halves of prompts (science §6.4), the measure stage's CRS beside it.
    12. ``noise_steps``: B_simple, K_crit, K_sat_icc (log) and rho_icc over the measure stage's steps (pre-sweep).

    A table that is missing (None, absent or empty) or too small gives a
    ChartSpec with ``missing`` naming the stage to run; a present table
    lacking the columns a chart needs raises ValueError.
    """
    t = check_tables(tables)
    p = params_dict(params)
    bucket_bounds(p)  # bad bounds fail before any drawing
    return [builder(t, p) for builder in _CHART_BUILDERS]
