"""Each stage's time from a measured calibration (issue 32, "time first"): the arithmetic of
:mod:`rollscale.pipeline.check.timing` on a hand-made calibration, and one real calibration of a
small tiny model, stored and reused."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from rollscale.config import parse_params
from rollscale.core.search.decisions import search_method
from rollscale.pipeline.check import timing as stage_time
from rollscale.pipeline.check.calibration import CALIBRATION_FILE, Calibration, calibrate, calibration_key, stored_calibration
from rollscale.pipeline.check.calibration import estimate_findings
from rollscale.pipeline.check.timing import stage_times

SMALL = {"workers": 1, "sampling": {"max_new_tokens": 8, "batch_size": 64},
         "profile": {"k": 4, "k_extreme": 0, "chunk_size": 10},
         "measure": {"n": [4], "b_problem": 2, "steps": 3},
         "bucket": {"val_size": 10},
         "sweep": {"n": [2, 4], "b_problem": [4], "seeds": [0], "c_max": 64, "eval_k": 1, "eval_per_doubling": 0,
                   "eval_every": 4, "search": {"method": "grid"}},
         "base": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "steps": 30,
                  "batch_size": 16, "threads": 1}}


def cal_of(**kw) -> Calibration:
    zero = dict(key="k", gen_s_per_step=0.0, gen_s_per_token=0.0, train_s_per_step=0.0, train_s_per_token=0.0,
                gram_s_per_token=0.0, gram_s_per_token_rollout=0.0, prompt_tokens=2.0, base_s=0.0, load_s=0.0,
                measured_s=1.0, probe_lr=1e-4, probe_kl=(1e-3, 4e-3, 9e-3))
    return Calibration(**{**zero, **kw})


def work(times) -> dict[str, float]:
    """Seconds of work, less each stage's fixed start-up."""
    start = {"base": stage_time.STAGE_START_S, "profile": stage_time.STAGE_START_S, "measure": stage_time.STAGE_START_S,
             "sweep": stage_time.STAGE_START_S, "bucket": stage_time.BUCKET_S, "fit": stage_time.FIT_S,
             "report": stage_time.REPORT_S}
    return {k: round(v - start[k], 9) for k, v in times.seconds.items()}


def test_each_stage_counts_its_rollouts_tokens_and_evaluations():
    p = parse_params(SMALL)
    # generation alone: 1 ms per rollout and new token -> 8 ms a rollout
    gen = work(stage_times(p, cal_of(gen_s_per_token=1e-3), pool=30))
    assert gen["profile"] == pytest.approx(30 * 4 * 8e-3)  # 3 chunks of 10 problems x k = 4
    assert gen["measure"] == pytest.approx(3 * 8 * 8e-3)  # 3 steps of n = 4 x 2 prompts
    # n = 2 (B 8): 8 steps, evaluations at 0, 4, 8; n = 4 (B 16): 4 steps, at 0, 4; each 10 x (eval_k + greedy)
    assert gen["sweep"] == pytest.approx((64 + 64 + 5 * 20) * 8e-3)
    # training alone: 1 ms per token of (2 prompt + 8 completion) tokens, measured lengths once profiled
    train = stage_times(p, cal_of(train_s_per_token=1e-3), pool=30)
    assert work(train)["sweep"] == pytest.approx(128 * 10e-3) and "max_new_tokens" in train.lengths_from
    profile = pd.DataFrame({"problem_id": [f"p{i}" for i in range(30)], "mean_len": 3.0, "avg_at_k": 0.5, "k": 4})
    profiled = stage_times(p, cal_of(train_s_per_token=1e-3), pool=None, profile=profile)
    assert work(profiled)["sweep"] == pytest.approx(128 * 5e-3) and profiled.lengths_from == "the profile's lengths"
    # each generate call's fixed cost per decoding step: one call per profile chunk here (40 <= 64 rollouts)
    assert work(stage_times(p, cal_of(gen_s_per_step=1e-3), pool=30))["profile"] == pytest.approx(3 * 8e-3)


