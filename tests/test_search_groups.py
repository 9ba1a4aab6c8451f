"""Each sweep design becomes the search's groups (science §9.4), named as the replay names them,
and each (group, key, seed) maps back to the grid point a run trains (also keys and seeds the grid lacks)."""

from __future__ import annotations

import pytest

from rollscale.config import parse_params
from rollscale.sweep.groups import search_design, search_plan, search_settings
from rollscale.sweep.grid import GridPoint, plan_runs


def plan_of(**sweep):
    # seeds_min 3: every key starts with the grid's three seeds
    return search_plan(parse_params({"sweep": {"search": {"seeds_min": 3}, **sweep}}).sweep)


def test_rollout_axis_is_one_group_per_rule_keyed_by_n_with_the_bracket_up_to_b_max():
    p = plan_of(design="rollout_axis", n=[2, 4, 8], b_problem=[16], rules=["uniform", "dynamic"], b_max=256)
    assert p.design == "n" and [g.group for g in p.groups] == ["n:bucket=easy/rule=dynamic/b_problem=16",
                                                                 "n:bucket=easy/rule=uniform/b_problem=16"]
    g = p.groups[1]
    assert (g.axis, g.keys, g.fixed, g.key_min, g.key_max) == ("rollout", (2, 4, 8), 16, 2, 16)
    assert g.step_rollouts(8) == 128
    point = p.point(g.group, 16, 5)  # the bracket's key beyond the edge, a seed the grid lacks
    assert (point.n, point.b_problem, point.rule.rule, point.seed) == (16, 16, "uniform", 5)
    assert p.alone == []


def test_prompt_axis_iso_batch_and_rules_designs():
    p = plan_of(design="prompt_axis", n=[4], b_problem=[4, 8, 16])
    (g,) = p.groups
    assert (p.design, g.axis, g.keys, g.fixed, g.group) == ("b_problem", "prompt", (4, 8, 16), 4,
                                                             "b_problem:bucket=easy/rule=uniform/n=4")
    assert p.point(g.group, 32, 0) == GridPoint(4, 32, g_rule(p, g), 0)

    p = plan_of(design="iso_batch", n=[2, 4, 8], b_total=64)
    (g,) = p.groups
    assert (p.design, g.axis, g.keys, g.fixed, g.key_max) == ("iso_batch", "iso_batch", (2, 4, 8), 64, 64)
    point = p.point(g.group, 16, 1)
    assert (point.n, point.b_problem) == (16, 4) and g.allows(16) and not g.allows(3)  # n must divide B

    p = plan_of(design="rollout_axis", n=[8], b_problem=[16], rules=["uniform", {"rule": "pods", "keep": 0.5}])
    (g,) = p.groups
    assert (p.design, g.axis, g.keys, g.key_min, g.key_max) == ("rule", "rule", ("pods", "uniform"), None, None)
    pods = p.point(g.group, "pods", 2)
    assert (pods.n, pods.b_problem, pods.rule.rule, pods.rule.keep) == (8, 16, "pods", 0.5)


def g_rule(p, g):
    return p.fixed[g.group][0]


def test_a_point_alone_in_its_group_trains_to_c_max_and_one_key_is_no_search():
    # B_problem 64 fits b_max only with n = 2: that group has one key, so its run is trained as in a grid
    p = plan_of(design="grid", n=[2, 4], b_problem=[16, 64], b_max=128)
    assert [g.group for g in p.groups] == ["n:bucket=easy/rule=uniform/b_problem=16"]
    assert {(pt.n, pt.b_problem) for pt in p.alone} == {(2, 64)}
    assert len(p.alone) == 3  # its three seeds
    one = parse_params({"sweep": {"n": [4]}}).sweep
    assert search_design(one) is None and search_plan(one).groups == []
    assert len(search_plan(one).alone) == len(plan_runs(one).runs)


def test_the_settings_are_the_search_sections_own():
    sweep = parse_params({"sweep": {"eval_every": 7, "eval_per_doubling": 0,
                                    "search": {"alpha": 0.2, "bootstrap_resamples": 50}},
                          "fit": {"bootstrap_resamples": 999}}).sweep
    s = search_settings(sweep)
    assert (s.alpha, s.resamples, s.eval_every, s.eta) == (0.2, 50, 7, 2.0)
    # on the shared budget schedule (science §9.1) a leg ends at its rung, where the run evaluates anyway
    assert search_settings(parse_params({"sweep": {"eval_every": 7}}).sweep).eval_every is None
    with pytest.raises(ValueError, match="alpha"):
        parse_params({"sweep": {"search": {"alpha": 0.5}}})
