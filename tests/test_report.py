"""Tests for the study report: charts, offline HTML, PNGs and the Markdown summary."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit import curves as fit
from rollscale.core.fit import frontier
from rollscale.core.noise.along import noise_along_table
from rollscale.report import (
    TABLE_NAMES,
    ChartSpec,
    build_charts,
    quintile_tables,
    summary_tables,
    write_report,
)
from tests.browser import CHROMIUM, chromium, console_messages

CHART_NAMES = [  # the answer and its forecast first, the learning curves next, difficulty and noise after (issue 41)
    "answer",
    "more_compute",
    "reward_vs_compute",
    "search",
    "frontier",
    "best_worst_at_k",
    "steps_to_target",
    "crs_prediction",
    "difficulty",
    "k_sat",
    "noise_along",
    "noise_steps",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------
# a small, plausible study


def _study_tables(seed: int = 0) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    k = 16
    n_problems = 300
    # difficulty: beta-binomial pass counts, many unsolved problems
    p_true = rng.beta(0.6, 1.2, n_problems)
    n_correct = rng.binomial(k, p_true)
    profile = pd.DataFrame(
        {
            "problem_id": [f"p{i:04d}" for i in range(n_problems)],
            "source": rng.choice(["gsm8k", "rg_arith"], n_problems),
            "prompt": "What is 2 + 2?",
            "answer": "4",
            "k": k,
            "n_correct": n_correct,
            "avg_at_k": n_correct / k,
            "mean_len": rng.normal(180, 40, n_problems).round(1),
            "trunc_rate": rng.uniform(0, 0.1, n_problems).round(3),
        }
    )
    bounds = {"easy": (0.3, 0.6), "hard": (0.0, 0.0625)}
    rows = []
    for pid, a in zip(profile["problem_id"], profile["avg_at_k"], strict=True):
        for bucket, (lo, hi) in bounds.items():
            if lo <= a <= hi:
                rows.append({"problem_id": pid, "bucket": bucket, "split": "val" if rng.random() < 0.2 else "train"})
    buckets = pd.DataFrame(rows)

    # split-half K_sat scatters around its null (9 for n = 16), a few infinite
    n = 16
    np_rows = []
    for step in (0, 20):
        for i in range(40):
            c = int(rng.integers(1, n))
            rho = rng.normal(1 / 9, 0.06)
            ks = math.inf if rho <= 0 else 1 / rho
            np_rows.append(
                {"step": step, "problem_id": f"p{i:04d}", "n": n, "pass_rate": c / n, "rho_split": rho,
                 "k_sat": ks, "k_sat_null": 9.0, "k_sat_ratio": ks / 9.0,
                 # the Gram pieces the pooled estimates are means of (science §6.2)
                 "k_diag": 1.0 + rng.normal(0, 0.05), "m_self": 0.12 + rng.normal(0, 0.02),
                 "m_cross": 0.03 + rng.normal(0, 0.02), "within": 0.9 + rng.normal(0, 0.05)}
            )
    noise_prompts = pd.DataFrame(np_rows)
    steps_m = np.arange(0, 50, 10)
    rho_icc = rng.uniform(0.02, 0.1, len(steps_m))
    k_crit = rng.uniform(8, 40, len(steps_m))
    k_crit[-1] = math.inf
    noise_steps = pd.DataFrame(
        {
            "step": steps_m, "n": n, "b_simple": rng.uniform(20, 80, len(steps_m)),
            "b_naive": rng.uniform(5, 16, len(steps_m)), "prompt_noise": rng.uniform(2, 10, len(steps_m)),
            "rollout_noise": rng.uniform(10, 60, len(steps_m)), "rho_icc": rho_icc, "k_sat_icc": 1 / rho_icc,
            "k_crit": k_crit, "crs": np.minimum(1 / rho_icc, k_crit), "trace_sigma": 1.0, "g_norm2": 0.02,
        }
    )

    # three runs at n = 4, 8, 16 with B_problem = 8; 10 evaluations each
    b_problem = 8
    run_rows, eval_rows, step_rows = [], [], []
    for n_run, (a, c_mid) in zip((4, 8, 16), ((0.55, 700.0), (0.62, 1500.0), (0.68, 3500.0)), strict=True):
        run_id = f"n{n_run}_b{b_problem}_s0"
        m = 200
        run_rows.append({"run_id": run_id, "bucket": "easy", "n": n_run, "b_problem": b_problem, "m": m,
                         "rule": "grpo", "seed": 0, "c_max": m * n_run * b_problem, "status": "finished", "steps": m,
                         "c": m * n_run * b_problem})
        # step 0, then log-spaced: the sigmoid's rise is where the evaluations are
        for step in [0, *np.unique(np.geomspace(2, m, 10).astype(int))]:
            c = step * n_run * b_problem
            mean = 0.2 + (a - 0.2) / (1 + (c_mid / max(c, 1)) ** 1.5)
            eval_rows.append({"run_id": run_id, "step": step, "c": c, "epochs": step * b_problem / 200,
                              "avg_at_k": mean + rng.normal(0, 0.01), "avg_at_k_se": 0.02,
                              "best_at_k": min(1.0, mean + 0.2 + rng.normal(0, 0.01)),
                              "worst_at_k": max(0.0, mean - 0.2 + rng.normal(0, 0.01)),
                              "greedy": mean, "eval_k": 4})
        for step in range(0, m, 20):
            step_rows.append({"run_id": run_id, "step": step, "c": step * n_run * b_problem,
                              "c_tokens": step * n_run * b_problem * 150, "epochs": step * b_problem / 200,
                              "reward_mean": 0.4, "zero_var_frac": 0.3, "entropy": 0.5, "kl": 0.01,
                              "response_len_mean": 150.0, "trunc_frac": 0.01, "grad_norm": 1.0, "lr": 1e-5,
                              "t_generate": 2.0, "t_score": 0.1, "t_train": 1.0})
    runs, evals, steps = pd.DataFrame(run_rows), pd.DataFrame(eval_rows), pd.DataFrame(step_rows)
    # a search (science §9.4) that kept every key: all continue at rung 1, all finish at rung 2
    group = f"n:bucket=easy/rule=grpo/b_problem={b_problem}"
    search = pd.DataFrame(
        [{"group": group, "decision": d, "rung": d, "c": c, "key": str(n_run), "seed": 0, "action": action,
          "rule": rule, "c_train": c_next, "leader": "8", "n_points": 6 * d, "note": note}
         for d, c, c_next, action, rule, note in ((1, 3200.0, 25600.0, "continue", "none", "no rule applies"),
                                                  (2, 25600.0, 25600.0, "finish", "budget", "reached C_max"))
         for n_run in (4, 8, 16)]
    )

    # fits with the library's own code, as the fit stage makes them
    fit_rows, curves = [], {}
    for n_run, g in evals.merge(runs[["run_id", "n"]]).groupby("n"):
        g = g[g["c"] > 0]
        f = fit.fit_sigmoid(g["c"], g["avg_at_k"])
        curves[int(n_run)] = f
        fit_rows.append({"kind": "sigmoid_n", "key": int(n_run), **f.to_dict()})
    grid = frontier.log_grid(200, 25600, 25)
    fr = frontier.frontier(curves, grid)
    ns = frontier.fit_n_star(np.log10(fr["c"]), fr["best_key"].astype(float))
    fit_rows.append({"kind": "n_star", "key": None, **ns.to_dict()})
    fr["design"] = "n"
    fr["n_star_fit"] = ns.predict(np.log10(fr["c"])) if ns.ok else np.nan

    st_rows = []
    for axis, bs in (("prompt", (32, 64, 128, 256)), ("rollout", (16, 32, 64, 128))):
        s_true = 40 * (1 + 60 / np.array(bs)) * rng.uniform(0.95, 1.05, len(bs))
        for b, s in zip(bs, s_true, strict=True):
            s = int(round(s))
            n_ax = 8 if axis == "prompt" else b // 8
            st_rows.append({"axis": axis, "b": b, "n": n_ax, "b_problem": b // n_ax, "steps": s, "e": b * s,
                            "target": 0.5})
        sf = fit.fit_steps_to_target(bs, [r["steps"] for r in st_rows if r["axis"] == axis])
        fit_rows.append({"kind": f"steps_to_target_{axis}", "key": None, **sf.to_dict()})
    crs_rows = []
    for b, crs_value, rewards in ((64, 7.0, {4: 0.50, 8: 0.55, 16: 0.52}), (128, 20.0, {4: 0.5, 8: 0.58, 16: 0.57}),
                                  (256, math.inf, {8: 0.6, 16: 0.63, 32: 0.61})):
        crs_rows.append({"b": b, **fit.predicted_vs_observed_best_n(crs_value, rewards).to_dict()})
    transitions = frontier.epochs_at_transitions(fr, lambda key, c: c / (key * 8 * 200 / 8))
    transitions.insert(0, "design", "n")
    # the noise along training (science §6.4): one key's 64 steps of two halves of 8 prompts
    along_steps = pd.DataFrame({"run_id": "along", "step": np.arange(1, 65), "c": np.arange(1, 65) * 64,
                                "half_dot": rng.normal(1.0, 0.5, 64), "half_diff2": rng.gamma(4.0, 1.0, 64),
                                "half_prompts_a": 8, "half_prompts_b": 8, "half_rollouts_a": 32, "half_rollouts_b": 32})
    along_runs = pd.DataFrame([{"run_id": "along", "bucket": "easy", "rule": "uniform", "n": 4, "b_problem": 16}])
    return {
        "profile": profile,
        "buckets": buckets,
        "noise_prompts": noise_prompts,
        "noise_steps": noise_steps,
        "runs": runs,
        "steps": steps,
        "evals": evals,
        "search": search,
        "fits": pd.DataFrame(fit_rows),
        "frontier": fr,
        "steps_to_target": pd.DataFrame(st_rows),
        "crs_prediction": pd.DataFrame(crs_rows),
        "noise_along": noise_along_table(along_runs, along_steps, {"easy": (0.05, "measure")}, resamples=50),
        "epoch_transitions": transitions,
    }


@pytest.fixture(scope="module")
def study() -> dict[str, pd.DataFrame]:
    return _study_tables()


@pytest.fixture(scope="module")
def ahead(study) -> dict[str, pd.DataFrame]:
    """The fit stage's ``forecast`` and ``backtest`` tables of the study (science §10), at C* = its c_max."""
    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.fit.forecast import ForecastSettings
    from rollscale.core.fit.horizon import forecast_budgets, horizon_tables

    c_max = float(study["runs"]["c_max"].max())
    out = horizon_tables(run_evals(study["runs"], study["evals"], None), c_max, forecast_budgets(c_max, c_max),
                         ForecastSettings(resamples=20, eval_draws=400))
    return {"forecast": out.forecast, "backtest": out.backtest}


