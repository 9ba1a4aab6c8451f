"""The registries (rollscale/registry.py): lookups that name the closest valid name, discovery of
plugin modules, params validation built from them, and the run ids and config hashes of the
rules as they were before they were plugins (stored studies resume by them)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollscale.config import ParamsError, StudyParams, SweepParams, TrainParams, load_params, parse_params
from rollscale.core.grpo.allocation import make_rule
from rollscale.core.rollouts import SamplingConfig
from rollscale.registry import (
    ADVANTAGE_ESTIMATORS,
    ALLOCATION_RULES,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    SAMPLING_ENGINES,
    SEARCH_METHODS,
    Registry,
    RegistryError,
)
from rollscale.train.run_config import RunConfig, config_hash
from rollscale.sweep.grid import run_configs

from tests.conftest import REPO


def test_lookup_error_names_the_closest_valid_name():
    with pytest.raises(RegistryError, match=r"unknown allocation rule 'podz'; did you mean 'pods'\?"):
        ALLOCATION_RULES.get("podz")
    with pytest.raises(RegistryError, match=r"did you mean 'token-mean'\?.*seq-mean-token-sum-norm"):
        LOSS_AGGREGATIONS.get("tokenmean")
    with pytest.raises(RegistryError, match=r"sampling engine 'vlm'; did you mean 'vllm'"):
        SAMPLING_ENGINES.get("vlm")
    with pytest.raises(RegistryError, match=r"expected one of: clip\)"):
        POLICY_LOSSES.get("zzz")  # nothing close: no suggestion, the valid names


def test_registered_names():
    assert set(ALLOCATION_RULES.names()) >= {"uniform", "dynamic", "pods", "pilot"}
    assert list(LOSS_AGGREGATIONS.names()) == ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                               "seq-mean-token-sum-norm"]
    assert set(ADVANTAGE_ESTIMATORS.names()) == {"group", "none"} and "clip" in POLICY_LOSSES.names()
    assert list(SAMPLING_ENGINES.names()) == ["hf", "hf-paged", "vllm"]  # module names, "_" read as "-"


def test_a_name_is_registered_once():
    reg = Registry("thing")
    reg.register("a")(len)
    reg.register("a")(len)  # the same object again (a module imported twice) is fine
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("a")(max)


def _plugin_package(tmp_path, monkeypatch, name: str, modules: dict[str, str]) -> None:
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, source in modules.items():
        (package / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


RULE_MODULE = """
    from dataclasses import dataclass
    from typing import ClassVar

    from pydantic import Field

    from rollscale.core.grpo.allocation import AllocationRule, Group, RuleParams, StepAllocation, draw, sample_groups
    from tmp_registry_holder import REG


    class FirstKParams(RuleParams):
        share: float = Field(0.5, gt=0, le=1)


    @REG.register("first_k")
    @dataclass
    class FirstK(AllocationRule):
        k: int = 2
        name: ClassVar[str] = "first_k"
        Params: ClassVar[type[RuleParams]] = FirstKParams

        def allocate(self, next_prompts, sample_fn):
            problems = draw(next_prompts, self.b_problem)
            groups = [Group(p, rs[: self.k]) for p, rs in zip(problems, sample_groups(sample_fn, problems, self.n))]
            return StepAllocation(groups, self.b_problem * self.n, self.b_problem,
                                  discarded_rollouts=self.b_problem * (self.n - self.k))
