"""The production run a study advises: one key of the ``decision`` table with the study's settings (science §1, §3, §9).

:func:`production_run` picks the decision's leader at C* (or a key the user names) and gathers every
study quantity a framework's config needs: n, B_problem, the steps M = C* / B, the learning rate with
the square-root rule, the GRPO step's settings with the healthy recipe resolved for the bucket, the
sampling settings and the verifier. The frameworks' writers (:mod:`.trl_config`, :mod:`.verl_overrides`)
turn it into their own settings, each with the study quantity it comes from, and list what they
cannot express as :class:`Gap` s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rollscale.config import LoraParams, SamplingParams, StudyParams, TrainParams
from rollscale.core.fit.verdict import table_verdict
from rollscale.core.grpo.allocation import rule_class
from rollscale.core.grpo.shaping import sqrt_scaled_lr

__all__ = ["DESIGN_ORDER", "FRAMEWORK_RULES", "Gap", "ProductionRun", "Setting", "production_budget", "production_run",
           "study_gaps"]

# the allocation rules a framework may run (science §4): plain GRPO everywhere, dynamic sampling in verl's DAPO
FRAMEWORK_RULES = ("uniform", "dynamic")
# the design whose groups the report's first line states (rollscale.report.decision_text): the n design first
DESIGN_ORDER = ("n", "b_problem", "iso_batch")


@dataclass(frozen=True)
class Setting:
    """One framework setting: its key, its value and the study quantity it comes from."""

    key: str
    value: Any
    source: str


@dataclass(frozen=True)
class Gap:
    """A study setting the framework cannot express (or only approximately): what, and what the run does instead."""

    what: str
    why: str


@dataclass(frozen=True)
class ProductionRun:
    """One key of the study at C*, with every setting its runs trained with (science §1, §3, §4).

    Attributes:
        design, bucket, rule, fixed, key: the decision group and key (``key`` is n, or B_problem in the
            B_problem design).
        n, b_problem: rollouts per prompt and prompts per step; ``steps`` = ceil(C* / (B_problem n)).
        c_star: the target budget C* in rollouts; ``status`` the key's status there ("leader", ...).
        reward, reward_lo, reward_hi: the study's forecast of validation avg@k at C* (NaN when unknown).
        lr: the peak learning rate, lr_base sqrt(B / B_base) with B the rollouts a step trains on.
        train: ``sweep.train`` with the recipe resolved for the bucket (KL and entropy on or off).
        sampling: the ``sampling`` section (temperature, top_p, top_k, max_new_tokens).
        rule_args: the allocation rule's arguments at this key (PODS's m, ...).
        trained_per_step: rollouts a step of the exported run trains on, the B of the learning rate (B for
            a rule exported as plain GRPO).
        verifiers: the verifier names of the study's problems (``numeric``, ``math``, ``exact`` or ``module:function``).
        model: the base model's path or hub id; ``lora`` the ``model.lora`` section (LoRA when enabled).
    """

    design: str
    bucket: str
    rule: str
    fixed: str
    key: int
    n: int
    b_problem: int
    steps: int
    c_star: int
    status: str
    reward: float
    reward_lo: float
    reward_hi: float
    eval_k: int
    lr: float
    train: TrainParams
    sampling: SamplingParams
    rule_args: dict[str, Any] = field(default_factory=dict)
    trained_per_step: int = 0
    verifiers: tuple[str, ...] = ("numeric",)
    model: str = ""
    lora: LoraParams | None = None
    budget: int = 0  # the production run's rollouts (``--budget``, or ``study.target_budget`` set explicitly)
    columns: tuple[str, str] = ("prompt", "answer")  # the dataset's prompt and answer columns (data.tables[0])
    dataset: str = "YOUR_DATASET"  # the study's problem table, where it has one
    refusal: str = ""  # why the study's verdict is not an answer for this run ("" where it is: science §11.5)

    @property
    def batch(self) -> int:
        """B = B_problem n: rollouts generated a step (science §1)."""
        return self.b_problem * self.n

    @property
    def eps_high(self) -> float:
        """Clip-higher (DAPO): 0.28 when ``clip_higher``, else the symmetric 0.2 (science §3)."""
        return 0.28 if self.train.clip_higher else 0.2

    def headline(self) -> str:
        """``n = 4 (B_problem 16, M = 625 steps) at C* = 40,000 rollouts: validation avg@4 0.53 [0.51, 0.56]``."""
        name = "B_problem" if self.design == "b_problem" else "n"
        other = f"n {self.n}" if self.design == "b_problem" else f"B_problem {self.b_problem}"
        forecast = "unknown" if math.isnan(self.reward) else f"{self.reward:.2f}"
        if not (math.isnan(self.reward_lo) or math.isnan(self.reward_hi)):
            forecast += f" [{self.reward_lo:.2f}, {self.reward_hi:.2f}]"
        budget = "" if self.budget in (0, self.c_star) else f" for a production run of {self.budget:,} rollouts"
        return (f"{name} = {self.key} ({other}, M = {self.steps:,} steps) at C* = {self.c_star:,} rollouts{budget}, "
                f"rule {self.rule}, bucket {self.bucket} ({self.status}): study forecast of validation "
                f"avg@{self.eval_k} {forecast}")


def _verifiers(params: StudyParams) -> tuple[str, ...]:
    """The verifiers the study's problems were scored with (science §2): a table's own, else the source's."""
    if params.data.source == "table":
        return tuple(dict.fromkeys(t.reward for t in params.data.tables))
    return ("math",) if params.data.source == "math" else ("numeric",)