@pytest.fixture(scope="module")
def full_report(study, ahead, tmp_path_factory):
    out = tmp_path_factory.mktemp("report_full")
    return write_report({**study, "decision": _decision(True), **ahead}, out,
                        params={"bucket": {"easy": [0.3, 0.6], "hard": [0.0, 0.0625]}})


@pytest.fixture(scope="module")
def profile_only_report(study, tmp_path_factory):
    out = tmp_path_factory.mktemp("report_profile_only")
    tables = {name: None for name in TABLE_NAMES}
    tables["profile"] = study["profile"]
    return write_report(tables, out)


def _layer_values(chart, i: int) -> list[dict]:
    """Data rows of layer i; Altair moves inline data into top-level named datasets."""
    spec = chart.to_dict()
    data = spec["layer"][i]["data"]
    return data["values"] if "values" in data else spec["datasets"][data["name"]]


# --------------------------------------------------------------------------
# charts


def test_build_charts_draws_every_chart_with_titles_and_units(study, ahead):
    charts = build_charts({**study, "decision": _decision(True), **ahead})
    assert [c.name for c in charts] == CHART_NAMES
    for c in charts:
        assert c.drawn, f"{c.name}: {c.missing}"
        assert c.title and c.caption.endswith(".")
        spec = c.chart.to_dict()
        text = str(spec)
        assert c.title in text
        # every chart names its units in brackets on an axis
        assert re.search(r"\[(rollouts|steps|tokens|fraction|count|rollouts per|dimensionless|0-1)", text), c.name