def test_workers_share_the_units_and_a_search_spends_its_measured_share():
    p = parse_params({**SMALL, "workers": 2})
    one, two = (stage_times(parse_params({**SMALL, "workers": w}), cal_of(gen_s_per_token=1e-3), pool=30)
                for w in (1, 2))
    # two runs side by side: the sum shared by 2 workers, each 1.25x slower, at least the longer run
    assert work(two)["sweep"] == pytest.approx(max(work(one)["sweep"] * 1.25 / 2, (64 + 60) * 8e-3 * 1.25))
    searched = parse_params({**SMALL, "sweep": {**SMALL["sweep"], "search": {"method": "decision"}}})
    times = stage_times(searched, cal_of(gen_s_per_token=1e-3), pool=30)
    measured = search_method("decision").measured_spent(searched.sweep.search, len(searched.sweep.seeds))  # the method's own measurement
    assert times.search_share == measured == 0.559
    assert work(times)["sweep"] == pytest.approx(work(one)["sweep"] * measured)
    assert p.workers == 2
    # the forecast search settles keys at C_max only: every key's seeds_min seeds reach it (the default study
    # spent 320,000 of its 480,000-rollout grid), whatever the grid's seeds; one seed a key is not measured
    for seeds, seeds_min, share in (([0, 1, 2], 2, 2 / 3), ([0, 1, 2, 3], 2, 0.5), ([0, 1, 2], 3, 1.0),
                                    ([0, 1, 2], 1, 1.0)):
        forecast = parse_params({**SMALL, "bucket": {"val_size": 100}, "sweep": {
            **SMALL["sweep"], "seeds": seeds, "eval_k": 16, "search": {"method": "forecast", "seeds_min": seeds_min}}})
        times = stage_times(forecast, cal_of(gen_s_per_token=1e-3), pool=30, val_size=100)
        assert times.search_share == pytest.approx(share) and not times.share_why


def test_a_search_whose_validation_cannot_settle_a_key_is_counted_at_the_whole_grid():
    """Issue 32's --hours 1 SmolLM2 study (4 validation problems, avg@4, 2 seeds: D known to +-0.245) was counted
    at the decision search's 56 % of the grid and trained every key to C_max."""
    coarse = parse_params({**SMALL, "bucket": {"val_size": 4},
                           "sweep": {**SMALL["sweep"], "seeds": [0, 1], "eval_k": 4,
                                     "search": {"method": "decision", "seeds_max": 4}}})
    times = stage_times(coarse, cal_of(gen_s_per_token=1e-3), pool=30)
    # keys {2, 4} to C_max with 2 seeds, n = 8 beyond the leading edge (the bracket), seeds 3 and 4 for two keys:
    # 10 runs against the grid's 4 (that study added n = 8, then seeds where the decision hung)
    assert times.search_share == pytest.approx(10 / 4) and "settle no key" in times.share_why
    level, _, msg, _ = stage_time.time_finding(coarse, times, cal_of(gen_s_per_token=1e-3))
    assert "250% of the grid" in msg and "+-0.245" in msg and "a key beyond the leading edge" in msg
    # with seeds_max = seeds_min no seed is added: keys to C_max and the bracket's key
    capped = parse_params({**SMALL, "bucket": {"val_size": 4}, "sweep": {
        **SMALL["sweep"], "seeds": [0, 1], "eval_k": 4, "search": {"method": "decision", "seeds_max": 2}}})
    assert stage_times(capped, cal_of(gen_s_per_token=1e-3), pool=30).search_share == pytest.approx(6 / 4)
    # avg@16 over 100 problems with 3 seeds resolves D to +-0.02: the measured share of the default study
    fine = parse_params({**SMALL, "bucket": {"val_size": 100},
                         "sweep": {**SMALL["sweep"], "seeds": [0, 1, 2], "eval_k": 16, "search": {"method": "decision"}}})
    fine_times = stage_times(fine, cal_of(gen_s_per_token=1e-3), pool=30, val_size=100)
    assert fine_times.search_share == 0.559 and not fine_times.share_why
    one_seed = parse_params({**SMALL, "bucket": {"val_size": 100}, "sweep": {
        **SMALL["sweep"], "seeds": [0, 1, 2], "eval_k": 16, "search": {"method": "decision", "seeds_min": 1}}})
    assert stage_times(one_seed, cal_of(gen_s_per_token=1e-3), pool=30, val_size=100).search_share == 0.500


