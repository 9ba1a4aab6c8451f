"""The report names the real reason there is no answer (issue 32): unfinished runs, runs that did not
learn, infinite noise estimates, a bucket too small, each with its fix; captions and the runs table
true to what ran."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rollscale.report import study_answer
from rollscale.report.reasons import blocking_reasons, runs_as_ended, runs_reached_text
from tests.test_report import _study_tables


@pytest.fixture(scope="module")
def study() -> dict[str, pd.DataFrame]:
    return _study_tables()


def interrupted(study: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Every run interrupted at step 40: the runs rows as written at a run's start, steps to 40 committed."""
    runs = study["runs"].assign(status="running", steps=0, c=0)
    steps = study["steps"][study["steps"]["step"] <= 40]
    evals = study["evals"][study["evals"]["step"] <= 40]
    return {**study, "runs": runs, "steps": steps, "evals": evals, "fits": None, "frontier": None}


def test_unfinished_runs_are_the_headline_and_the_fit_reasons_are_not_given(study):
    t = interrupted(study)
    answer = study_answer(t)
    assert not answer.answered
    assert answer.headline.startswith("No answer yet: 0 of 3 runs finished, the others stopped at step 40: "
                                      "run `rollscale study` to resume them")
    assert answer.fixes[0].startswith("0 of 3 runs finished")
    assert not any("more evaluations per run" in f for f in answer.fixes)


def test_interrupted_runs_show_their_last_step_as_status_does(study):
    t = interrupted(study)
    shown = runs_as_ended(t["runs"], t["steps"])
    assert set(shown["status"]) == {"interrupted"} and set(shown["steps"]) == {40}
    assert (shown["c"] > 0).all()
    finished = runs_as_ended(study["runs"], study["steps"])  # a finished run is left as it is
    assert finished[["status", "steps", "c"]].equals(study["runs"][["status", "steps", "c"]].astype(
        {"status": "string"}))


def test_captions_say_every_run_reached_c_max_only_when_it_did(study):
    assert runs_reached_text(study["runs"]) == "every run trained to C_max"
    t = interrupted(study)
    assert runs_reached_text(runs_as_ended(t["runs"], t["steps"])) == "0 of 3 runs trained to C_max (3 interrupted)"


def test_runs_that_did_not_learn_are_named_with_the_learning_rate(study):
    flat = study["evals"].copy()
    flat["avg_at_k"] = flat["run_id"].map(flat[flat["step"] == 0].set_index("run_id")["avg_at_k"])
    reasons = blocking_reasons({**study, "evals": flat, "runs": study["runs"].assign(lr=3.5e-7)})
    assert len(reasons) == 1 and reasons[0].startswith("no run learned: in all 3 runs validation avg@k rose at most")
    assert "raise sweep.train.lr_base (runs' lr up to 3.5×10⁻⁷)" in reasons[0]  # no params: the runs' own rate
    assert blocking_reasons(study) == []  # the synthetic study learns
    # issue 43: the value params.yaml has (not one run's sqrt-scaled rate), and the rate the runs' KL suggests
    params = {"sweep": {"train": {"lr_base": 1e-6}}}
    still = study["steps"].assign(kl=1e-7)
    (reason,) = blocking_reasons({**study, "evals": flat, "steps": still}, params)
    assert reason.endswith("and the policy barely moved (KL to the start up to 1e-07 at the runs' end, below "
                           "0.0013): sweep.train.lr_base: 0.00012 (now 1e-06; KL grows with lr^2), or a larger "
                           "sweep.c_max")
    # the report stage passes the validated StudyParams, not the tree: the same words (its own report said
    # "runs' lr up to 2×10⁻⁶" on the issue-43 SmolLM2 study)
    from rollscale.config import parse_params

    (typed,) = blocking_reasons({**study, "evals": flat, "steps": still}, parse_params(params))
    assert "sweep.train.lr_base: 0.00012 (now 1e-06;" in typed and typed.endswith("or sweep.c_max: 160000 (4 x the steps)")
    (moved,) = blocking_reasons({**study, "evals": flat, "steps": still.assign(kl=0.01)}, params)
    assert "though they moved the policy" in moved and "(1e-06) is not what holds it back" in moved
    # issue 43: each run's KL at its end (the median of its last steps, not one noisy step), the slowest named;
    # the budget fix with a value where params give c_max
    runs_ids = sorted(still["run_id"].unique())
    mixed = still.assign(kl=still["run_id"].map({runs_ids[0]: 1e-2, runs_ids[1]: 1e-4, runs_ids[2]: 1e-3}))
    mixed.loc[mixed.index[0], "kl"] = 1.0  # one early, noisy step
    with_c = {"sweep": {"train": {"lr_base": 1e-6}, "c_max": 100}}
    (some,) = blocking_reasons({**study, "evals": flat, "steps": mixed}, with_c)
    assert "some runs barely moved the policy (KL to the start 0.0001 to 0.01 at their end" in some
    assert some.endswith("sweep.train.lr_base: 3.6e-06 (now 1e-06; KL grows with lr^2), or sweep.c_max: 400 "
                         "(4 x the steps)")
    (blind,) = blocking_reasons({**study, "evals": flat, "steps": still.assign(kl=np.nan)}, params)
    assert "raise sweep.train.lr_base (now 1e-06)" in blind and "no rate is suggested" in blind


