"""The ``fit`` and ``report`` flows in-process on a tiny synthetic artifacts folder laid out as the sweep writes it."""

from __future__ import annotations

import re

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from flows.fit import fit_flow
from flows.report import report_flow
from rollscale.core.fit.verdict import honest_intervals, interval_faults
from rollscale.files import write_parquet_atomic
from rollscale.pipeline.query.storage import query
from rollscale.train.checkpoint import RunStore

D = 200
B_PROBLEM = 8
C_MAX = 200_000
# rollout axis: n* moves from 2 to 8 as compute grows
CURVES = {2: (0.1, 0.45, 2_000.0, 2.0), 4: (0.1, 0.6, 6_000.0, 2.0), 8: (0.1, 0.75, 20_000.0, 2.0)}


def _reward(c, r0, a, c_mid, beta):
    with np.errstate(divide="ignore", over="ignore"):
        return r0 + (a - r0) / (1.0 + (c_mid / np.maximum(c, 1e-300)) ** beta)


def _write_sweep(root, rng, seeds=(0,)):
    """runs/<run_id>/run.parquet, steps-*.parquet and evals-*.parquet, committed by two checkpoints each."""
    for (n, theta), seed in ((item, seed) for item in CURVES.items() for seed in seeds):
        run_id = f"np{B_PROBLEM}_nr{n}_uniform_s{seed}"
        m = C_MAX // (n * B_PROBLEM)
        steps = np.unique(np.r_[0, np.geomspace(1, m, 40).astype(int)])
        c = steps * n * B_PROBLEM
        reward = np.clip(_reward(c, *theta) + rng.normal(0, 0.005, len(c)), 0, 1)
        evals = pd.DataFrame({"run_id": run_id, "step": steps, "c": c, "c_tokens": c * 6,
                              "epochs": steps * B_PROBLEM / D, "k": 4, "n_problems": 64, "avg_at_k": reward,
                              "avg_at_k_se": 0.03,
                              "best_at_k": np.minimum(1, reward + 0.2), "worst_at_k": np.maximum(0, reward - 0.2),
                              "greedy": reward, "t_eval": 0.1})
        train_steps = np.arange(1, m + 1, max(1, m // 50))
        step_rows = pd.DataFrame({"run_id": run_id, "step": train_steps, "c": train_steps * n * B_PROBLEM,
                                  "c_tokens": train_steps * n * B_PROBLEM * 6, "epochs": train_steps * B_PROBLEM / D,
                                  "reward_mean": 0.3, "zero_var_frac": 0.2, "t_generate": 0.1, "t_score": 0.01,
                                  "t_train": 0.05, "n": n, "b_problem": B_PROBLEM,
                                  # the two halves of prompts (science §6.4): |G|^2 = 1 with noise
                                  "half_dot": rng.normal(1.0, 0.3, len(train_steps)),
                                  "half_diff2": rng.gamma(4.0, 1.0, len(train_steps)), "half_prompts_a": B_PROBLEM // 2,
                                  "half_prompts_b": B_PROBLEM // 2, "half_rollouts_a": n * B_PROBLEM // 2,
                                  "half_rollouts_b": n * B_PROBLEM // 2})
        run_dir = root / "sweep" / "runs" / run_id
        half = len(evals) // 2
        store = RunStore(run_dir)  # committed by checkpoint manifests, as the sweep commits them
        for e, s in ((evals[:half], step_rows[: len(step_rows) // 2]), (evals[half:], step_rows[len(step_rows) // 2:])):
            store.save(int(e["step"].iloc[-1]), {}, {}, {"c": int(e["c"].iloc[-1])},
                       step_rows=s.to_dict("records"), eval_rows=e.to_dict("records"))
        write_parquet_atomic(pd.DataFrame([{
            "run_id": run_id, "bucket": "easy", "n": n, "b_problem": B_PROBLEM, "m": n, "rule": "uniform", "seed": seed,
            "c_max": C_MAX, "lr": 1e-4, "kl_coef": 0.001, "entropy_coef": 0.001, "status": "finished",
            "steps": int(steps[-1]), "c": int(c[-1]), "c_tokens": int(c[-1] * 6), "error": None,
        }]), run_dir / "run.parquet")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump({"fit": {"bin_width": 0.01, "grid_points": 30}, "report": {"k_sat_cap": 50}}))
    artifacts = root / "artifacts"
    _write_sweep(artifacts, np.random.default_rng(0))
    write_parquet_atomic(pd.DataFrame({"step": [0, 10, 20], "n": 16, "rho_icc": 0.2, "k_sat_icc": 5.0,
                                       "k_crit": [4.0, 5.0, math.inf], "b_simple": 30.0, "crs": [4.0, 5.0, 5.0]}),
                         artifacts / "measure" / "noise_steps.parquet")
    tables = fit_flow(params_path=str(params), artifacts=str(artifacts))
    paths = report_flow(params_path=str(params), artifacts=str(artifacts))
    return artifacts, tables, paths


def test_fit_flow_writes_every_fit_table_and_duckdb_views(study):
    artifacts, tables, _ = study
    for name in ("fits", "frontier", "steps_to_target", "crs_prediction", "epoch_transitions", "record_points",
                 "decision", "noise_along"):
        assert (artifacts / "fit" / f"{name}.parquet").exists(), name
    along = query("SELECT * FROM noise_along", artifacts)
    assert len(along) and set(along["n"]) == set(CURVES) and (along["g2"] > 0).all()
    assert (artifacts / "rollscale.duckdb").exists()
    fits = query("SELECT kind, key, status FROM fits ORDER BY kind, key", artifacts)
    ok = fits[fits["status"] == "ok"]
    assert {"sigmoid_n", "n_star", "steps_to_target_rollout"} <= set(ok["kind"])
    assert sorted(ok.loc[ok["kind"] == "sigmoid_n", "key"]) == [2, 4, 8]
    # one n per B and one B_problem: these designs and the prompt axis say why they have no fit
    why = fits.set_index("kind")["status"]
    assert why["n_star_b_problem"] == "no two runs with the same n and different B_problem"
    assert why["n_star_iso_batch"] == "no two n share a total batch B = n·B_problem"
    assert why["steps_to_target_prompt"] == "no two runs with the same n and different B_problem"
    # the rule rows take their step seconds from the sweep's steps table (t_generate + t_score + t_train)
    secs = query("SELECT seconds FROM fits WHERE kind = 'rollouts_to_target'", artifacts)["seconds"]
    assert len(secs) == 3 and (secs.dropna() > 0).all() and secs.notna().any()
    # the frontier moves from n = 2 at low compute to n = 8 at high compute (it starts where it has risen by
    # one bin: below, every curve is at the base reward and which fitted R0 is highest is noise)
    fr = query("SELECT c, best_key FROM frontier WHERE design = 'n' ORDER BY c", artifacts)
    assert fr["best_key"].iloc[0] == 2 and fr["best_key"].iloc[-1] == 8 and set(fr["best_key"]) == {2, 4, 8}
    tr = query("SELECT from_key, to_key, epochs, c FROM epoch_transitions ORDER BY c", artifacts)
    assert tr[["from_key", "to_key"]].values.tolist() == [[2, 4], [4, 8]]
    np.testing.assert_allclose(tr["epochs"], tr["c"] / (tr["to_key"] * D), rtol=1e-6)
    # record points: every run's step 0 is one, and they are a subset of the evaluations
    rp = query("SELECT run_id, count(*) AS n, sum(is_record::INT) AS records, bool_or(step = 0 AND is_record) AS s0 "
               "FROM record_points GROUP BY run_id", artifacts)
    assert len(rp) == 3 and rp["s0"].all() and (rp["records"] < rp["n"]).all() and (rp["records"] >= 4).all()
    # the CRS (median 5 at n = 16) predicts n = 4 under B_problem = 8 (no two n share a B)
    (crs,) = query("SELECT * FROM crs_prediction", artifacts).to_dict("records")
    assert crs["crs"] == 5.0 and crs["predicted_n"] == 4 and crs["basis"].startswith("same B_problem = 8")
    assert crs["observed_best_n"] == int(tables["crs_prediction"]["observed_best_n"].iloc[0])


def test_fit_flow_decides_at_the_target_budget(study):
    artifacts, _, _ = study
    d = query("SELECT * FROM decision WHERE design = 'n' ORDER BY key", artifacts)
    # C* = sweep.c_max by default; one seed per key: a leader, no interval, not decided, and what would decide
    assert d["key"].tolist() == [2, 4, 8] and (d["c_star"] == 40000).all() and (d["tolerance"] == 0.02).all()
    assert (d["status"] == "leader").sum() == 1 and not d["decided"].any()
    assert d["reward_lo"].isna().all() and d["to_decide"].str.contains("at least 2 seeds").all()
    assert (d["seeds"] == 1).all() and (d["steps"] == np.ceil(40000 / (d["n"] * d["b_problem"]))).all()


def test_report_flow_writes_html_pngs_and_summary(study):
    artifacts, _, paths = study
    out = artifacts / "report"
    html = (out / "index.html").read_text()
    summary = (out / "summary.md").read_text()
    for chart in ("reward_vs_compute", "frontier", "best_worst_at_k", "steps_to_target", "crs_prediction",
                  "noise_steps"):
        assert (out / "charts" / f"{chart}.png").read_bytes().startswith(b"\x89PNG"), chart
    # the profile and bucket stages did not run: the report says so instead of failing; the sweep ran
    # as a grid, so there is no search to draw (science §9.4)
    assert set(paths.missing) == {"difficulty", "k_sat", "search"}
    assert "sweep.search.method: grid" in paths.missing["search"]
    assert "dvc repro profile" in html and "dvc repro profile" in summary
    assert "Fit: sigmoid_n" in summary and "Fit: n_star_iso_batch" in summary
    assert "no two n share a total batch B" in summary


def test_past_the_data_the_fit_decides_from_the_forecast_and_the_report_says_so(tmp_path):
    """C* = 4 x the runs' budget (science §10.2): no run's own fit reaches it, so the decision table's rows are the
    forecast's, and the report's first line says so, with the backtest beside it and the 2x, 4x, 8x section."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"fit": {"bin_width": 0.01, "grid_points": 30, "bootstrap_resamples": 20},
                                      "sweep": {"c_max": C_MAX}, "study": {"target_budget": 4 * C_MAX}}))
    artifacts = tmp_path / "artifacts"
    _write_sweep(artifacts, np.random.default_rng(1), seeds=(0, 1))
    fit_flow(params_path=str(params), artifacts=str(artifacts))
    d = query("SELECT * FROM decision WHERE design = 'n' ORDER BY key", artifacts)
    assert d["key"].tolist() == [2, 4, 8] and (d["c_star"] == 4 * C_MAX).all()
    assert (d["source"] == "forecast").all() and (d["status"] == "leader").sum() == 1
    fc = query("SELECT * FROM forecast WHERE design = 'n' AND target AND trained ORDER BY key", artifacts)
    np.testing.assert_allclose(d["reward"], fc["reward"])
    np.testing.assert_allclose(d["d_hi"], fc["d_hi"])
    paths = report_flow(params_path=str(params), artifacts=str(artifacts))
    assert re.match(r"Use n = \d+ \(B_problem \d+, M = [\d,]+ steps\) at C\* = 800,000 rollouts \(4x the runs' "
                    r"budget, forecast past the data\): ", paths.headline) \
        or paths.headline.startswith("Not decided at C* = 800,000 rollouts (4x the runs' budget, forecast past the "
                                     "data)")
    assert "Forecast past the data (science §10): " in paths.headline
    assert "## With 2x, 4x, 8x more compute" in paths.summary.read_text()
    assert "more_compute" in paths.pngs
    # science §11.5: no estimate outside its interval, no degenerate interval, in any decision, forecast or fits row;
    # a row whose interval is not its refits' says why (two seeds: some fits' refits collapse)
    for name in ("decision", "forecast", "fits"):
        table = query(f"SELECT * FROM {name}", artifacts)
        assert interval_faults(table, name) == []
        assert "interval" in table.columns
    fits = query("SELECT * FROM fits", artifacts)
    assert fits["interval"].str.contains("no spread to bound: no interval").any()
    # science §11.6: n = 1 (a one-rollout group has no advantage under a group baseline) is neither forecast nor drawn
    every = query("SELECT * FROM forecast WHERE design = 'n'", artifacts)
    assert every["key"].min() >= 2 and (every["key"] == 16).any()  # the bracket's next key is still forecast


def test_fit_without_a_sweep_names_the_stage_and_report_still_writes(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="run the 'sweep' stage first"):
        fit_flow(params_path=str(params), artifacts=str(tmp_path / "artifacts"))
    paths = report_flow(params_path=str(params), artifacts=str(tmp_path / "artifacts"))
    assert not paths.pngs and "frontier" in paths.missing
    assert "dvc repro fit" in (tmp_path / "artifacts" / "report" / "summary.md").read_text()


def test_the_fit_stage_forecasts_with_the_studys_form(tmp_path):
    """``study.forecast_form`` reaches the forecast through the one constructor of its settings
    (rollscale.core.fit.verdict.forecast_settings, science §11.5): every row of the ``forecast`` table names it."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"fit": {"bin_width": 0.01, "grid_points": 10, "bootstrap_resamples": 5},
                                      "sweep": {"c_max": C_MAX},
                                      "study": {"target_budget": 4 * C_MAX, "forecast_form": "linear"}}))
    artifacts = tmp_path / "artifacts"
    _write_sweep(artifacts, np.random.default_rng(2), seeds=(0, 1))
    fit_flow(params_path=str(params), artifacts=str(artifacts))
    forms = query("SELECT DISTINCT form FROM forecast", artifacts)["form"].tolist()
    assert forms == ["linear"]


def test_an_interval_that_is_not_the_refits_is_fixed_and_says_why():
    """Science §11.5: an estimate outside its interval widens it; a degenerate interval (refits collapsed to one
    value, within a millionth of the estimate's scale: "0.477 [0.476998, 0.476998]") is no interval; each row says
    why in its ``interval`` column. A leader's D = 0 [0, 0] and a reward clipped at 1 are exact, left as they are."""
    t = pd.DataFrame({"key": [2, 4, 8, 16, 32],
                      "a": [0.4769982, 0.50, 0.60, 1.0, 0.55], "a_lo": [0.4769981, 0.45, 0.62, 1.0, 0.50],
                      "a_hi": [0.4769983, 0.55, 0.70, 1.0, 0.60],
                      "d": [0.0, -0.01, 0.02, 0.0, 0.01], "d_lo": [0.0, -0.03, 0.01, 0.0, 0.01],
                      "d_hi": [0.0, 0.01, 0.04, 0.0, 0.01]})
    assert len(interval_faults(t, "t")) == 3
    out = honest_intervals(t)
    assert interval_faults(out, "t") == []
    assert out.loc[0, ["a_lo", "a_hi"]].isna().all() and out.loc[0, ["d_lo", "d_hi"]].tolist() == [0.0, 0.0]
    assert out.loc[2, ["a_lo", "a_hi"]].tolist() == [0.60, 0.70]  # widened to hold 0.60
    assert out.loc[3, ["a_lo", "a_hi", "d_lo", "d_hi"]].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.loc[4, ["d_lo", "d_hi"]].isna().all()  # D = 0.01 [0.01, 0.01] is not exact: no interval
    assert out["interval"].tolist() == [
        "a: its refits agree to one value, no spread to bound: no interval", "",
        "a: the interval widened to hold the estimate (a skewed bootstrap)", "",
        "d: its refits agree to one value, no spread to bound: no interval"]
    # a table with its own interval column (fits: how the interval was made) keeps what it said
    kept = honest_intervals(t.assign(interval="bootstrap over 2 seeds"))
    assert kept.loc[0, "interval"] == ("bootstrap over 2 seeds; a: its refits agree to one value, no spread to "
                                       "bound: no interval") and kept.loc[1, "interval"] == "bootstrap over 2 seeds"


def test_a_study_that_cannot_answer_says_why_first(study, tmp_path):
    """A study `rollscale init --force` wrote after its refusal ("... no study resolves 0.02: ...", issue 56): the
    report's first reason is that line, the verdict `rollscale check` gives on its params.yaml."""
    import shutil

    from rollscale.config import load_params
    from rollscale.pipeline.check.answerable import cannot_answer

    artifacts = tmp_path / "artifacts"
    shutil.copytree(study[0], artifacts)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"fit": {"bin_width": 0.01, "grid_points": 30}, "report": {"k_sat_cap": 50},
                                      "bucket": {"val_size": 4}, "sweep": {"eval_k": 4}}))
    line = cannot_answer(load_params(params), artifacts)
    assert line is not None and "no study resolves 0.02" in line
    report_flow(params_path=str(params), artifacts=str(artifacts))
    summary = (artifacts / "report" / "summary.md").read_text().splitlines()
    first = next(i for i, s in enumerate(summary) if s in ("What to change:", "What would sharpen it:"))
    assert summary[first + 2] == f"- {line}"
    assert line in (artifacts / "report" / "index.html").read_text()
    # the study as the fixture wrote it can answer at its tolerance: no such line
    assert cannot_answer(load_params(study[0].parent / "params.yaml"), study[0]) is None