def test_the_finding_names_each_stage_and_warns_past_12_hours():
    p = parse_params(SMALL)
    level, _, msg, fix = stage_time.time_finding(p, stage_times(p, cal_of(gen_s_per_token=1e-3), 30),
                                                 cal_of(gen_s_per_token=1e-3))
    assert level == "note" and all(f"{s} " in msg for s in ("base", "profile", "measure", "sweep", "fit", "report"))
    assert "trains all 128 rollouts of the grid" in msg
    slow = cal_of(gen_s_per_token=30.0)
    level, keys, msg, fix = stage_time.time_finding(p, stage_times(p, slow, 30), slow)
    assert level == "warning" and " h on this machine" in msg and "rollscale init --hours" in fix
    # issue 43: once the profile ran, its minutes are not counted again
    times = stage_times(p, cal_of(gen_s_per_token=1e-3), 30)
    _, _, after, _ = stage_time.time_finding(p, times, cal_of(gen_s_per_token=1e-3), frozenset({"base", "profile"}))
    assert " to run (done: base, profile) on this machine: bucket " in after.split(". From")[0]
    assert "profile " not in after.split(". From")[0]


def test_a_calibration_is_measured_stored_and_reused_for_the_same_settings(tmp_path):
    p = parse_params(SMALL)
    cal = calibrate(p, tmp_path)
    assert cal.gen_s_per_token > 0 and cal.train_s_per_token > 0 and cal.base_s > 0 and cal.prompt_tokens > 3
    stored = json.loads((tmp_path / CALIBRATION_FILE).read_text())
    assert stored["key"] == calibration_key(p, tmp_path) and stored_calibration(p, tmp_path) == cal
    # the lengths and the grid are scaled by the estimate, not measured again; the model is
    assert stored_calibration(parse_params({**SMALL, "sampling": {**SMALL["sampling"], "max_new_tokens": 16}}),
                              tmp_path) == cal
    assert stored_calibration(parse_params({**SMALL, "torch_threads": 2}), tmp_path) is None
    # a stored calibration is used as it is: 1 s per rollout and token -> the sweep's 228 rollouts x 8 s + start-up
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({**stored, "gen_s_per_token": 1.0, "gen_s_per_step": 0.0}))
    finding = estimate_findings(p, tmp_path, 30, None, measure=False)[0]  # then the learning-rate warning, if any
    assert finding[0] == "note" and "sweep 31 min" in finding[2]
    assert estimate_findings(p, tmp_path / "elsewhere", 30, None, measure=False) == []  # none stored, none measured


def test_the_probe_carries_its_kl_to_a_runs_steps_and_rate():
    """Issue 43: KL ~ lr^2 x steps^alpha, alpha the probe's own growth held in [1, 2]."""
    from rollscale.core.grpo.shaping import kl_after

    aligned = (1e-3, 4e-3, 9e-3)  # KL ~ s^2: steps all one way
    assert kl_after(aligned, 1e-4, 1e-4, 3) == pytest.approx(9e-3)
    assert kl_after(aligned, 1e-4, 1e-4, 30) == pytest.approx(9e-3 * 100)
    assert kl_after(aligned, 1e-4, 1e-5, 30) == pytest.approx(9e-3)  # a tenth of the rate: a hundredth of the KL
    walk = (1e-3, 2e-3, 3e-3)  # KL ~ s: a random walk
    assert kl_after(walk, 1e-4, 1e-4, 30) == pytest.approx(3e-2)
    assert kl_after((1e-3, 1e-3, 1e-3), 1e-4, 1e-4, 30) == pytest.approx(1e-2)  # flat: alpha held at 1
    # a warm-up of 10 steps: its steps count by their share of the rate (5.5 of 10), the next 20 in full
    assert kl_after(walk, 1e-4, 1e-4, 30, warmup_steps=10) == pytest.approx(3e-3 * 25.5 / 3)
    assert kl_after((0.0, 0.0, 0.0), 1e-4, 1e-4, 30) == 0.0  # every group tied: nothing moves
    assert math.isnan(kl_after((), 1e-4, 1e-4, 30)) and math.isnan(kl_after((math.nan,), 1e-4, 1e-4, 30))


