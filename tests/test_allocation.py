"""Tests of the rollout allocation rules and their compute accounting (science §1, §4)."""

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from rollscale.train.run_config import RunConfig

from rollscale.core.grpo.allocation import RuleNotApplicable, allocate
from rollscale.core.grpo.rules.dynamic import DynamicSampling
from rollscale.core.grpo.rules.pilot import PilotCommit, pilot_scores
from rollscale.core.grpo.rules.pods import PODS, max_variance_subset
from rollscale.core.grpo.rules.uniform import Uniform
from rollscale.core.grpo.rules.variance import VarianceAllocation, VarianceParams, largest_remainder

# ---------------------------------------------------------------- max-variance subset


def _best_variance_brute_force(r: np.ndarray, m: int) -> float:
    return max(np.var(r[list(c)]) for c in itertools.combinations(range(len(r)), m))


@pytest.mark.parametrize("binary", [False, True])
def test_max_variance_subset_matches_brute_force(binary):
    rng = np.random.default_rng(0 if binary else 1)
    for _ in range(150):
        n = int(rng.integers(1, 11))
        m = int(rng.integers(1, n + 1))
        r = rng.integers(0, 2, n).astype(float) if binary else rng.normal(size=n) * rng.choice([0.01, 1, 100])
        kept = max_variance_subset(r, m)
        assert len(kept) == m and len(set(kept)) == m
        assert kept == sorted(kept) and all(0 <= i < n for i in kept)
        assert np.var(r[kept]) == pytest.approx(_best_variance_brute_force(r, m), rel=1e-9, abs=1e-12)


def test_max_variance_subset_with_ties_in_real_rewards():
    r = np.array([0.5, 0.2, 0.5, 0.9, 0.2, 0.9, 0.5])
    for m in range(1, 8):
        assert np.var(r[max_variance_subset(r, m)]) == pytest.approx(_best_variance_brute_force(r, m), abs=1e-12)


def test_max_variance_subset_binary_keeps_even_split():
    assert sorted(np.array([1, 1, 1, 1, 1, 1, 0, 0])[max_variance_subset([1, 1, 1, 1, 1, 1, 0, 0], 4)]) == [0, 0, 1, 1]
    assert sorted(np.array([1, 0, 0, 0, 0, 0, 0])[max_variance_subset([1, 0, 0, 0, 0, 0, 0], 4)]) == [0, 0, 0, 1]
    r = [0, 1, 0, 1, 1, 0, 1, 0, 1, 1]
    kept = np.array(r)[max_variance_subset(r, 5)]
    assert abs(int(kept.sum()) - 2.5) == 0.5  # 2 or 3 ones out of 5


def test_max_variance_subset_is_deterministic_on_ties():
    # all rewards equal: every subset has zero variance; the stable sort keeps the first m
    assert max_variance_subset([0.0, 0.0, 0.0, 0.0], 2) == [0, 1]
    r = [1, 0, 1, 0, 1, 0]
    assert max_variance_subset(r, 4) == max_variance_subset(list(r), 4)


@pytest.mark.parametrize("rewards, m", [([1.0, 0.0], 0), ([1.0, 0.0], 3), ([], 1), ([[1.0, 0.0]], 1),
                                        ([1.0, float("nan")], 1), ([1.0, 0.0], 1.5)])
def test_max_variance_subset_validation(rewards, m):
    with pytest.raises(ValueError):
        max_variance_subset(rewards, m)


def test_pilot_scores():
    # n_pilot = 2: q = 1/4, 2/4, 3/4 -> 3/16, 1/4, 3/16
    np.testing.assert_allclose(pilot_scores([0, 1, 2], 2), [3 / 16, 1 / 4, 3 / 16])
    with pytest.raises(ValueError):
        pilot_scores([3], 2)
    with pytest.raises(ValueError):
        pilot_scores([1], 0)


# ---------------------------------------------------------------- a fake sampler


@dataclass
class FakeRollout:
    problem: int
    index: int  # position in the problem's reward script
    reward: float


class FakeSampler:
    """Deterministic sample_fn: problem p's k-th generated rollout gets script[p][k]."""

    def __init__(self, script):
        self.script = script
        self.cursor = {}
        self.calls = []

    def __call__(self, problems, n):
        self.calls.append((list(problems), n))
        out = []
        for p in problems:
            start = self.cursor.get(p, 0)
            rewards = self.script(p)[start : start + n]
            self.cursor[p] = start + n
            out.append([FakeRollout(p, start + j, float(r)) for j, r in enumerate(rewards)])
        return out