"""


def test_a_new_rule_module_is_discovered(tmp_path, monkeypatch):
    """Adding a rule is adding a module to a plugin package: nothing else lists it."""
    holder = type(sys)("tmp_registry_holder")
    holder.REG = Registry("allocation rule", plugins=["tmp_rules_pkg"])
    monkeypatch.setitem(sys.modules, "tmp_registry_holder", holder)
    _plugin_package(tmp_path, monkeypatch, "tmp_rules_pkg",
                    {"first_k": RULE_MODULE, "_shared": "raise RuntimeError('private modules are not plugins')"})
    assert holder.REG.names() == ("first_k",)
    rule = holder.REG.get("first_k")(b_problem=2, n=4)
    out = rule.allocate(lambda k: list(range(k)), lambda problems, n: [[type("R", (), {"reward": 1.0})()] * n
                                                                        for _ in problems])
    assert out.rollouts_generated == 8 and out.rollouts_trained == 4 and rule.run_args() == {"k": 2}
    assert rule.Params(share=0.25).share == 0.25


def test_sweep_rules_accept_names_and_mappings():
    sweep = SweepParams(rules=["uniform", {"rule": "pods", "keep": 0.25}, "pilot"])
    assert [r.rule for r in sweep.rules] == ["uniform", "pods", "pilot"]
    assert sweep.rules[1].keep == 0.25 and sweep.rules[2].n_pilot == 2
    assert [r.rule for r in SweepParams().rules] == ["uniform"]


@pytest.mark.parametrize("rules, message", [
    (["uniform", "podz"], r"sweep.rules.1: .*unknown allocation rule 'podz'; did you mean 'pods'"),
    ([{"rule": "pods", "kep": 0.5}], r"sweep.rules.0.pods.kep: unknown key; did you mean 'sweep.rules.0.pods.keep'"),
    ([{"rule": "pods", "keep": "half"}], r"sweep.rules.0.pods.keep: Input should be a valid number"),
    ([{"rule": "pilot", "n_pilot": 0}], r"sweep.rules.0.pilot.n_pilot: Input should be greater than or equal to 1"),
    ([{"keep": 0.5}], r"sweep.rules.0: Unable to extract tag using discriminator 'rule'"),
    (["pods", {"rule": "pods", "keep": 0.25}], r"sweep.rules: .*rule 'pods' is listed more than once"),
])
def test_bad_rule_entries_name_the_key(rules, message):
    with pytest.raises(ParamsError, match=message):
        parse_params({"sweep": {"rules": rules}})


@pytest.mark.parametrize("key, value, message", [
    ("agg_mode", "token-sum", r"sweep.train.agg_mode: .*unknown loss aggregation 'token-sum'; did you mean"),
    ("policy_loss", "clipped", r"sweep.train.policy_loss: .*did you mean 'clip'"),
    ("advantage_scale", "grup", r"sweep.train.advantage_scale: .*did you mean 'group'"),
])
def test_loss_names_come_from_the_registries(key, value, message):
    with pytest.raises(ParamsError, match=message):
        parse_params({"sweep": {"train": {key: value}}})
    with pytest.raises(ParamsError, match=r"sampling.backend: .*did you mean 'hf-paged'"):
        parse_params({"sampling": {"backend": "hf_paged"}})


# Run ids and config hashes of these runs: a stored study's runs resume by them (tasks/sweep.py archives a run
# whose identity changed). Written anew when every step began to keep its two halves' gradients (science §6.4):
# the halves' passes sum the gradient in another order, so a run trained before is another run.
BEFORE = {
    "np16_nr2_uniform_s0": "bb0668ce85208714",
    "np16_nr2_dynamic_d64_s0": "2b72b5b0a7565785",
    "np16_nr4_pods_m2_s0": "014aadd6220eb3df",
    "np16_nr4_pilot_p2_pf2_s0": "afb2d6495fde201f",
    "np16_nr8_uniform_s1": "2543fcc913ecab61",
    "np16_nr8_dynamic_d64_s0": "b33df52ee7df6e1b",
    "np16_nr8_pods_m4_s0": "c49664f2e67a4518",
    "np16_nr8_pilot_p2_pf2_s1": "1df2176697003566",
}


# the default study's planned runs (params.yaml, and the defaults of StudyParams()) as they were before a run's
# config took its evaluation, checkpoint and noise settings from the sweep's own fields (issue 38, part 4):
# its runs resume, and its tables stay the same. Changed on purpose (a new default study)? Write the new ones.
# params.yaml's: sweep.c_max 40,000 -> 80,000 and back (docs/results.md, 2d): the same ids and hashes. Written anew
# when every step began to keep its two halves' gradients (science §6.4: the gradient is summed in another order)
DEFAULT_PLAN = {
    "params.yaml": {
        "np16_nr2_uniform_s0": "140eef7f75a4707d", "np16_nr2_uniform_s1": "8710b980dd296157",
        "np16_nr2_uniform_s2": "3a76faff6468e618", "np16_nr4_uniform_s0": "a9fdf578dd964bfe",
        "np16_nr4_uniform_s1": "ec34bf0c007832f3", "np16_nr4_uniform_s2": "0a08cb11b9b3f734",
        "np16_nr8_uniform_s0": "a28cba3eaf9300fd", "np16_nr8_uniform_s1": "1dc9c2f8b517643e",
        "np16_nr8_uniform_s2": "dc2bcfd498dff04b", "np16_nr16_uniform_s0": "ee3be5852915ee2e",
        "np16_nr16_uniform_s1": "1aba6283771943f8", "np16_nr16_uniform_s2": "3c47342e8d9e21aa",
    },
    "defaults": {
        "np16_nr4_uniform_s0": "a2ecea94ccc2410a", "np16_nr4_uniform_s1": "0399029b748649c6",
        "np16_nr4_uniform_s2": "dffc69931f9ec79c", "np16_nr8_uniform_s0": "2e1a941e85f0c313",
        "np16_nr8_uniform_s1": "ba70f50086ba5904", "np16_nr8_uniform_s2": "1c2011ba456ee925",
        "np16_nr16_uniform_s0": "f6263e4b383bf5cd", "np16_nr16_uniform_s1": "8f9235e1ee965e6a",
        "np16_nr16_uniform_s2": "3c43fac1d8476f4d",
    },
}


def test_the_default_studys_planned_runs_keep_their_ids_and_config_hashes():
    for name, params in (("params.yaml", load_params(Path(__file__).parents[1] / "params.yaml")),
                         ("defaults", StudyParams())):
        s = params.sampling
        sampling = SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                  max_new_tokens=s.max_new_tokens)
        assert {c.run_id: config_hash(c) for c in run_configs(params.sweep, sampling)} == DEFAULT_PLAN[name], name


def test_run_ids_and_config_hashes_of_stored_studies_are_unchanged(caplog):
    # the stored studies evaluated every eval_every steps (eval_per_doubling 0, before science §9.1's schedule)
    sweep = SweepParams(n=[2, 4, 8], rules=["uniform", "dynamic", "pods", "pilot"], seeds=[0, 1], eval_per_doubling=0,
                        train=TrainParams(agg_mode="seq-mean-token-sum-norm", clip_higher=True))
    configs = {c.run_id: c for c in run_configs(sweep, SamplingConfig())}
    # n = 2: PODS would keep m = 2 of 2 and Pilot-Commit's 2 pilot rollouts are not below n
    assert len(configs) == 2 * (2 + 4 + 4)
    assert "skipping rule 'pods' at n=2" in caplog.text and "skipping rule 'pilot' at n=2" in caplog.text
    assert {run_id: config_hash(configs[run_id]) for run_id in BEFORE} == BEFORE
    # a setting added since (policy_loss) changes the hash only when set away from its default
    pods = configs["np16_nr8_pods_m4_s0"]
    other = pods.model_copy(update={"train": pods.train.model_copy(update={"policy_loss": "clip"})})
    assert config_hash(other) == BEFORE["np16_nr8_pods_m4_s0"]


def test_run_config_rule_arguments():
    cfg = RunConfig(n=8, b_problem=4, c_max=100, rule="dynamic")
    assert cfg.rule_args == {"max_draws": 16}  # the rule's default, filled in: part of the run
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"takes no argument 'mm'; did you mean 'm'"):
        make_rule("pods", 4, 8, {"mm": 4})
    with pytest.raises(ValueError, match="'seed' is a RunConfig field"):
        RunConfig(n=8, b_problem=4, c_max=100, rule="uniform", rule_args={"seed": 1})


def test_validating_params_loads_no_torch_no_engine_and_no_search_method():
    """params.yaml is validated before a stage's process starts (`rollscale run`): the plugin
    modules it imports for names stay light, and no engine or search method module loads (nor the packages that
    hold them: a lazy registry's names and declarations are read from the folder), so a stage that only validates
    params depends on none of them."""
    probe = ("import sys, json; from rollscale.config import load_params; load_params('params.yaml'); "
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm') "
             "or m.startswith(('rollscale.lm.engines', 'rollscale.core.search', 'rollscale.core.fit.forecast')))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == []


def test_a_lazy_registrys_declarations_read_from_source_agree_with_the_imported_classes():
    """Params validation asks a search method what it needs (``starts_with``) without importing it: what each
    method's own class body states is what the imported class says (one it only inherited would read as the
    default here: each method states its own)."""
    from rollscale.core.search.methods.base import SearchMethod

    for name in SEARCH_METHODS.names():
        method = SEARCH_METHODS.get(name)
        for attribute in ("starts_with", "words"):
            assert SEARCH_METHODS.declared(name, attribute, getattr(SearchMethod, attribute)) \
                == getattr(method, attribute), (name, attribute)
    assert SEARCH_METHODS.declared("grid", "starts_with") is None
    assert SEARCH_METHODS.declared("forecast", "starts_with") == "seeds_min"
    with pytest.raises(RegistryError, match="did you mean 'grid'"):
        SEARCH_METHODS.declared("grd", "starts_with")
    with pytest.raises(RegistryError, match="lazy"):
        ALLOCATION_RULES.declared("uniform", "name")


def test_lazy_names_are_read_one_parse_at_a_time_from_many_threads(tmp_path, monkeypatch):
    """CPython 3.11's ast.parse raised "AST constructor recursion depth mismatch" when a flow's tasks validated
    params side by side (tests/test_faults.py, 2026-11-28): the lazy registries' source reads (the names and the
    declarations) never parse in two threads at once (every parse takes rollscale/parsing.py's lock), and read each
    version of a file once."""
    import threading
    import time

    from rollscale import parsing, registry

    source = tmp_path / "plugin.py"
    source.write_text('@REG.register("a")\ndef a():\n    pass\n\n\n@register("b")\nclass B:\n    pass\n')
    inside, most, calls, lock = [0], [0], [0], threading.Lock()
    parse = parsing._unlocked_parse

    def slow_parse(*args, **kwargs):
        with lock:
            inside[0] += 1
            calls[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        try:
            return parse(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(parsing, "_unlocked_parse", slow_parse)
    registry._parse_version.cache_clear()
    files = [source] + [tmp_path / f"copy{i}.py" for i in range(5)]
    for f in files[1:]:
        f.write_text(source.read_text())
    results = []
    threads = [threading.Thread(target=lambda f=f: results.append(registry._decorated_names(f)))
               for f in files * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and calls[0] == len(files), (most, calls)
    assert results and all(r == ["a", "b"] for r in results)
    # the declarations params validation reads go through the same parse: never two at once either
    declared = []
    threads = [threading.Thread(target=lambda: declared.append(SEARCH_METHODS.declared("forecast", "starts_with")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and declared == ["seeds_min"] * 8, (most, declared)