def test_a_learning_rate_that_cannot_move_the_policy_in_the_planned_steps_is_a_warning():
    """Issue 43, part 2: SmolLM2 at lr 1e-6 over 12-25 steps never moved; a one-step bound said it would. The
    probe's KL carried to each run: the run that moves least must reach KL_MOVED, and the fix names the rate."""
    from rollscale.core.grpo.shaping import KL_MOVED, kl_after
    from rollscale.pipeline.check.lr import lr_findings

    p = parse_params(SMALL)  # lr_base 1e-4, b_base 256: n = 4 (B 16) runs 4 steps at lr 2.5e-5, n = 2 8 at 1.77e-5
    assert lr_findings(p, cal_of(probe_kl=(0.05, 0.2, 0.45))) == []
    ((level, keys, msg, fix),) = lr_findings(p, cal_of(probe_kl=(1e-4, 2e-4, 3e-4)))
    assert level == "warning" and keys == ("sweep.train.lr_base",)
    kl = kl_after((1e-4, 2e-4, 3e-4), 1e-4, 2.5e-5, 4, p.sweep.train.warmup_steps)  # n = 4: 4 steps at 2.5e-5
    assert f"the run n=4 x B_problem=4 (4 steps at lr 2.5e-05) is expected to reach {kl:.2g}" in msg
    need = 1e-4 * math.sqrt(KL_MOVED / kl)
    rate = float(fix.split("sweep.train.lr_base: ")[1].split()[0])
    assert need <= rate <= need * 1.1  # rounded up, to two digits
    fixed = parse_params({**SMALL, "sweep": {**SMALL["sweep"], "train": {"lr_base": rate}}})
    assert lr_findings(fixed, cal_of(probe_kl=(1e-4, 2e-4, 3e-4))) == []  # the fix as printed clears it
    # KL growing about linearly in steps (a random walk), more steps cannot make up a 225 x shortfall in 32 x
    assert fix.endswith("or no sweep.c_max up to 32 x this one reaches it at this rate")
    # growing with steps^2 (steps that point one way), more steps at the same rate can: a value, which clears it
    # (issue 43: "a larger sweep.c_max" named none)
    ((*_, fix),) = lr_findings(p, cal_of(probe_kl=(1e-4, 4e-4, 9e-4)))
    c_max = int(fix.split("or sweep.c_max: ")[1].split()[0])
    assert c_max > p.sweep.c_max
    longer = parse_params({**SMALL, "sweep": {**SMALL["sweep"], "c_max": c_max}})
    assert lr_findings(longer, cal_of(probe_kl=(1e-4, 4e-4, 9e-4))) == []
    # every group of the probe tied (issue 43: SmolLM2's 2 x 4 answers a step): no rate measured, said as a note
    ((level, _, tied, fix),) = lr_findings(p, cal_of(probe_kl=(0.0, 0.0, 0.0)))
    assert level == "note" and "scored alike (no gradient), so it measured no rate" in tied and fix == ""
    assert lr_findings(p, cal_of(probe_kl=())) == []  # no probe (a tiny model before its warm start): nothing said
    # a probe whose loss turned non-finite: the rate diverges, said as a warning with a rate to try
    ((level, _, diverged, fix),) = lr_findings(p, cal_of(probe_kl=(1e-3, math.inf)))
    assert level == "warning" and "loss was not finite within 2 GRPO steps at lr 0.0001" in diverged
    assert fix.startswith("sweep.train.lr_base: 1e-05 ")


def test_a_diverging_probe_ends_with_an_infinite_kl_not_an_error(monkeypatch):
    """Issue 43: the probe runs the sweep's trainer at lr_base; a loss that is not finite there is the check's
    finding, not `rollscale check` ending in "internal error NonFiniteLossError"."""
    from rollscale.lm.models import char_tokenizer, tiny_llama
    from rollscale.pipeline.check import calibration
    from rollscale.train.step import NonFiniteLossError
    from rollscale.train.trainer import GRPOTrainer

    p = parse_params(SMALL)
    b, tokenizer = p.base, char_tokenizer()
    model = tiny_llama(len(tokenizer), b.hidden_size, b.num_layers, b.num_heads, b.intermediate_size,
                       b.max_positions, tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    calls = iter([{"kl": 0.0}, {"kl": 1e-3}])

    def step(self):
        row = next(calls, None)
        if row is None:
            raise NonFiniteLossError("loss is nan")
        return row

    monkeypatch.setattr(GRPOTrainer, "train_step", step)
    assert calibration._lr_probe(p, model, tokenizer, False, calibration._problems(p, 5)) == (1e-3, math.inf)