def test_k_sat_chart_clips_infinite_values_at_the_cap(study):
    (k_sat,) = [c for c in build_charts(study) if c.name == "k_sat"]
    n_inf = int(np.isinf(study["noise_prompts"]["k_sat"]).sum())
    assert n_inf > 0
    values = _layer_values(k_sat.chart, 1)
    plotted = [v["k_sat_plot"] for v in values]
    cap = 4 * 16
    assert all(v is not None and v <= cap for v in plotted)
    assert sum(1 for v in values if v["k_sat"] == "∞") == n_inf
    assert sum(1 for v in values if v["status"].startswith("clipped")) >= n_inf
    assert "cap" in k_sat.caption and f"{n_inf} infinite" in k_sat.caption
    # the null line is drawn
    lines = {v["line"]: v["y"] for v in _layer_values(k_sat.chart, 0)}
    assert lines == {"null |R|+1 = 9 (n = 16)": 9.0, "cap = 64 (K_sat above it drawn here)": 64.0}


def test_difficulty_bands_follow_params(study):
    (chart,) = [c for c in build_charts(study, {"bucket": {"easy": [0.25, 0.5]}}) if c.name == "difficulty"]
    bands = {v["bucket"]: (v["lo"], v["hi"]) for v in _layer_values(chart.chart, 0)}
    assert bands == {"hard": (0.0, 0.0625), "easy": (0.25, 0.5), "very_easy": (0.6, 0.9)}
    bars = _layer_values(chart.chart, 1)
    assert sum(b["problems"] for b in bars) == len(study["profile"])


def test_bad_params_and_tables_raise_clear_errors(study):
    with pytest.raises(ValueError, match=r"params\['bucket'\]\['easy'\]"):
        build_charts(study, {"bucket": {"easy": [0.7, 0.2]}})
    with pytest.raises(ValueError, match="unknown table names"):
        build_charts({"profiles": study["profile"]})
    with pytest.raises(ValueError, match=r"tables\['evals'\]: missing columns \['avg_at_k'\]"):
        build_charts({"evals": study["evals"].drop(columns=["avg_at_k"])})


def test_missing_tables_give_missing_charts_naming_the_stage():
    charts = build_charts({})
    assert all(not c.drawn for c in charts)
    by_name = {c.name: c.missing for c in charts}
    assert "dvc repro profile" in by_name["difficulty"]
    assert "dvc repro measure" in by_name["k_sat"]
    assert by_name["reward_vs_compute"] == "No sweep results yet: run the `sweep` stage (dvc repro sweep)."
    assert "dvc repro fit" in by_name["frontier"]
    with pytest.raises(ValueError, match="exactly one"):
        ChartSpec("x", "t", "c.")


def _variant_tables(study: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame | None]:
    """Two buckets, three frontier designs, two group sizes, no runs table, an unmeasured CRS."""
    t = dict(study)
    ev = t["evals"].copy()
    ev2 = ev.copy()
    ev2["run_id"] = ev2["run_id"] + "_hard"
    ev2["avg_at_k"] *= 0.5
    t["evals"] = pd.concat([ev, ev2], ignore_index=True)
    t["runs"] = None
    fr = t["frontier"]
    fb = fr.assign(design="b_problem", n_star_fit=np.nan)
    fi = fr.assign(design="iso_batch", m=np.geomspace(10, 400, len(fr)))
    t["frontier"] = pd.concat([fr, fb, fi], ignore_index=True)
    np8 = t["noise_prompts"].assign(n=8, k_sat_null=5.0)
    t["noise_prompts"] = pd.concat([t["noise_prompts"], np8], ignore_index=True)
    t["noise_steps"] = pd.concat([t["noise_steps"], t["noise_steps"].assign(n=8)], ignore_index=True)
    crs = t["crs_prediction"].copy()
    crs.loc[0, ["crs", "predicted_n"]] = [np.nan, np.nan]
    t["crs_prediction"] = crs
    return t


def test_variant_tables_still_draw_and_render(study, ahead):
    import io

    fc = ahead["forecast"]  # a second bucket's forecast: one colour a group
    scaled = {c: fc[c] * 0.5 for c in ("reward", "reward_lo", "reward_hi")}
    two = pd.concat([fc, fc.assign(bucket="hard", **scaled)], ignore_index=True)
    charts = build_charts({**_variant_tables(study), "decision": _decision(False), "forecast": two})
    assert all(c.drawn for c in charts), [c.missing for c in charts if not c.drawn]
    by_name = {c.name: c for c in charts}
    assert "coloured by run id" in by_name["reward_vs_compute"].caption
    assert "no fitted B_problem*(C) line" in by_name["frontier"].caption
    assert "1 batch sizes without a measured CRS" in by_name["crs_prediction"].caption
    # vl-convert compiles and draws each (a bad facet or layer fails here, not in to_dict)
    panels = by_name["more_compute"].chart.to_dict()["vconcat"]
    assert panels[0]["layer"][-2]["encoding"]["color"]["field"] == "group"
    for name in ("answer", "more_compute", "k_sat", "noise_steps", "reward_vs_compute", "search", "frontier",
                 "best_worst_at_k"):
        buf = io.StringIO()
        by_name[name].chart.save(buf, format="svg")
        assert buf.getvalue().startswith("<svg"), name


def test_quintile_tables_carry_the_null(study):
    q = quintile_tables(study["noise_prompts"])
    assert set(q) == {"unfiltered", "iqr_filtered"}
    unf, fil = q["unfiltered"], q["iqr_filtered"]
    assert unf["count"].sum() == len(study["noise_prompts"])
    assert (fil["count"] + fil["n_outliers"]).sum() == len(study["noise_prompts"])
    assert (unf["k_sat_null"] == 9.0).all()
    np.testing.assert_allclose(fil["median_ratio"], fil["median"] / 9.0)
    # filtered medians are finite; the unfiltered means see the infinite K_sat
    assert np.isfinite(fil["median"]).all()
    assert np.isinf(unf["mean"]).any()


