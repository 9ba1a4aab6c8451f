"""``rollscale export`` (issue 40): the decision at C* as TRL's GRPOConfig and verl's ppo_trainer overrides.

Real checks: the TRL YAML is read by TRL's own ``trl grpo`` parser into a GRPOConfig that a GRPOTrainer
trains two steps from on the tiny model (CPU); the verl overrides are composed by Hydra with the
installed verl package's ``ppo_trainer`` config (its defaults list of actor, rollout, ... files), which
refuses an unknown key, and each value's type is checked against verl's typed config dataclasses
(annotations read from verl's source) or, where a node has none, against verl's default.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from rollscale.config import parse_params
from rollscale.core.fit.decision_table import DECISION_COLUMNS
from rollscale.integrations.export.command import export_run
from rollscale.integrations.export.plan import production_run
from rollscale.integrations.export.trl_config import LOSS_TYPES, trl_gaps, trl_settings
from rollscale.integrations.export.verl_overrides import verl_gaps, verl_settings
from rollscale.pipeline.cli import main

PARAMS = {
    "model": {"lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
    "sweep": {"bucket": "easy", "design": "rollout_axis", "n": [2, 4], "b_problem": [2], "c_max": 64,
              "rules": ["uniform", {"rule": "pods", "keep": 0.5}],
              "train": {"lr_base": 1e-3, "b_base": 8, "clip_higher": True, "agg_mode": "seq-mean-token-sum-norm",
                        "advantage_scale": "none", "recipe": "on", "kl_coef": 0.01, "entropy_coef": 0.002}},
    "sampling": {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 4},
    "study": {"target_budget": 80},
}


def decision(rule: str = "uniform", leader: int = 4, shift: float = 0.0) -> pd.DataFrame:
    """A fit stage's decision table: one n design group (B_problem 2) with keys 2 and 4."""
    rows = []
    for key, reward in ((2, 0.41 + shift), (4, 0.47 + shift)):
        rows.append({c: np.nan for c in DECISION_COLUMNS} | {
            "design": "n", "bucket": "easy", "rule": rule, "fixed": "b_problem=2", "key": key, "c_star": 80.0,
            "tolerance": 0.02, "status": "leader" if key == leader else "settled", "leader": leader, "decided": True,
            "reward": reward, "reward_lo": reward - 0.03, "reward_hi": reward + 0.03, "settled": key != leader,
            "settled_by": "", "within_tolerance": False, "extrapolated": False, "unknown": False, "seeds": 2,
            "c_seen": 64.0, "n": key, "b_problem": 2, "steps": math.ceil(80 / (2 * key)), "to_decide": ""})
    return pd.DataFrame(rows, columns=DECISION_COLUMNS)


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A study folder with params.yaml and the fit stage's decision table."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    (tmp_path / "artifacts" / "fit").mkdir(parents=True)
    pd.concat([decision(), decision("pods", shift=-0.05)]).to_parquet(tmp_path / "artifacts/fit/decision.parquet")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_leader_with_the_study_settings():
    run = production_run(parse_params(PARAMS), decision())
    assert (run.key, run.n, run.b_problem, run.steps, run.c_star) == (4, 4, 2, 10, 80)
    assert run.lr == pytest.approx(1e-3 * math.sqrt(8 / 8)) and run.eps_high == 0.28
    assert (run.train.kl_coef, run.train.entropy_coef) == (0.01, 0.002)  # recipe on
    other = production_run(parse_params(PARAMS), decision(), key=2)
    assert (other.n, other.steps, other.status) == (2, 20, "settled")
    assert other.lr == pytest.approx(1e-3 * math.sqrt(4 / 8))


def test_trl_counts_completions_and_names_the_study_quantity():
    run = production_run(parse_params(PARAMS), decision())
    s = {x.key: x for x in trl_settings(run)}
    assert s["per_device_train_batch_size"].value * s["gradient_accumulation_steps"].value == run.batch == 8
    assert s["per_device_train_batch_size"].value % s["num_generations"].value == 0
    assert (s["max_steps"].value, s["loss_type"].value, s["scale_rewards"].value) == (10, "dr_grpo", "none")
    assert (s["beta"].value, s["epsilon_high"].value, s["mask_truncated_completions"].value) == (0.01, 0.28, True)
    assert all(x.source for x in s.values())
    assert set(LOSS_TYPES) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}