def test_a_decision_among_runs_that_did_not_learn_is_no_answer(study):
    """Issue 43: the SmolLM2 hour study's report answered "n = 2 ... 0.47 [0.00, 1.00]; n = 4 is within 0.02"
    beside "no run learned": the reason is the headline, the decision's table stays below it."""
    from tests.test_report import _decision

    flat = study["evals"].copy()
    flat["avg_at_k"] = flat["run_id"].map(flat[flat["step"] == 0].set_index("run_id")["avg_at_k"])
    assert study_answer({**study, "decision": _decision(True)}).answered  # the same decision, runs that learned
    answer = study_answer({**study, "evals": flat, "decision": _decision(True)})
    assert not answer.answered and answer.headline.startswith("No answer yet: no run learned: in all 3 runs")
    assert answer.decision is not None
    undecided = study_answer({**study, "evals": flat, "decision": _decision(False)})
    assert undecided.fixes[0].startswith("no run learned")  # what ran first, then what the decision would need
    assert any("about 12 seeds each for the leader and key 8" in f for f in undecided.fixes[1:])


def test_infinite_noise_estimates_and_a_small_bucket_are_named(study):
    noise = study["noise_steps"].assign(b_simple=np.inf, k_crit=np.inf)
    counts = pd.DataFrame({"bucket": ["easy"], "train": [5], "val": [2], "total": [7], "share_of_pool": [0.1]})
    (reason,) = blocking_reasons({**study, "noise_steps": noise, "bucket_counts": counts})
    assert reason.startswith("a bucket too small: 'easy' has 5 training problems for B_problem up to 8")
    assert "data.limit" in reason
    # with the profile: bounds of 'easy' that hold its 2 validation and 8 training problems (issue 43: "widen the
    # bucket (bucket.*)" named none), the study's own bounds widened to the nearest pass rates
    avg = np.r_[np.full(6, 0.5), np.full(3, 0.25), np.full(3, 0.75), np.zeros(20)]
    profile = pd.DataFrame({"problem_id": [f"p{i}" for i in range(len(avg))], "avg_at_k": avg, "k": 8})
    (wider,) = blocking_reasons({**study, "bucket_counts": counts, "profile": profile},
                                {"bucket": {"easy": [0.3, 0.6]}})
    assert ("so every step repeats problems: bucket.easy: [0.25, 0.75] (holds 12 of the 32 profiled; 10 fill "
            "its") in wider
    assert 10 <= int(((avg >= 0.25) & (avg <= 0.75)).sum())
    answer = study_answer({**study, "noise_steps": noise, "bucket_counts": counts})
    assert answer.headline.startswith("No answer yet: a bucket too small")
    assert answer.fixes[-1].startswith("the noise estimates are infinite or undefined (b_simple, k_crit in every "
                                       "measured step")


def test_infinite_noise_estimates_leave_a_decision_answered(study):
    """The default study's K_crit is infinite in every measured step; the decision does not use it, and a report
    said "No answer yet: the noise estimates are infinite" beside a decision: the noise is a fix, not a block."""
    from tests.test_report import _decision

    noise = study["noise_steps"].assign(k_crit=np.inf)
    answer = study_answer({**study, "noise_steps": noise, "decision": _decision(True)})
    assert answer.answered and not answer.headline.startswith("No answer yet"), answer.headline
    assert any(f.startswith("the noise estimates are infinite or undefined (k_crit") for f in answer.fixes)


def test_an_infinite_crs_is_not_read_as_a_prediction(study):
    """Issue 32: "CRS ∞ predicts n = 4" read an undefined noise estimate as a measured size."""
    crs = study["crs_prediction"].assign(crs=np.inf)
    answer = study_answer({**study, "crs_prediction": crs})
    rows = pd.concat([answer.claims.frame, answer.observations.frame])
    text = " ".join(rows.astype(str).to_numpy().ravel())
    # why it is infinite, from the noise pooled over steps (science §6.3; issue 41): here rho s > |G|^2
    assert ("CRS ∞ (K_crit infinite because rho s > |G|² pooled over steps: add prompts, not rollouts) points only "
            "to the grid's largest n") in text
    old = {**study, "crs_prediction": crs, "noise_prompts": study["noise_prompts"][["step", "n", "k_sat"]]}
    old_answer = study_answer(old)
    old_text = " ".join(pd.concat([old_answer.claims.frame, old_answer.observations.frame]).astype(str).to_numpy().ravel())
    assert "CRS ∞ (no finite estimate: the measured signal |G|² ≤ 0) points only to the grid's largest n" in old_text
    assert "CRS ∞ predicts" not in text
    # issue 43: however many seed resamples agree on the observed best n, a row on an infinite CRS is no claim
    crs = crs.assign(observed_best_share=1.0)
    answer = study_answer({**study, "crs_prediction": crs})
    claims = " ".join(answer.claims.frame.astype(str).to_numpy().ravel()) if answer.claims.frame is not None else ""
    assert "CRS" not in claims and "CRS ∞" in " ".join(answer.observations.frame.astype(str).to_numpy().ravel())