def test_summary_tables_format_fits_with_intervals_or_say_one_seed(study):
    specs = {s.name: s for s in summary_tables(study)}
    sig = specs["fits_sigmoid_n"].frame
    assert list(sig["key"]) == ["4", "8", "16"]
    assert all(v.endswith("(1 seed, no interval)") for v in sig["c_mid"])  # the study has one seed per n
    fits = study["fits"].assign(c_mid_lo=study["fits"]["c_mid"] * 0.8, c_mid_hi=study["fits"]["c_mid"] * 1.25,
                                r0_lo=-1.9, r0_hi=study["fits"]["r0"], n_seeds=3)
    sig = {s.name: s for s in summary_tables({**study, "fits": fits})}["fits_sigmoid_n"].frame
    assert all(re.fullmatch(r"\S+ \[\S+, \S+\]", v) for v in sig["c_mid"])
    assert not sig["c_mid"].str.contains("e+", regex=False).any()  # budgets as people write them
    # a reward's interval is clipped to [0, 1]; an estimate on its interval's edge shows no interval
    assert all(v.endswith("(at the edge of its bootstrap: no interval)") for v in sig["r0"])
    two = {s.name: s for s in summary_tables({**study, "fits": fits.assign(n_seeds=2)})}["fits_sigmoid_n"].frame
    assert all(v.endswith("(2 seeds, no interval)") for v in two["c_mid"])  # science §9.3: no interval
    assert set(sig["status"]) == {"ok"}
    assert "at_bound" not in sig  # no fit left a parameter at a bound: no empty column
    unbent = fits.assign(at_bound=["log10_c_mid" if k == 16 else "" for k in fits["key"]])
    sig = {s.name: s for s in summary_tables({**study, "fits": unbent})}["fits_sigmoid_n"].frame
    assert list(sig["at_bound"]) == ["", "", "log10_c_mid"]
    buckets = specs["bucket_counts"].frame.set_index("bucket")
    assert int(buckets.loc["easy", "total"]) == int((study["buckets"]["bucket"] == "easy").sum())
    ks = specs["k_sat_summary"].frame
    median = ks[ks["statistic"] == "median"].iloc[0]
    assert median["null |R|+1"] == "9"


# --------------------------------------------------------------------------
# the written report


def test_full_report_is_self_contained_with_a_png_per_chart(full_report):
    page = full_report.html.read_text(encoding="utf-8")
    srcs = re.findall(r"<script[^>]*\bsrc\s*=", page, flags=re.IGNORECASE)
    assert srcs == [], "no script may load from a URL"
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, flags=re.IGNORECASE)
    assert "vegaEmbed" in page
    assert sorted(full_report.pngs) == sorted(CHART_NAMES)
    for name, path in full_report.pngs.items():
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 5000, name
        assert path == full_report.out_dir / "charts" / f"{name}.png"
    assert full_report.missing == {}
    for name in CHART_NAMES:
        assert f'id="chart-{name}"' in page
    md = full_report.summary.read_text(encoding="utf-8")
    for heading in ("## Bucket counts", "## Fit: sigmoid_n", "## Steps to target", "## CRS prediction check",
                    "## Runs", "K_sat by pass-rate quintile (IQR-filtered)"):
        assert heading in md
    assert "**Missing:**" not in md
    # no temporary files left behind
    assert not list(full_report.out_dir.rglob("*.tmp"))


def test_profile_only_report_names_the_missing_stages(profile_only_report):
    assert sorted(profile_only_report.pngs) == ["difficulty"]
    page = profile_only_report.html.read_text(encoding="utf-8")
    md = profile_only_report.summary.read_text(encoding="utf-8")
    for stage in ("bucket", "measure", "sweep", "fit"):
        assert f"dvc repro {stage}" in page
        assert f"dvc repro {stage}" in md
    assert page.count('class="missing" data-missing=') == len(CHART_NAMES) - 1
    assert "No sweep results yet: run the <code>sweep</code> stage (dvc repro sweep)." in page
    assert "No sweep results yet: run the `sweep` stage (dvc repro sweep)." in md


def test_rewrite_removes_the_png_of_a_chart_now_missing(study, tmp_path):
    write_report(study, tmp_path)
    assert (tmp_path / "charts" / "frontier.png").exists()
    tables = dict(study, frontier=None)
    paths = write_report(tables, tmp_path)
    assert not (tmp_path / "charts" / "frontier.png").exists()
    assert "frontier" in paths.missing