def test_an_aggregation_trl_lacks_is_said_and_clipped_alike():
    params = dict(PARAMS, sweep={**PARAMS["sweep"], "train": {**PARAMS["sweep"]["train"], "agg_mode": "seq-mean-token-sum"}})
    run = production_run(parse_params(params), decision())
    s = {x.key: x.value for x in trl_settings(run)}
    assert s["loss_type"] == "dr_grpo" and s["max_grad_norm"] == pytest.approx(1.0 / 4)
    assert any(g.what == "sweep.train.agg_mode seq-mean-token-sum" for g in trl_gaps(run))
    assert not any("agg_mode" in g.what for g in verl_gaps(run))  # verl has the mode itself


def test_bad_input_is_one_line(study, capsys):
    assert main(["export", "--to", "mlflow"]) == 2
    assert "--to mlflow: expected one of trl, verl" in capsys.readouterr().err
    assert main(["export", "--to", "trl", "--key", "16"]) == 2
    assert "--key 16: not a key of the study" in capsys.readouterr().err
    assert main(["export", "--to", "trl", "--rule", "variance"]) == 2
    assert "--rule variance: not a rule of the study's decision (rules: pods, uniform)" in capsys.readouterr().err
    (study / "params.yaml").write_text(yaml.safe_dump(dict(PARAMS, sweep={**PARAMS["sweep"], "rules": ["pods"]})))
    assert main(["export", "--to", "trl", "--rule", "uniform"]) == 2
    assert "rule uniform is not in sweep.rules of params.yaml" in capsys.readouterr().err
    # issue 55, case 2: a foreign one-row table (no record of the fit to check it against) said "rollscale: bucket"
    pd.DataFrame({"answer": [42]}).to_parquet(study / "artifacts/fit/decision.parquet")
    assert main(["export", "--to", "trl"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rollscale: artifacts/fit/decision.parquet: not a decision table of this rollscale (no "
                           "column design, bucket, rule,") and "run the fit stage again" in line, line
    assert not (study / "export").exists()
    (study / "artifacts/fit/decision.parquet").unlink()
    assert main(["export", "--to", "verl"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no decision yet; run the fit stage first" in err and len(err.splitlines()) == 1


def test_a_rule_no_framework_runs_is_said(study, capsys):
    assert main(["export", "--to", "trl", "--rule", "pods"]) == 0
    out = capsys.readouterr()
    assert "warning: trl cannot express rule pods: PODS" in out.err
    text = (study / "export/trl_grpo.yaml").read_text()
    assert "NOT EXPRESSED in TRL" in text and "#   - rule pods" in text


def trl_parse(path: Path, *extra: str):
    from trl.scripts.grpo import make_parser

    return make_parser().parse_args_and_config(["--config", str(path), *extra])  # unknown keys fail


def test_trl_yaml_trains_two_steps_with_trl(study, capsys):
    trl = pytest.importorskip("trl")
    import torch
    from datasets import Dataset

    from rollscale.lm.models import char_tokenizer, tiny_llama

    tok = char_tokenizer()
    torch.manual_seed(0)
    tiny_llama(len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
               max_positions=32).save_pretrained(study / "artifacts/base/model")
    assert main(["export", "--to", "trl"]) == 0
    out = capsys.readouterr()
    assert "wrote export/trl_grpo.yaml" in out.out and "rule uniform" in out.out
    script, args, model, _ = trl_parse(study / "export/trl_grpo.yaml", "--max_steps", "2", "--output_dir",
                                       str(study / "out"), "--report_to", "none", "--use_cpu", "true", "--logging_steps", "1",
                                       "--save_strategy", "no")
    assert isinstance(args, trl.GRPOConfig)
    assert (args.num_generations, args.loss_type, args.beta, args.epsilon_high) == (4, "dr_grpo", 0.01, 0.28)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 8 and args.max_completion_length == 4
    assert args.learning_rate == pytest.approx(1e-3) and args.entropy_coef == 0.002 and args.scale_rewards == "none"
    module, name = script.reward_funcs[0].rsplit(".", 1)  # as `trl grpo` imports it
    reward = getattr(importlib.import_module(module), name)
    data = Dataset.from_dict({"prompt": ["1+2=", "3+4=", "2+2=", "5+1="], "answer": ["3", "7", "4", "6"]})
    torch.set_num_threads(1)
    assert (model.use_peft, model.lora_r, model.lora_target_modules) == (True, 4, ["q_proj", "v_proj"])
    trainer = trl.GRPOTrainer(model=model.model_name_or_path, reward_funcs=[reward], args=args, train_dataset=data,
                              processing_class=tok, peft_config=trl.get_peft_config(model))
    trainer.train()
    assert trainer.state.global_step == 2
    assert sum("loss" in row for row in trainer.state.log_history) == 2
    snippet = (study / "export/trl_grpo.py").read_text()
    compile(snippet, "trl_grpo.py", "exec")
    assert 'reward_funcs=[trl_reward("numeric")]' in snippet


def kind(value: object) -> str:
    """A value's type as verl's YAML states it: its defaults write floats as 0 or 1 too (entropy_coeff: 0)."""
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def verl_field_types(verl_dir: Path) -> dict[str, dict[str, str]]:
    """Each config dataclass of the installed verl (``_target_`` of its YAML nodes) -> field -> annotation,
    read from its source with ast (verl imports its GPU deps), bases' fields included."""
    import ast

    classes: dict[str, tuple[list[str], dict[str, str]]] = {}
    for path in [verl_dir / "base_config.py", *(verl_dir / "workers/config").glob("*.py"),
                 *(verl_dir / "trainer/config").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                fields = {a.target.id: ast.unparse(a.annotation) for a in node.body
                          if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
                classes[node.name] = ([ast.unparse(b).split(".")[-1] for b in node.bases], fields)

    def resolved(name: str) -> dict[str, str]:
        bases, fields = classes.get(name, ([], {}))
        out: dict[str, str] = {}
        for base in bases:
            out.update(resolved(base))
        return out | fields

    return {name: resolved(name) for name in classes}


def annotation_admits(annotation: str, value: object) -> bool | None:
    """Whether a dataclass field annotated ``annotation`` takes ``value`` (None: not a plain type, unchecked)."""
    import re

    words = set(re.findall(r"[A-Za-z_]+", annotation))
    plain = words & {"bool", "int", "float", "str"}
    if not plain:
        return None
    admits = set(plain) | ({"int"} if "float" in plain else set()) | ({"NoneType"} if words & {"Optional", "None"} else set())
    return type(value).__name__ in admits


def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")  # found without importing verl (its GPU deps are not installed)
    if spec is None:
        pytest.skip("verl is not installed (uv pip install --no-deps verl==0.9.1)")
    return Path(spec.submodule_search_locations[0]) / "trainer/config"


def overrides_of(script: Path) -> list[str]:
    """The overrides of an exported verl script, as bash reads its array."""
    text = script.read_text()
    return shlex.split(text[text.index("OVERRIDES=(") + len("OVERRIDES=("):text.index("\n)")], comments=True)


def verl_composed(overrides: list[str]):
    """verl's ``ppo_trainer`` composed by Hydra with ``overrides``, as verl's main_ppo composes it (its defaults
    list: actor, rollout, ref, data, reward, ... files); each key checked against verl's own config."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = verl_config_dir()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        default = compose("ppo_trainer")
        applied = compose("ppo_trainer", overrides=overrides)  # Hydra refuses a key the config lacks
    # each key in verl's composed config, each value of the type verl's typed dataclass gives the field where
    # the node names one (_target_; annotations read with ast: verl imports its GPU deps), else of its default's
    types, checked = verl_field_types(config_dir.parent.parent), 0
    for override in overrides:
        key = override.split("=", 1)[0]
        parts = key.lstrip("+").split(".")
        got = OmegaConf.select(applied, ".".join(parts))
        if key.startswith("+"):  # added for verl's DAPO reward manager: its parent exists in verl's config
            assert OmegaConf.select(default, parts[0]) is not None, key
            continue
        assert OmegaConf.select(default, key, default="<missing>") != "<missing>", key
        node = OmegaConf.select(default, ".".join(parts[:-1]))
        if OmegaConf.is_dict(node) and "_target_" in node:
            cls = str(node["_target_"]).rsplit(".", 1)[-1]
            assert parts[-1] in types[cls], (cls, parts[-1])
            admits = annotation_admits(types[cls][parts[-1]], got)
            assert admits is not False, (override, cls, types[cls][parts[-1]])
            checked += admits is True
            continue  # the dataclass is the authority (target_modules: Optional[Any], a string or a list)
        was = OmegaConf.select(default, key)
        if was is not None:  # a default of null takes any type
            assert kind(got) == kind(was), (key, was, got)
    assert checked >= 20
    return applied


def test_verl_overrides_exist_in_verls_own_config(study, capsys):
    from omegaconf import OmegaConf

    params = dict(PARAMS, sweep={**PARAMS["sweep"], "train": {**PARAMS["sweep"]["train"], "overlong_penalty_cache": 2}})
    (study / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["export", "--to", "verl", "--output", "run.sh"]) == 0
    assert "verl cannot express sweep.train.overlong_filter" in capsys.readouterr().err
    overrides = overrides_of(study / "run.sh")
    run = production_run(parse_params(params), decision())
    assert [o.split("=", 1)[0] for o in overrides] == [s.key for s in verl_settings(run)]
    applied = verl_composed(overrides)
    assert OmegaConf.select(applied, "actor_rollout_ref.rollout.n") == 4
    assert OmegaConf.select(applied, "data.train_batch_size") == 2
    assert OmegaConf.select(applied, "actor_rollout_ref.actor.ppo_mini_batch_size") == 2
    assert OmegaConf.select(applied, "trainer.total_training_steps") == 10
    assert OmegaConf.select(applied, "actor_rollout_ref.rollout.response_length") == 4  # interpolated from data
    assert OmegaConf.select(applied, "actor_rollout_ref.actor.loss_agg_mode") == "seq-mean-token-sum-norm"
    assert OmegaConf.select(applied, "algorithm.norm_adv_by_std_in_grpo") is False
    spec = importlib.util.spec_from_file_location("verl_reward", OmegaConf.select(applied, "reward.custom_reward_function.path"))
    reward_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward_module)
    score = getattr(reward_module, OmegaConf.select(applied, "reward.custom_reward_function.name"))
    assert (score("easy", "= 7", "7", None), score("easy", "= 8", "7", None)) == (1.0, 0.0)


def test_verl_dynamic_sampling_keys_exist_and_main_ppo_is_said(study, capsys):
    from omegaconf import OmegaConf

    params = dict(PARAMS, sweep={**PARAMS["sweep"], "rules": ["dynamic"],
                                 "train": {**PARAMS["sweep"]["train"], "tis_cap": 0.0}})
    (study / "params.yaml").write_text(yaml.safe_dump(params))
    decision("dynamic").to_parquet(study / "artifacts/fit/decision.parquet")
    assert main(["export", "--to", "verl"]) == 0
    assert "verl cannot express rule dynamic: algorithm.filter_groups is applied by verl's DAPO recipe" in \
        capsys.readouterr().err
    applied = verl_composed(overrides_of(study / "export/verl_overrides.sh"))
    assert OmegaConf.select(applied, "algorithm.filter_groups.enable") is True
    assert OmegaConf.select(applied, "algorithm.filter_groups.max_num_gen_batches") == 4  # max_draws_factor
    assert OmegaConf.select(applied, "algorithm.rollout_correction.rollout_is") is None  # tis_cap 0: off
    assert main(["export", "--to", "trl"]) == 0
    assert "trl cannot express rule dynamic" in capsys.readouterr().err
    if importlib.util.find_spec("trl") is not None:
        _, args, _, _ = trl_parse(study / "export/trl_grpo.yaml", "--output_dir", str(study / "out"))
        assert args.vllm_importance_sampling_correction is False and args.num_generations == 4


def test_a_study_whose_verdict_is_not_an_answer_is_refused_or_written_with_the_reason_at_its_top(study, capsys):
    """Science §11.5 (issue 56): the SmolLM2 hour study's non-answer was exported as a plan. A verdict with a key
    still open exits 2 saying why and writes nothing; --force writes it with that reason at its top."""
    open_key = decision()
    open_key.loc[open_key["key"] == 2, ["settled", "status", "decided", "d_hi"]] = False, "open", False, 0.05
    open_key["decided"] = False
    open_key["to_decide"] = "about 6 seeds each for the leader and key 2 (sweep.seeds)"
    open_key.to_parquet(study / "artifacts/fit/decision.parquet")
    assert main(["export", "--to", "trl"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the study's verdict at C* = 80 rollouts is not an answer (2 could still " \
        "beat 4 by more than 0.02); to decide: about 6 seeds" in err and "--force" in err, err
    assert not (study / "export/trl_grpo.yaml").exists()
    assert main(["export", "--to", "verl", "--force"]) == 0
    assert "not an answer, written with --force" in capsys.readouterr().err
    first = (study / "export/verl_overrides.sh").read_text().splitlines()[1]
    assert first.startswith("# NOT AN ANSWER (written with --force): the study's verdict at C* = 80 rollouts")
    # the answer at another budget than C* is no answer for it either
    decision().to_parquet(study / "artifacts/fit/decision.parquet")
    assert main(["export", "--to", "trl", "--budget", "1000"]) == 2
    assert "verdict is at C* = 80 rollouts, not at the production budget 1,000: set study.target_budget: 1000" in \
        capsys.readouterr().err


def test_a_study_the_report_says_has_no_answer_yet_is_refused_too(study):
    """One verdict (science §11.5): where the report's first line is "No answer yet" before any fit (no run learned,
    an unfinished sweep), the decision table may still name a leader; export refuses it with the report's reason."""
    from rollscale.integrations.export.command import export_run

    runs = pd.DataFrame({"run_id": ["a", "b"], "status": "finished", "n": [2, 4], "b_problem": 2, "steps": 20})
    flat = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "step": [0, 20, 0, 20], "avg_at_k": [0.5, 0.5, 0.5, 0.49],
                         "avg_at_k_se": 0.05})
    tables = {"decision": decision(), "runs": runs, "evals": flat}

    def read_table(artifacts: str, name: str) -> pd.DataFrame:
        if name not in tables:
            raise LookupError(f"table {name!r} does not exist yet")
        return tables[name]

    with pytest.raises(LookupError, match=r"the study has no answer yet: no run learned: in all 2 runs") as refused:
        export_run("trl", "params.yaml", "artifacts", read_table=read_table)
    assert "--force" in str(refused.value) and not (study / "export").exists()
    # a key still open as well (the SmolLM2 hour study, 2026-11-28): the report's first reason is still the one
    # given, "No answer yet", not the open key
    open_key = decision()
    open_key.loc[open_key["key"] == 2, ["settled", "status", "decided", "d_hi"]] = False, "open", False, 0.05
    tables["decision"] = open_key.assign(decided=False)
    with pytest.raises(LookupError, match=r"the study has no answer yet: no run learned"):
        export_run("trl", "params.yaml", "artifacts", read_table=read_table)
    tables["decision"] = decision()
    tables["evals"] = flat.assign(avg_at_k=[0.5, 0.7, 0.5, 0.65])  # the runs learned: the answer is exported
    assert export_run("trl", "params.yaml", "artifacts", read_table=read_table).files


def test_the_production_budget_is_asked_for_never_the_sweeps_run_budget(study, capsys):
    """Without --budget and without study.target_budget in params.yaml, C* is sweep.c_max, the sweep's own run
    budget: export asks for the production run's rollouts instead of taking it silently (issue 56)."""
    (study / "params.yaml").write_text(yaml.safe_dump({k: v for k, v in PARAMS.items() if k != "study"}))
    assert main(["export", "--to", "trl"]) == 2
    assert "give the production run's rollouts with --budget N" in capsys.readouterr().err
    run = production_run(parse_params(PARAMS), decision())  # set explicitly: it is the production budget
    assert run.budget == 80 and run.steps == math.ceil(80 / 8)
    with pytest.raises(LookupError, match="sweep's run budget"):
        production_run(parse_params({k: v for k, v in PARAMS.items() if k != "study"}), decision())


def test_the_datas_column_mapping_goes_into_the_export(tmp_path):
    """init mapped the answer column `solution`: the export says so and renames it, not a hard-coded
    `prompt, answer` (issue 56)."""
    from rollscale.integrations.export.trl_config import trl_snippet, trl_yaml

    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "solution": "2"}\n')
    params = parse_params(dict(PARAMS, data={"source": "table", "tables": [
        {"path": str(data), "prompt": "question", "answer": "solution", "reward": "numeric"}]}))
    run = production_run(params, decision())
    assert run.columns == ("question", "solution") and run.dataset == str(data)
    text = trl_yaml(run, "study")
    assert f"--dataset_name {data} (columns question, solution" in text and "columns prompt, answer" not in text
    snippet = trl_snippet(run, "trl_grpo.yaml")
    assert f'load_dataset("{data}", split="train").rename_columns(' in snippet
    assert "'question': 'prompt'" in snippet and "'solution': 'answer'" in snippet
    compile(snippet, "snippet.py", "exec")