class DataOrder:
    """next_prompts over the data order 0, 1, 2, ..."""

    def __init__(self):
        self.next = 0

    def __call__(self, k):
        drawn = list(range(self.next, self.next + k))
        self.next += k
        return drawn


def mixed(p):
    return [1, 0] * 16


# ---------------------------------------------------------------- the rules


def test_uniform_accounting():
    sampler, order = FakeSampler(mixed), DataOrder()
    rule = Uniform(b_problem=3, n=4)
    out = allocate(rule, order, sampler)
    assert rule.name == "uniform" and rule.rollouts_per_step_nominal == 12
    assert out.rollouts_generated == 12 and out.draws == 3
    assert [g.problem for g in out.groups] == [0, 1, 2]
    assert [len(g.rollouts) for g in out.groups] == [4, 4, 4]
    assert out.rollouts_trained == 12 and out.discarded_rollouts == 0 and out.pilot_rollouts == 0
    np.testing.assert_array_equal(out.groups[0].rewards, [1, 0, 1, 0])


def _zero_on(zero_problems):
    return lambda p: [0] * 32 if p in zero_problems else mixed(p)


def test_dynamic_sampling_refills_until_enough_groups():
    sampler, order = FakeSampler(_zero_on({0, 2, 3, 5})), DataOrder()
    rule = DynamicSampling(b_problem=3, n=4, max_draws=20)
    out = rule.allocate(order, sampler)
    # round 1 draws 0,1,2 (keeps 1); round 2 draws 3,4 (keeps 4); round 3 draws 5 (none); round 4 draws 6
    assert [c[0] for c in sampler.calls] == [[0, 1, 2], [3, 4], [5], [6]]
    assert [g.problem for g in out.groups] == [1, 4, 6]
    assert out.draws == 7
    assert out.rollouts_generated == 7 * 4
    assert out.discarded_rollouts == 4 * 4
    assert out.zero_variance_draws == 4
    assert all(len(g.rollouts) == 4 for g in out.groups)
    assert rule.name == "dynamic" and rule.rollouts_per_step_nominal == 12


def test_dynamic_sampling_cap_trains_on_what_was_collected():
    sampler, order = FakeSampler(_zero_on({0, 2, 3, 5})), DataOrder()
    out = DynamicSampling(b_problem=3, n=4, max_draws=5).allocate(order, sampler)
    assert [c[0] for c in sampler.calls] == [[0, 1, 2], [3, 4]]
    assert [g.problem for g in out.groups] == [1, 4]
    assert out.draws == 5 and out.rollouts_generated == 20 and out.discarded_rollouts == 12
    # nothing informative at all: no groups, every rollout still counted
    sampler = FakeSampler(lambda p: [1] * 32)
    out = DynamicSampling(b_problem=2, n=3, max_draws=7).allocate(DataOrder(), sampler)
    assert out.groups == [] and out.draws == 7 and out.rollouts_generated == 21
    assert out.zero_variance_draws == 7


def test_pods_keeps_max_variance_subsets():
    script = {0: [1, 1, 1, 1, 1, 0], 1: [0.2, 0.9, 0.5, 0.1, 0.4, 0.8]}
    sampler, order = FakeSampler(lambda p: script[p]), DataOrder()
    rule = PODS(b_problem=2, n=6, m=4)
    out = allocate(rule, order, sampler)
    assert rule.name == "pods" and rule.trained_group_size == 4 and rule.rollouts_per_step_nominal == 12
    assert out.rollouts_generated == 12 and out.draws == 2 and out.discarded_rollouts == 4
    assert [len(g.rollouts) for g in out.groups] == [4, 4]
    assert sorted(out.groups[0].rewards) == [0, 1, 1, 1]
    # real rewards: the 2 lowest and 2 highest (0.1, 0.2, 0.8, 0.9), in generation order
    assert [r.index for r in out.groups[1].rollouts] == [0, 1, 3, 5]
    np.testing.assert_allclose(out.groups[1].rewards, [0.2, 0.9, 0.1, 0.8])