def _model(params: StudyParams, artifacts: str) -> str:
    if params.model.kind == "tiny" or params.model.gguf_file:
        return f"{artifacts}/base/model"  # the base stage's save_pretrained folder (a GGUF file dequantised there)
    return str(params.model.name_or_path)


def _group(decision: pd.DataFrame, bucket: str, rule: str | None) -> pd.DataFrame:
    """The rows of the decision group the export reads: the first design's (the report's first line), the
    study's bucket, ``rule`` or else the rule whose leader has the highest reward at C*."""
    rows = decision[decision["bucket"].astype(str) == bucket]
    if rows.empty:
        raise LookupError(f"decision table: no group for bucket {bucket!r} (sweep.bucket); run the fit stage again")
    order = rows["design"].astype(str).map({d: i for i, d in enumerate(DESIGN_ORDER)}).fillna(len(DESIGN_ORDER))
    rows = rows[order == order.min()]
    if rule is not None:
        rules = sorted(set(rows["rule"].astype(str)))
        if rule not in rules:
            raise LookupError(f"--rule {rule}: not a rule of the study's decision (rules: {', '.join(rules)})")
        rows = rows[rows["rule"].astype(str) == rule]
    groups = [g for _, g in rows.groupby(["rule", "fixed"], sort=True)]
    leaders = [float(g.loc[g["status"] == "leader", "reward"].max()) for g in groups]
    # ties go to a rule the frameworks run (plain GRPO first)
    best = max(range(len(groups)), key=lambda i: (-math.inf if math.isnan(leaders[i]) else leaders[i],
                                                   str(groups[i]["rule"].iloc[0]) in FRAMEWORK_RULES))
    return groups[best]


def production_budget(params: StudyParams, budget: int | None) -> int:
    """The production run's rollouts: ``budget`` (``--budget``), else ``study.target_budget`` where params.yaml sets
    it; never the sweep's run budget (``sweep.c_max``, C* by default) silently: a one-line error names both."""
    if budget is not None:
        if budget < 1:
            raise LookupError(f"--budget {budget}: expected the production run's rollouts, a positive number")
        return int(budget)
    if params.study.target_budget is not None and "target_budget" in params.study.model_fields_set:
        return int(params.study.target_budget)
    raise LookupError(f"export: give the production run's rollouts with --budget N: params.yaml sets no "
                      f"study.target_budget, so the study's C* is the sweep's run budget ({params.sweep.c_max:,} "
                      "rollouts), not a production run's")


def _columns(params: StudyParams) -> tuple[tuple[str, str], str]:
    """The dataset's (prompt, answer) columns and where it is: the study's first problem table, as init mapped it."""
    if params.data.source == "table" and params.data.tables:
        t = params.data.tables[0]
        where = str(t.path) if t.path is not None else str(t.hub_id or "YOUR_DATASET")
        return (t.prompt, t.answer), where
    return ("prompt", "answer"), "YOUR_DATASET"


def _refusal(group: pd.DataFrame, budget: int) -> str:
    """Why the group's verdict is no answer for a production run of ``budget`` rollouts ("" where it is one)."""
    v = table_verdict(group)
    c_star = int(round(float(group["c_star"].iloc[0])))
    if not v.answered:
        fix = str(group["to_decide"].iloc[0]) if "to_decide" in group.columns else ""
        what = (f"{v.rival} could still beat {v.leader} by more than {v.tolerance:g}" if v.leader is not None
                else "no key leads")
        return (f"the study's verdict at C* = {c_star:,} rollouts is not an answer ({what})"
                + (f"; to decide: {fix}" if fix and fix != "nan" else ""))
    if budget != c_star:
        return (f"the study's verdict is at C* = {c_star:,} rollouts, not at the production budget {budget:,}: set "
                f"study.target_budget: {budget} and run the fit stage again (rollscale run fit)")
    return ""


