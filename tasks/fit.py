"""Tasks of the ``fit`` and ``report`` stages: the study-level analysis of science §7.

Each task wraps one :mod:`rollscale.core.fit.analysis` call; DVC decides when the
stage reruns (no Prefect result cache).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollscale.config import FitParams, SweepParams
from rollscale.core.fit import analysis
from rollscale.core.fit.bootstrap import Bootstrap
from rollscale.core.fit.decision_table import decision_table, with_forecast
from rollscale.core.fit.horizon import HorizonTables, forecast_budgets, horizon_tables
from rollscale.core.fit.verdict import ANSWER_WIDTH, forecast_settings, trainable
from rollscale.core.noise.along import measured_rho, noise_along_table
from rollscale.pipeline.query.storage import available_tables, query
from rollscale.tables import TABLES
from tasks.common import retried_task


def read_tables(artifacts: Path, names: list[str]) -> dict[str, pd.DataFrame | None]:
    """The named study tables as DataFrames (through the DuckDB views); None for those not written yet."""
    unknown = sorted(set(names) - set(TABLES))
    if unknown:
        raise ValueError(f"names: unknown study tables {unknown} (expected some of {list(TABLES)})")
    have = available_tables(artifacts)
    return {name: query(f"SELECT * FROM {name}", artifacts) if name in have else None for name in names}


def _boot(fit_params: FitParams) -> Bootstrap:
    return Bootstrap(fit_params.bootstrap_resamples, fit_params.bootstrap_seed)


@retried_task(name="run-evals")
def evaluations(runs: pd.DataFrame, evals: pd.DataFrame, fit_params: FitParams) -> pd.DataFrame:
    return analysis.run_evals(runs, evals, fit_params.run_status)


@retried_task(name="record-points")
def record_points(evals: pd.DataFrame, fit_params: FitParams) -> pd.DataFrame:
    return analysis.record_points(evals, fit_params.bin_width)


@retried_task(name="frontier")
def frontier(points: pd.DataFrame, design: str, fit_params: FitParams,
             reach_factor: float = 2.0) -> analysis.FrontierTables:
    # the frontier starts where it has risen by one record bin: below, every n is at the base reward;
    # a curve is trusted reach_factor (the search's eta, science §8 A3) times past its last evaluation
    return analysis.frontier_analysis(points, design, fit_params.grid_points, min_gain=fit_params.bin_width,
                                      boot=_boot(fit_params), reach_factor=reach_factor)


@retried_task(name="steps-to-target")
def steps_to_target(evals: pd.DataFrame, fit_params: FitParams) -> analysis.SteppedTables:
    return analysis.steps_to_target_analysis(evals, fit_params.target, fit_params.target_gain, _boot(fit_params))


@retried_task(name="rule-comparison")
def rule_comparison(evals: pd.DataFrame, steps: pd.DataFrame | None, fit_params: FitParams) -> pd.DataFrame:
    return analysis.rule_comparison(evals, fit_params.target, fit_params.target_gain, _boot(fit_params), steps)


@retried_task(name="crs-prediction")
def crs_prediction(evals: pd.DataFrame, noise_steps: pd.DataFrame | None, fit_params: FitParams) -> pd.DataFrame:
    return analysis.crs_prediction(evals, noise_steps, _boot(fit_params))


@retried_task(name="noise-along")
def noise_along(runs: pd.DataFrame, steps: pd.DataFrame | None, noise_prompts: pd.DataFrame | None,
                fit_params: FitParams) -> pd.DataFrame:
    # science §6.4: every run's and key's steps pooled per doubling of C, rho_icc from the measure stage
    return noise_along_table(runs, steps, measured_rho(noise_prompts, fit_params.bootstrap_resamples),
                             fit_params.bootstrap_resamples,
                             fit_params.bootstrap_seed)


@retried_task(name="decision")
def decision(evals: pd.DataFrame, c_star: int, tolerance: float, eta: float, fit_params: FitParams,
             search: pd.DataFrame | None = None) -> pd.DataFrame:
    # the refits that name the leader use the fit stage's resamples and seed (science §9.4); the sweep's search
    # table carries the keys it settled and the key it named
    return decision_table(evals, c_star, tolerance, eta, max(fit_params.bootstrap_resamples, 1),
                          fit_params.bootstrap_seed, search=search)


@retried_task(name="forecast")
def forecast(evals: pd.DataFrame, c_star: int, c_max: int, eval_draws: int | None, fit_params: FitParams,
             form: str, sweep: SweepParams | None = None) -> HorizonTables:
    # science §10-11: the forecast (its form: study.forecast_form) read at C* and at 2x, 4x, 8x the runs' budget,
    # with its backtest; the evaluation noise redrawn in each refit is avg@k's over the validation problems
    # (eval_draws samples)
    settings = forecast_settings(fit_params.bootstrap_resamples, fit_params.bootstrap_seed, eval_draws, form=form)
    tables = horizon_tables(evals, c_star, forecast_budgets(c_star, c_max), settings)
    if sweep is None or tables.forecast.empty:
        return tables
    # science §11.6: a key the recipe cannot train (n = 1 under a group baseline, past the bracket) is no candidate
    fc = tables.forecast
    keep = fc["trained"].astype(bool) | trainable(fc, sweep.b_max, list(sweep.b_problem), list(sweep.n),
                                                  sweep.search.key_min, sweep.search.key_max)
    return HorizonTables(fc[keep].reset_index(drop=True), tables.backtest)


@retried_task(name="decision-past-the-data")
def decision_past_the_data(decided: pd.DataFrame, ahead: pd.DataFrame) -> pd.DataFrame:
    # a group whose C* lies beyond eta x its data is read from the forecast (science §10.2), its verdict the search's
    # where the search chose its key (science §11.5): one decision table
    return with_forecast(decided, ahead, ANSWER_WIDTH)