def test_pilot_commit_accounting_and_choice():
    script = {0: [0, 0] + [1] * 6, 1: [1, 0] + [0] * 6, 2: [1, 1] + [0] * 6, 3: [0, 1] + [1] * 6}
    sampler, order = FakeSampler(lambda p: script[p]), DataOrder()
    rule = PilotCommit(b_problem=2, n=8, n_pilot=2, pool_factor=2)
    out = allocate(rule, order, sampler)
    assert rule.name == "pilot" and rule.pool_size == 4
    # C = pool * n_pilot + b_problem * (n - n_pilot) = 4 * 2 + 2 * 6
    assert out.rollouts_generated == 20 == rule.rollouts_per_step_nominal
    assert out.pilot_rollouts == 8 and out.discarded_rollouts == 4 and out.draws == 4
    assert out.zero_variance_draws == 2
    assert sampler.calls == [([0, 1, 2, 3], 2), ([1, 3], 6)]
    assert [g.problem for g in out.groups] == [1, 3]
    assert [len(g.rollouts) for g in out.groups] == [8, 8]
    # the pilot rollouts lead their group
    assert [r.index for r in out.groups[0].rollouts] == list(range(8))
    np.testing.assert_array_equal(out.groups[1].rewards, [0, 1] + [1] * 6)


def test_pilot_commit_prefers_higher_score():
    # n_pilot = 4: s = 1, 2, 3 give q(1-q) = 2/9, 1/4, 2/9
    script = {0: [1, 0, 0, 0, 1, 1], 1: [1, 1, 0, 0, 1, 1], 2: [1, 1, 1, 0, 1, 1]}
    sampler = FakeSampler(lambda p: script[p])
    out = PilotCommit(b_problem=1, n=6, n_pilot=4, pool_factor=3).allocate(DataOrder(), sampler)
    assert [g.problem for g in out.groups] == [1]
    assert out.rollouts_generated == 3 * 4 + 1 * 2


def test_pilot_commit_fills_from_constant_pilots_when_too_few_remain():
    script = {0: [0, 0, 1, 1], 1: [1, 0, 1, 1], 2: [1, 1, 0, 0], 3: [0, 0, 0, 0]}
    sampler = FakeSampler(lambda p: script[p])
    out = PilotCommit(b_problem=2, n=4, n_pilot=2, pool_factor=2).allocate(DataOrder(), sampler)
    # only problem 1 is informative; the constant ones tie on score, so pool order picks 0
    assert [g.problem for g in out.groups] == [0, 1]
    assert out.rollouts_generated == 4 * 2 + 2 * 2


def test_pilot_commit_fractional_pool():
    rule = PilotCommit(b_problem=3, n=8, n_pilot=2, pool_factor=1.5)
    assert rule.pool_size == 5
    sampler = FakeSampler(mixed)
    out = rule.allocate(DataOrder(), sampler)
    assert out.draws == 5 and out.rollouts_generated == 5 * 2 + 3 * 6 == rule.rollouts_per_step_nominal
    assert len(out.groups) == 3


def test_pilot_commit_rejects_rewards_outside_unit_interval():
    sampler = FakeSampler(lambda p: [2.0, -1.0] * 4)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        PilotCommit(b_problem=1, n=4, n_pilot=2, pool_factor=1).allocate(DataOrder(), sampler)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Uniform(b_problem=0, n=4),
        lambda: Uniform(b_problem=2, n=1),
        lambda: DynamicSampling(b_problem=4, n=4, max_draws=3),
        lambda: PODS(b_problem=2, n=4, m=4),
        lambda: PODS(b_problem=2, n=4, m=1),
        lambda: PilotCommit(b_problem=2, n=4, n_pilot=4, pool_factor=2),
        lambda: PilotCommit(b_problem=2, n=4, n_pilot=0, pool_factor=2),
        lambda: PilotCommit(b_problem=2, n=4, n_pilot=1, pool_factor=0.5),
    ],
)
def test_rule_validation(make):
    with pytest.raises(ValueError):
        make()


def test_callback_contracts_are_checked():
    rule = Uniform(b_problem=2, n=3)
    with pytest.raises(ValueError, match="next_prompts"):
        rule.allocate(lambda k: [0], FakeSampler(mixed))
    with pytest.raises(ValueError, match="rollouts"):
        rule.allocate(DataOrder(), lambda problems, n: [[FakeRollout(p, 0, 1.0)] for p in problems])
    with pytest.raises(ValueError, match="groups"):
        rule.allocate(DataOrder(), lambda problems, n: [])
    with pytest.raises(ValueError, match="rule"):
        allocate("uniform", DataOrder(), FakeSampler(mixed))


# ---------------------------------------------------------------- variance-proportional allocation