# --------------------------------------------------------------------------
# a real browser, offline


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)")
def test_report_renders_offline_in_chromium(full_report, tmp_path):
    url = full_report.html.resolve().as_uri()
    dom = chromium(["--dump-dom", url], tmp_path / "profile_dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []
    html = dom.stdout
    # a chart that failed to draw gets the "error" class (see the page's script)
    assert not re.search(r'class="chart[^"]*\berror\b', html)
    # one rendered SVG per chart container
    starts = [(m.start(), m.group(1)) for m in re.finditer(r'id="chart-([a-z_]+)"', html)]
    assert [name for _, name in starts] == CHART_NAMES
    ends = [pos for pos, _ in starts[1:]] + [html.index('id="tables"')]
    for (start, name), end in zip(starts, ends, strict=True):
        assert html[start:end].count('class="marks"') == 1, name
    shot = tmp_path / "report.png"
    res = chromium([f"--screenshot={shot}", "--window-size=1400,6000", url], tmp_path / "profile_shot")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_messages(res.stderr) == []
    assert shot.read_bytes().startswith(PNG_MAGIC)


def test_headline_states_intervals_and_what_cannot_be_told_apart():
    from rollscale.report.claims import headline_table, observations_table

    fits = pd.DataFrame({"kind": "rollouts_to_target", "bucket": "easy", "rule": ["uniform", "pods", "pilot"],
                         "fixed": "n=8, B_problem=16", "target": 0.4, "ratio_to_uniform": [np.nan, 0.52, 0.9],
                         "ratio_to_uniform_lo": [np.nan, 0.41, 0.7], "ratio_to_uniform_hi": [np.nan, 0.66, 1.2],
                         "verdict": [None, "fewer rollouts than uniform", "not distinguishable from uniform"],
                         "time_ratio_to_uniform": [np.nan, 0.49, np.nan],
                         "time_ratio_to_uniform_lo": [np.nan, 0.4, 0.3], "time_ratio_to_uniform_hi": [np.nan, 0.6, 0.9],
                         "time_verdict": [None, "less step time than uniform", None]})
    crs = pd.DataFrame({"bucket": ["all"], "rule": ["all"], "basis": ["iso-batch: B = 128"], "b": [128.0],
                        "crs": [7.0], "predicted_n": [8], "observed_best_n": [16], "observed_best_share": [0.6]})
    sigmoids = pd.DataFrame({"kind": "sigmoid_n", "bucket": "easy", "rule": "uniform", "key": ["4", "8"],
                             "a": [0.8, 102.2], "at_bound": ["", "log10_c_mid"]})
    # the decision at C* (n design) and at one total batch B = 128 (iso-batch), where the CRS is read
    iso = _decision(True).assign(design="iso_batch", fixed="B=128")
    tables = {"decision": pd.concat([_decision(True), iso], ignore_index=True), "fits": pd.concat([fits, sigmoids]),
              "crs_prediction": crs}
    frame = headline_table(tables).frame
    findings = list(frame["finding"])
    unbent = frame[frame["claim"] == "curve not bent within the budget"]
    assert list(unbent["at"]) == ["n = 8"]  # n = 4's fit is inside its range: no caveat
    assert unbent["finding"].iloc[0].startswith("log10_c_mid at the edge of the fit's range: A (102.2)")
    # each key against the leader, read from the decision's intervals: claims agree with the first line
    assert "n = 2 is below n = 4: D = -0.06 [-0.07, -0.05]" in findings
    assert "n = 8 is not distinguishable from n = 4: D = -0.005 [-0.015, 0.005]" in findings
    assert list(frame[frame["claim"] == "key against the leader"]["at"]) == ["C* = 40,000"] * 2
    assert not any("1 seed" in f for f in findings)  # a single-seed observation is never a claim
    assert "pods needs 0.52 [0.41, 0.66]× the rollouts of uniform: fewer rollouts than uniform" in findings
    assert any(f.startswith("pilot needs") and f.endswith("not distinguishable from uniform") for f in findings)
    assert "pods needs 0.49 [0.4, 0.6]× the step seconds of uniform: less step time than uniform" in findings
    time_rows = frame[frame["claim"] == "rule vs uniform (step seconds to target)"]
    assert list(time_rows["where"]) == ["easy / pods"]  # pilot has no finite time ratio: no time claim
    assert ("CRS 7 predicts n = 8; the decision's best n = 4, n = 8 is not distinguishable: D = -0.005 [-0.015, 0.005]"
            in findings)
    # one seed a key: no pooled spread, so what the decision shows is an observation
    one = _decision(True).assign(df=0, reward_lo=np.nan, reward_hi=np.nan, d_lo=np.nan, d_hi=np.nan)
    obs = observations_table({"decision": one, "fits": None, "crs_prediction": None}).frame
    assert list(obs["finding"]) == ["n = 2 against n = 4: D = -0.06 (1 seed, no interval)",
                                    "n = 8 against n = 4: D = -0.01 (1 seed, no interval)"]
    assert headline_table({"frontier": None, "fits": None, "crs_prediction": None}).missing


def test_headline_warns_where_n_star_falls_with_budget():
    from rollscale.report.claims import headline_table

    fits = pd.DataFrame({"kind": "a2_check", "bucket": "easy", "rule": ["uniform", "pods"], "fixed": "all",
                         "a2_holds": [False, True],
                         "status": ["A2 violated: n* falls from 8 at C = 3,000 to 2 at C = 30,000", "A2 holds: ..."]})
    frame = headline_table({"frontier": None, "fits": fits, "crs_prediction": None}).frame
    (row,) = frame.to_dict("records")
    assert row["claim"] == "warning: A2 (n* does not fall with budget)" and row["where"] == "easy / uniform"
    assert row["finding"].startswith("A2 violated: n* falls from 8")


# --------------------------------------------------------------------------
# the answer leads: "no answer yet" and what to change, claims only with intervals


def decided(study: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The study with three seeds per n and a frontier every bootstrap refit agrees on."""
    runs = pd.concat([study["runs"].assign(seed=s, run_id=study["runs"]["run_id"] + f"_s{s}") for s in (0, 1, 2)])
    rng = np.random.default_rng(7)  # each seed's evaluations: the same curve, its own evaluation noise
    ev = study["evals"]
    evals = pd.concat([ev.assign(run_id=ev["run_id"] + f"_s{s}", avg_at_k=ev["avg_at_k"] + rng.normal(0, 0.01, len(ev)))
                       for s in (0, 1, 2)], ignore_index=True)
    fr = study["frontier"].assign(best_key_share=1.0, best_key_lo=study["frontier"]["best_key"],
                                  best_key_hi=study["frontier"]["best_key"])
    crs = study["crs_prediction"].assign(observed_best_share=1.0)
    return {**study, "runs": runs, "evals": evals, "frontier": fr, "crs_prediction": crs}


def test_one_seed_is_no_answer_and_says_which_key_to_change(study):
    from rollscale.report import study_answer

    answer = study_answer(study)  # one seed per n
    assert not answer.answered and answer.headline.startswith("No answer yet: the data cannot decide")
    assert any(f.startswith("more seeds: sweep.seeds [0, 1, 2] (now 1 per setting)") for f in answer.fixes)
    assert answer.claims.frame is None or not answer.claims.frame["finding"].str.contains("1 seed").any()
    obs = answer.observations.frame if answer.observations is not None else None
    assert obs is not None  # one seed a key, or an estimate that is not finite (the CRS on an infinite noise, issue 43)
    assert (obs["finding"].str.contains("1 seed") | obs["finding"].str.startswith("CRS ∞")).all()


def test_failed_fits_and_overlapping_intervals_name_their_fixes(study):
    from rollscale.report import study_answer

    thin = decided(study)
    fits = thin["fits"].copy()
    fits.loc[fits["kind"] == "sigmoid_n", "status"] = "too few points (2 < 4)"
    # seeds far apart (each run's curve shifted by its own offset): the decision's intervals overlap at every budget
    offset = thin["evals"]["run_id"].map({r: o for r, o in zip(thin["runs"]["run_id"], np.random.default_rng(3).normal(
        0, 0.1, len(thin["runs"])), strict=True)})
    evals = thin["evals"].assign(n_problems=3, k=4, avg_at_k=thin["evals"]["avg_at_k"] + offset)
    answer = study_answer({**thin, "fits": fits, "evals": evals})
    assert not answer.answered
    (evals_fix,) = [f for f in answer.fixes if f.startswith("more evaluations per run")]
    assert "3 of 3 reward curves could not be fitted (too few points (2 < 4))" in evals_fix
    assert "runs have 11-11 evaluations" in evals_fix and "sweep.eval_every" in evals_fix
    (noise,) = [f for f in answer.fixes if f.startswith("more validation problems")]
    assert "bucket.val_size, now 3" in noise and "differences below" in noise
    assert study_answer({name: None for name in TABLE_NAMES}).fixes == ["run the sweep and fit stages (`rollscale run sweep`)"]


def test_decided_study_answers_in_its_first_sentence(study):
    from rollscale.report import study_answer

    answer = study_answer(decided(study))
    # its one observation is the CRS row on an infinite CRS: no claim rests on an estimate that is not finite (issue 43)
    assert answer.answered and list(answer.observations.frame["claim"]) == ["CRS predicted vs observed best n"]
    # the best n at budgets away from C*, each read from the decision's pooled intervals there
    assert answer.headline.startswith("Answer: easy / grpo: n* = 4 at C = 200-1,008, ")
    assert "n* = 16 at C = 25,600 (every other n's interval below it)" in answer.headline
    # a budget where n* is not distinguishable from another n is a claim of the table, not of the answer
    claims = answer.claims.frame
    assert (claims["claim"] == "best n at budget").sum() == 4


def _decision(decided: bool) -> pd.DataFrame:
    """A ``decision`` table (science §9.4) at C* = 40,000 for n = 2, 4, 8 at B_problem 8: n = 4 leads; n = 8 is within
    0.02 and n = 2 worse (decided), or n = 8 still open (not decided)."""
    from rollscale.core.fit.decision_table import DECISION_COLUMNS

    rows = []
    for key, reward, d, status in ((2, 0.47, -0.06, "settled"), (4, 0.53, 0.0, "leader"),
                                   (8, 0.525, -0.005, "within tolerance" if decided else "open")):
        half = 0.01 if decided else 0.04
        rows.append({"design": "n", "bucket": "all", "rule": "all", "fixed": "all", "key": key, "c_star": 40000.0,
                     "tolerance": 0.02, "status": status, "leader": 4, "decided": decided, "reward": reward,
                     "reward_lo": reward - 0.02, "reward_hi": reward + 0.025, "d": d,
                     "d_lo": d - (0 if key == 4 else half), "d_hi": d + (0 if key == 4 else half),
                     "settled": status == "settled" or (decided and key == 8), "settled_by": "", "within_tolerance":
                     status == "within tolerance", "extrapolated": False, "unknown": False, "seeds": 3,
                     "c_seen": 40000.0, "n": key, "b_problem": 8, "steps": -(-40000 // (8 * key)),
                     "leader_share": 0.9, "r0": 0.37, "df": 6,
                     "to_decide": "" if decided else "about 12 seeds each for the leader and key 8 (sweep.seeds)"})
    return pd.DataFrame(rows, columns=DECISION_COLUMNS)


def test_keys_the_search_settled_at_its_one_sided_bound_say_how_far_d_reaches_at_95_percent():
    """The search settles at its one-sided 1 - alpha bound (science §9.4); the table's D is a 95 % interval. Where
    a settled key's 95 % bound passes epsilon the first line says how far, so the line and the table agree."""
    from rollscale.report.decision_text import decision_headline

    table = _decision(True)
    table.loc[table["key"] == 8, ["status", "within_tolerance", "d", "d_lo", "d_hi", "settled_by"]] = \
        ["settled", False, 0.001, -0.054, 0.05, "search: forecast"]
    line, answered, _ = decision_headline(table)
    assert answered and ("n = 8 cannot beat it by more than 0.02 (as the search settled it, at its one-sided bound; "
                         "at 95 % D reaches +0.05); n = 2 is worse") in line, line
    table.loc[table["key"] == 8, "d_hi"] = 0.015  # within epsilon at 95 % too: nothing to add
    line, _, _ = decision_headline(table)
    assert "n = 8 cannot beat it by more than 0.02; n = 2 is worse" in line, line


def test_the_decision_at_c_star_leads(study):
    from rollscale.report import study_answer

    tables = {**decided(study), "evals": study["evals"].assign(k=4), "decision": _decision(True)}
    answer = study_answer(tables)
    assert answer.answered
    assert answer.headline.startswith("Use n = 4 (B_problem 8, M = 1,250 steps) at C* = 40,000 rollouts: validation "
                                      "avg@4 0.53 [0.51, 0.56]; n = 8 is within 0.02; n = 2 is worse.")
    assert answer.decision is not None and answer.decision.frame["status"].tolist() == ["settled", "leader",
                                                                                       "within tolerance"]
    # settled (D's upper bound <= eps) is not "worse" where D's interval still reaches above 0
    close = _decision(True)
    close.loc[close["key"] == 2, ["d", "d_lo", "d_hi"]] = [-0.01, -0.025, 0.005]
    assert study_answer({**tables, "decision": close}).headline.startswith(
        "Use n = 4 (B_problem 8, M = 1,250 steps) at C* = 40,000 rollouts: validation avg@4 0.53 [0.51, 0.56]; n = 8 is "
        "within 0.02; n = 2 cannot beat it by more than 0.02.")
    # nothing below contradicts it: no exact best-n claim at C* beside it, and no budget in scientific notation
    claims = answer.claims.frame
    best = claims[claims["claim"] == "best n at budget"]
    c_star_near = [a for a in best["at"] if 0.8 * 40000 < float(a.removeprefix("C = ").replace(",", "")) < 1.2 * 40000]
    assert not c_star_near
    assert not claims["at"].fillna("").str.contains("e+", regex=False).any() and "e+" not in answer.headline
    # the fallback (no decision table) is the claims' own answer
    assert study_answer(decided(study)).headline.startswith("Answer: ")


@pytest.mark.parametrize("decided_", [True, False])
def test_a_failed_backtest_stands_beside_the_verdict_which_the_headline_answered_and_export_all_read(study,
                                                                                                    decided_):
    """Science §11.5: one verdict. A forecast past the data whose own backtest failed (§11.4: it cannot cut, or its
    intervals missed) is still the verdict's answer: the first line says "Use n = 4", the answer is flagged answered,
    export writes it without a refusal (and track, which reads export's run, follows it), and the backtest's failure
    is beside it and the first thing to change. Not decided, all three say so."""
    from rollscale.config import parse_params
    from rollscale.core.fit.horizon import BACKTEST_TABLE_COLUMNS
    from rollscale.integrations.export.plan import production_run
    from rollscale.report import study_answer
    from rollscale.report.horizon import UNTRUSTED

    decision = _decision(decided_).assign(source="forecast", c_seen=10_000.0, extrapolated=True, bucket="easy",
                                          rule="uniform")
    backtest = pd.DataFrame([{"design": "n", "bucket": "easy", "rule": "uniform", "fixed": "all", "key": k,
                              "coverage": 0.0, "mean_error": -0.08, "failed": True,
                              "note": "the runs cannot be cut at 1/4 (too few evaluations before): no key's runs could "
                                      "be fitted to compare the forecast with"} for k in (2, 4, 8)],
                            columns=BACKTEST_TABLE_COLUMNS)
    answer = study_answer({**decided(study), "evals": study["evals"].assign(k=4), "decision": decision,
                           "backtest": backtest})
    run = production_run(parse_params({"sweep": {"n": [2, 4, 8], "b_problem": [8]}}), decision, budget=40_000)
    assert answer.answered is decided_ and (run.refusal == "") is decided_
    assert answer.headline.startswith("Use n = 4 (B_problem 8" if decided_ else "Not decided at C* = 40,000")
    assert "(4x the runs' budget, forecast past the data)" in answer.headline and UNTRUSTED in answer.headline
    assert answer.fixes[0].startswith("sweep.c_max closer to study.target_budget")


def test_an_undecided_study_says_between_which_keys_and_what_would_decide(study):
    from rollscale.report import study_answer

    answer = study_answer({**decided(study), "decision": _decision(False)})
    assert not answer.answered
    assert answer.headline.startswith("Not decided at C* = 40,000 rollouts: n = 8 could still beat n = 4 by more than "
                                      "0.02 (D = -0.01 [-0.04, 0.04]); n = 4 leads with validation avg@k 0.53 [0.51, "
                                      "0.56]; to decide: about 12 seeds")
    assert answer.fixes[0] == "to decide: about 12 seeds each for the leader and key 8 (sweep.seeds)"


def test_an_empty_result_is_not_missing(study, ahead, tmp_path):
    study = dict(study, **ahead)  # every table of the fit stage
    empty = dict(study, epoch_transitions=study["epoch_transitions"].iloc[0:0])
    paths = write_report(empty, tmp_path)
    page, md = paths.html.read_text(), paths.summary.read_text()
    assert "Stages not run yet" not in page and "**Missing:**" not in md
    assert '<div class="empty" data-missing="epoch_transitions">' not in page  # a table, not a chart
    assert "<strong>Not shown:</strong> The <code>epoch_transitions</code> table is empty: the frontier" in page
    assert "> **Not shown:** The `epoch_transitions` table is empty" in md
    stages = {s.name: s for s in summary_tables(empty)}["stages"].frame.set_index("table")
    assert stages.loc["epoch_transitions", "rows"] == "0 (empty)"
    # a stage that did not run is missing, and named at the top
    from rollscale.tables import TABLES, table_stage

    fit_tables = [name for name in TABLES if table_stage(name) == "fit"]  # every table the fit stage writes
    paths = write_report(dict(study, **dict.fromkeys(fit_tables)), tmp_path)
    page = paths.html.read_text()
    assert page.index('id="not-run"') < page.index('id="figures"')
    assert "Stages not run yet: fit." in page


def test_every_study_table_says_why_it_is_empty_and_an_empty_decision_is_reported(study, ahead):
    """A study whose sweep was stopped before any run finished has an empty `decision` table: its report broke with
    "rollscale: decision" (a KeyError: no reason written for that table; the SmolLM2 smoke study, 2026-11-27)."""
    from rollscale.report.base import EMPTY_WHY, check_tables
    from rollscale.report.charts.answer import chart_answer
    from rollscale.tables import STUDY_TABLES, TRACKED_TABLES

    assert set(STUDY_TABLES) | set(TRACKED_TABLES) <= set(EMPTY_WHY), set(STUDY_TABLES) - set(EMPTY_WHY)
    from rollscale.core.fit.decision_table import DECISION_COLUMNS

    t = check_tables({**study, **ahead, "decision": pd.DataFrame(columns=DECISION_COLUMNS)})
    assert "decision" in t.empty
    spec = chart_answer(t, {})
    assert spec.missing == "The `decision` table is empty: no finished run to decide from yet (the fit reads " \
        "finished runs; `rollscale status` shows the rest).", spec.missing


FIRST_SCREEN = """<script>
window.addEventListener('load', function () {
  function bottom(sel) { var el = document.querySelector(sel); return el ? el.getBoundingClientRect().bottom : -1; }
  document.body.setAttribute('data-verdict-bottom', bottom('#answer .verdict'));
  document.body.setAttribute('data-claims-top', document.querySelector('#answer table, #answer .empty')
                                                .getBoundingClientRect().top);
  document.body.setAttribute('data-figures-top', document.getElementById('figures').getBoundingClientRect().top);
  var chart = document.querySelector('#answer #chart-answer svg');
  document.body.setAttribute('data-chart-bottom', chart ? chart.getBoundingClientRect().bottom : -1);
  document.body.setAttribute('data-chart-marks', chart ? chart.querySelectorAll('.marks path, .marks text').length : 0);
  document.body.setAttribute('data-viewport', window.innerHeight);
});
</script></body>"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)")
@pytest.mark.parametrize("kind", ["decision", "decided", "one seed"])
def test_first_screen_shows_the_answer_in_chromium(study, tmp_path, kind):
    """A 1400 x 900 window (a laptop's first screen): the verdict and the top of the claims are in
    it, above every figure; the screenshot is kept beside the report."""
    tables = {"decision": {**decided(study), "decision": _decision(True)}, "decided": decided(study)}.get(kind, study)
    paths = write_report(tables, tmp_path / "report")
    probe = tmp_path / "report" / "probe.html"
    head, tail = paths.html.read_text().rsplit("</body>", 1)  # the last one: the bundle's JS holds the string too
    probe.write_text(head + FIRST_SCREEN + tail)
    dom = chromium(["--window-size=1400,900", "--dump-dom", probe.as_uri()], tmp_path / "profile_dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    attrs = dict(re.findall(r'data-(verdict-bottom|claims-top|figures-top|viewport|chart-bottom|chart-marks)='
                            r'"([-0-9.]+)"', dom.stdout))
    viewport = float(attrs["viewport"])
    assert 0 < float(attrs["verdict-bottom"]) < float(attrs["claims-top"]) <= 900
    assert float(attrs["figures-top"]) > float(attrs["claims-top"])
    if kind == "decision":  # the answer drawn right under the first line, whole within the first screen
        assert float(attrs["verdict-bottom"]) < float(attrs["chart-bottom"]) < float(attrs["claims-top"])
        assert float(attrs["chart-bottom"]) <= viewport and int(attrs["chart-marks"]) > 0
    else:  # no decision table: no answer chart, the claims' top on the first screen
        assert float(attrs["chart-bottom"]) == -1 and float(attrs["claims-top"]) < viewport
    verdict = re.search(r'<p class="verdict"><strong>([^<]+)</strong>', dom.stdout).group(1)
    assert verdict.startswith({"decision": "Use n = 4 (B_problem 8", "decided": "Answer: easy / grpo: n* = "}.get(
        kind, "No answer yet: the data cannot decide"))
    shot = tmp_path / "first_screen.png"
    res = chromium([f"--screenshot={shot}", "--window-size=1400,900", paths.html.as_uri()], tmp_path / "profile_shot")
    assert res.returncode == 0 and shot.read_bytes().startswith(PNG_MAGIC)


def test_the_first_line_the_answer_chart_and_the_decision_table_read_the_same_numbers(study):
    """Issue 41: the text, the table and the chart of the answer are one set of numbers (the decision table)."""
    from rollscale.report import build_charts, study_answer
    from rollscale.report.charts.answer import answer_rows

    decision = _decision(True)
    tables = {**decided(study), "evals": study["evals"].assign(k=4), "decision": decision}
    answer = study_answer(tables)
    table = answer.decision.frame.set_index("key")
    chart = answer_rows(decision).set_index("label")
    for key in ("n = 2", "n = 4", "n = 8"):
        assert table.loc[key, "reward at C*"] == chart.loc[key, "text"]
    assert f"validation avg@4 {table.loc['n = 4', 'reward at C*']};" in answer.headline
    # the claims say of each key what the first line says: n = 2 worse, n = 8 not distinguishable (within 0.02)
    claims = answer.claims.frame
    at_c_star = claims[claims["claim"] == "key against the leader"].set_index("at")["finding"].tolist()
    assert at_c_star == [f"n = 2 is below n = 4: D = {table.loc['n = 2', 'D to leader']}",
                         f"n = 8 is not distinguishable from n = 4: D = {table.loc['n = 8', 'D to leader']}"]
    assert "n = 2 is worse" in answer.headline and "n = 8 is within 0.02" in answer.headline
    (drawn,) = [c for c in build_charts(tables) if c.name == "answer"]
    assert drawn.chart is not None
    # a forecast's keys (science §10) join the chart as forecast, told apart from the trained ones
    forecast = pd.DataFrame({"design": "n", "bucket": "all", "rule": "all", "fixed": "all", "key": [16, 4],
                             "reward": [0.5, 0.53], "reward_lo": [0.4, 0.5], "reward_hi": [0.6, 0.56],
                             "trained": [False, True]})
    rows = answer_rows(decision, forecast)
    assert rows.set_index("label").loc["n = 16", ["source", "status"]].tolist() == ["forecast", "forecast"]
    assert (rows["source"] == "trained").sum() == 3


def test_the_inline_vega_script_is_built_once_per_machine_and_read_back(tmp_path, monkeypatch):
    """The report's offline page inlines vega's scripts (~1 MB, ~1.9 s from vl-convert): built once into the cache
    folder, read from it after; a cache that cannot be written leaves the page as before."""
    import vl_convert

    from rollscale.report import page

    monkeypatch.setenv("ROLLSCALE_CACHE", str(tmp_path / "cache"))
    page._vega_embed_bundle.cache_clear()
    js = page._vega_embed_bundle()
    [cached] = (tmp_path / "cache" / "vega").iterdir()
    assert vl_convert.__version__ in cached.name and cached.read_text() == js and "vegaEmbed" in js
    cached.write_text("// read back")  # what a second process finds is what it inlines
    page._vega_embed_bundle.cache_clear()
    assert page._vega_embed_bundle() == "// read back"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ROLLSCALE_CACHE", str(tmp_path / "file"))  # under a file: no folder can be made
    page._vega_embed_bundle.cache_clear()
    assert page._vega_embed_bundle() == js
    page._vega_embed_bundle.cache_clear()