def production_run(params: StudyParams, decision: pd.DataFrame, key: int | None = None, rule: str | None = None,
                   artifacts: str = "artifacts", budget: int | None = None) -> ProductionRun:
    """The decision's leader at C* (or ``key``, another key of its group) as a :class:`ProductionRun` of
    ``budget`` rollouts (:func:`production_budget`), with ``refusal`` saying why the study's verdict is not an
    answer for it (science §11.5), "" where it is.

    ``decision`` is the fit stage's ``decision`` table (:mod:`rollscale.core.fit.decision_table`); an empty
    one, a group without a leader (unless ``key`` is given) or a key the group lacks is a one-line error.
    """
    rollouts = production_budget(params, budget)
    if decision.empty:
        raise LookupError("decision table is empty: no key was decided at C*; run the fit stage first "
                          "(rollscale run fit)")
    group = _group(decision, params.sweep.bucket, rule)
    keys = sorted(int(k) for k in group["key"])
    where = f"{group['design'].iloc[0]} / {group['bucket'].iloc[0]} / {group['rule'].iloc[0]} / {group['fixed'].iloc[0]}"
    if key is None:
        lead = group[group["status"] == "leader"]
        if lead.empty:
            raise LookupError(f"decision group {where}: no leader at C* (to decide: {group['to_decide'].iloc[0]}); "
                              f"name a key with --key (keys: {', '.join(map(str, keys))})")
        row = lead.iloc[0]
    else:
        if key not in keys:
            raise LookupError(f"--key {key}: not a key of the study (decision group {where}: keys "
                              f"{', '.join(map(str, keys))})")
        row = group[group["key"].astype(int) == key].iloc[0]
    if pd.isna(row["n"]) or pd.isna(row["b_problem"]):
        raise LookupError(f"decision group {where}, key {int(row['key'])}: its runs differ in n or B_problem, so "
                          "no one production run has its settings")
    n, b_problem = int(row["n"]), int(row["b_problem"])
    entry = next((r for r in params.sweep.rules if r.rule == str(row["rule"])), None)
    if entry is None:
        raise LookupError(f"decision group {where}: rule {row['rule']} is not in sweep.rules of params.yaml (changed "
                          "since the fit stage ran? run it again)")
    allocation = rule_class(entry.rule).for_grid_point(entry, n, b_problem)
    train = params.sweep.train.for_bucket(params.sweep.bucket)  # the recipe the study's runs trained with
    # B of the sqrt rule: what a step trains on. A rule no framework runs (PODS, ...) is exported as plain
    # GRPO, which trains on every rollout: its B is B_problem n
    trained = allocation.trained_per_step if entry.rule in FRAMEWORK_RULES else n * b_problem
    c_star = int(round(float(row["c_star"])))
    columns, dataset = _columns(params)
    return ProductionRun(
        design=str(row["design"]), bucket=str(row["bucket"]), rule=entry.rule, fixed=str(row["fixed"]),
        key=int(row["key"]), n=n, b_problem=b_problem, steps=math.ceil(rollouts / (n * b_problem)), c_star=c_star,
        status=str(row["status"]), reward=float(row["reward"]), reward_lo=float(row["reward_lo"]),
        reward_hi=float(row["reward_hi"]), eval_k=params.sweep.eval_k,
        lr=sqrt_scaled_lr(train.lr_base, trained, train.b_base), train=train,
        sampling=params.sampling, rule_args=allocation.run_args(), trained_per_step=trained,
        verifiers=_verifiers(params), model=_model(params, artifacts),
        lora=params.model.lora if params.model.lora.enabled else None, budget=rollouts, columns=columns,
        dataset=dataset, refusal=_refusal(group, rollouts),
    )


def study_gaps(run: ProductionRun, framework: str) -> list[Gap]:
    """What neither TRL nor verl expresses of the study's run (science §3, §4); each framework adds its own."""
    gaps = []
    rule_gap = {
        "pods": f"PODS (generate n = {run.n}, train on the max-variance subset of m = {run.rule_args.get('m')}): "
                f"{framework} trains on every rollout it generates",
        "pilot": f"Pilot-Commit (n_pilot = {run.rule_args.get('n_pilot')} pilot rollouts on a pool of "
                 f"{run.rule_args.get('pool_factor')} x B_problem prompts, the rest to the best prompts): {framework} "
                 "gives every prompt n rollouts",
        "variance": f"the variance rule (a per-prompt n from each prompt's Beta posterior, prior "
                    f"{run.rule_args.get('prior')}, decay {run.rule_args.get('decay')}): {framework} has one n for "
                    "every prompt",
    }
    if run.rule in rule_gap:
        gaps.append(Gap(f"rule {run.rule}", rule_gap[run.rule] + "; the export is plain GRPO at this key "
                        "(science §4) with the learning rate of B = B_problem n; the study's forecast is the rule's"))
    if run.train.zero_var_filter and (run.train.kl_coef > 0 or run.train.entropy_coef > 0):
        gaps.append(Gap("sweep.train.zero_var_filter", f"KL and entropy only on groups whose rewards vary: "
                        f"{framework} applies them to every rollout"))
    if len(run.verifiers) > 1:
        gaps.append(Gap("data.tables[].reward", f"the study's tables use several verifiers ({', '.join(run.verifiers)}): "
                        f"the export names the first; {framework} needs one reward that dispatches per row"))
    return gaps