def test_largest_remainder():
    counts = largest_remainder([0.25, 0.25, 0.25], 12, 2)
    assert counts.tolist() == [4, 4, 4]
    # spare 6 over weights 5/36, 1/4, 5/36: quotas 1.58, 2.84, 1.58 -> 1, 2, 1 and 2 left by remainder,
    # the tie of 0.58 going to the earlier position
    assert largest_remainder([5 / 36, 1 / 4, 5 / 36], 12, 2).tolist() == [4, 5, 3]
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 20))
        w = rng.random(k) * (rng.random(k) > 0.3)
        total = int(rng.integers(2 * k, 20 * k))
        c = largest_remainder(w, total, 2)
        assert c.sum() == total and c.min() >= 2
        quota = 2 + (total - 2 * k) * (w / w.sum() if w.sum() > 0 else np.full(k, 1 / k))
        assert np.all(np.abs(c - quota) < 1)  # each within one of its exact share
    assert largest_remainder([0.0, 0.0], 7, 2).tolist() == [4, 3]
    for bad in ([], [-1.0, 1.0], [float("nan")]):
        with pytest.raises(ValueError):
            largest_remainder(bad, 8, 2)
    with pytest.raises(ValueError, match="below"):
        largest_remainder([1.0, 1.0], 3, 2)


def test_variance_rule_spends_uniforms_budget_by_predicted_variance():
    script = {0: [1] * 32, 1: [1, 0] * 16, 2: [0] * 32}
    sampler, same_prompts = FakeSampler(lambda p: script[p]), lambda k: [0, 1, 2][:k]
    rule = VarianceAllocation(b_problem=3, n=4)
    first = allocate(rule, same_prompts, sampler)
    # never seen: all predicted p = 1/2, so uniform's 4 each, generated in one call of one rollout per entry
    assert [len(g.rollouts) for g in first.groups] == [4, 4, 4]
    assert sampler.calls == [([0] * 4 + [1] * 4 + [2] * 4, 1)]
    assert first.rollouts_generated == first.rollouts_trained == 12 and first.draws == 3
    assert first.zero_variance_draws == 2 and first.discarded_rollouts == 0
    # second visit: q = 5/6, 1/2, 1/6 (Beta(1,1) on 4/4, 2/4, 0/4): the mixed prompt gets the most
    second = allocate(rule, same_prompts, sampler)
    assert [len(g.rollouts) for g in second.groups] == [4, 5, 3]
    assert second.rollouts_generated == second.rollouts_trained == 12
    assert [r.index for r in second.groups[1].rollouts] == [4, 5, 6, 7, 8]  # fresh rollouts, in order
    # older visits count half (decay 0.5): problem 1 saw 2 of 4, then 3 of 5 (1, 0, 1, 0, 1)
    assert rule.stats[1] == (0.5 * 2 + 3, 0.5 * 4 + 5)
    assert rule.trained_per_step == 12 and not rule.equal_groups


def test_variance_rule_state_survives_a_checkpoint():
    import json

    sampler = FakeSampler(lambda p: [1, 0, 0] * 8)
    rule = VarianceAllocation(b_problem=2, n=5, prior=0.5, decay=0.0)
    rule.allocate(DataOrder(), sampler)
    restored = VarianceAllocation(b_problem=2, n=5, prior=0.5, decay=0.0)
    restored.load_state_dict(json.loads(json.dumps(rule.state_dict())))  # state.json holds it
    assert restored.stats == rule.stats and restored.scores([0, 1, 7]).tolist() == rule.scores([0, 1, 7]).tolist()
    with pytest.raises(ValueError, match="keeps no state"):
        Uniform(b_problem=2, n=4).load_state_dict(rule.state_dict())


def test_variance_rule_settings_and_grid():
    assert VarianceAllocation.for_grid_point(VarianceParams(decay=0.9), 8, 16).run_id_parts() == ["a1", "dc0.9"]
    with pytest.raises(RuleNotApplicable, match="n=2"):
        VarianceAllocation.for_grid_point(VarianceParams(), 2, 16)
    for bad in (dict(prior=0.0), dict(decay=1.5), dict(decay=True)):
        with pytest.raises(ValueError):
            VarianceAllocation(b_problem=2, n=4, **bad)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        VarianceAllocation(b_problem=1, n=4).allocate(DataOrder(), FakeSampler(lambda p: [2.0] * 8))
    with pytest.raises(ValueError, match="equal size"):  # its groups differ: no gradient-noise measurement
        RunConfig(n=8, b_problem=4, c_max=100, rule="variance", noise_every=1)
    assert RunConfig(n=8, b_problem=16, c_max=100, rule="variance").run_id == "np16_nr8_variance_a1_dc0.5_s0"
