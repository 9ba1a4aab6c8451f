"""The ``params.yaml`` sections of the GRPO runs and what follows them.

``measure`` (gradient noise at large n, science §6), ``sweep`` with its
``train`` step (science §1, §3, §4), ``fit`` (frontiers, science §7) and
``report``. Every section derives from :class:`Section`: unknown keys are
errors and assignments are validated. :mod:`rollscale.config` assembles them
into the one tree, :class:`rollscale.config.StudyParams`, and re-exports them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from rollscale.config.checks import bool_for_number
from rollscale.registry import (
    ADVANTAGE_ESTIMATORS,
    ALLOCATION_RULES,
    LOSS_AGGREGATIONS,
    FORECAST_FORMS,
    POLICY_LOSSES,
    SEARCH_METHODS,
    closest_hint,
)


class Section(BaseModel):
    """Base of every params.yaml section: an unknown key is an error, and so is a bad value set later."""

    # a number is finite: `.inf` or `.nan` (YAML reads both) is no learning rate, bound or share
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads `c_max: true` as 1: every number field of every section refuses booleans
        where = bool_for_number(cls.model_fields[info.field_name].annotation, value)
        if where is not None:
            at = f" at item {where[1:]}" if where else ""
            raise ValueError(f"expected a number, got a boolean{at} (YAML reads true/false/yes/no/on/off as booleans)")
        return value


# steps one run may have: a run's step table and its evaluation schedule are held in memory (a step's row and
# an int64 per step), so a c_max or base.steps past this cannot fit the machine (1e12 rollouts asked 233 GiB)
MAX_RUN_STEPS = 10_000_000
SURFACE_FORM = "surface"  # science §10.1's surface, a forecast form fitted by core/fit/surface.py, not by forms/

# buckets where the healthy recipe (science §3) turns KL and entropy on
_RECIPE_ON = frozenset({"easy", "very_easy"})


class TrainParams(Section):
    """The GRPO step (science §3) shared by every sweep run."""

    lr_base: float = Field(1e-4, gt=0)
    b_base: int = Field(256, ge=1)  # lr = lr_base * sqrt(B / b_base)
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0)
    # the names below are the registries' (rollscale/registry.py): a new one is a module of rollscale/core/losses
    advantage_scale: str = "group"  # advantage estimator: group (GRPO) | none (Dr.GRPO)
    policy_loss: str = "clip"  # the clipped PPO / GRPO surrogate
    agg_mode: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    clip_higher: bool = False  # DAPO: eps_high = 0.28
    # healthy recipe (science §3): auto = KL + entropy on for Easy, off for Hard and mixtures
    recipe: Literal["auto", "on", "off"] = "auto"
    kl_coef: float = Field(1e-3, ge=0)
    entropy_coef: float = Field(1e-3, ge=0)
    zero_var_filter: bool = True
    overlong_filter: bool = True
    overlong_penalty_cache: int = Field(0, ge=0)  # DAPO soft penalty window in tokens; 0 = off
    # padded tokens per micro-batch (update, reference log-probs, Gram); gradients
    # accumulate to the full-batch step, so this bounds memory, not the maths
    micro_batch_tokens: int = Field(8192, ge=1)
    ppo_epochs: int = Field(1, ge=1)  # optimizer steps per batch; > 1 lets clipping act
    # truncated importance sampling cap on a separate sampler's mismatch (verl/TRL); 0 = off
    tis_cap: float = Field(2.0, ge=0)
    autocast_bf16: bool = False  # GPU: forward passes under bf16 autocast
    gradient_checkpointing: bool = False  # GPU: recompute activations in backward

    @field_validator("advantage_scale")
    @classmethod
    def _advantage(cls, v: str) -> str:
        return ADVANTAGE_ESTIMATORS.check(v)

    @field_validator("policy_loss")
    @classmethod
    def _policy_loss(cls, v: str) -> str:
        return POLICY_LOSSES.check(v)

    @field_validator("agg_mode")
    @classmethod
    def _agg_mode(cls, v: str) -> str:
        return LOSS_AGGREGATIONS.check(v)

    def for_bucket(self, bucket: str) -> "TrainParams":
        """These settings with the recipe resolved for ``bucket`` (science §3's healthy
        recipe: KL + entropy on Easy-like buckets, off on Hard and mixtures, unless
        ``recipe`` says on or off): ``recipe`` becomes "on" or "off" and the
        coefficients are the ones the run uses."""
        if self.recipe == "on" or (self.recipe == "auto" and bucket in _RECIPE_ON):
            return self.model_copy(update={"recipe": "on"})
        return self.model_copy(update={"recipe": "off", "kl_coef": 0.0, "entropy_coef": 0.0})


# retired keys of sweep.search -> what to do instead (science §8's search is retired)
RETIRED_SEARCH = {"method: frontier": "the frontier search (science §8) is retired: use "
                                      "sweep.search.method: decision (science §9.4) or grid",
                  "grid_points": "sweep.search.grid_points was the retired frontier search's budget grid "
                                 "(science §8, retired): delete the key"}


class SearchParams(Section):
    """How the sweep spends its rollouts (science §9.4, §10.5): a search method of
    :data:`rollscale.registry.SEARCH_METHODS` (one module of ``rollscale/core/search/methods/``).

    ``forecast`` (the default) and ``decision`` advance runs in rungs c_1 < ... < c_R = C_max spaced by ``eta``
    and stop keys once the decision at ``study.target_budget`` (C*) is made within ``study.tolerance``:
    ``forecast`` reads it from the forecast of science §10 (C* up to 8 x C_max, keys settled before C_max),
    ``decision`` from each run's fit (C* up to eta x C_max); ``grid`` trains every run to C_max.
    """

    # forecast: science §10.5 (rollscale/core/search/methods/forecast.py; simulated, docs/benchmarks.md);
    # decision: §9.4; grid: every run to C_max. The one default of the method: the sweep, the replay, check and
    # init read it here
    method: str = "forecast"
    # rung factor c_(r+1) = eta c_r, and A3: a fit is trusted at most eta times past the largest C it saw
    eta: float = Field(2.0, gt=1)
    # bounds behind a stop are one-sided 1 - alpha bootstrap bounds of the decision's D_k (science §9.4)
    alpha: float = Field(0.3, gt=0, lt=0.5)
    # the first rung: <= 1 is a fraction of C_max, > 1 a number of rollouts (rungs go down from C_max by eta)
    first_rung: float = Field(0.0625, gt=0)
    # seeds beyond sweep.seeds a key may get where the decision hangs (seeds_max null); 0 = none
    extra_seeds: int = Field(0, ge=0)
    # methods decision and forecast: each key starts with the first seeds_min of sweep.seeds (no more than they
    # list); seeds are added (at C_max, to the leader and the closest unsettled key) up to seeds_max where the
    # decision hangs; null = len(sweep.seeds).
    # With 1 (the embedded default) no key is settled before those seeds give a spread (science §9.3)
    seeds_min: int = Field(2, ge=1)
    seeds_max: int | None = Field(None, ge=1)
    # the most rollouts the search spends on a group, a multiple of C* (science §11, "Cost": 2): a seed where the
    # decision hangs is added only while the group's runs, with it, stay within it; null = up to seeds_max
    spend_max: float | None = Field(None, gt=0)
    # bracket limits: the smallest / largest key the bracket may add; null = n >= 2 (B_problem >= 1),
    # and up to b_max / B_problem (b_max / n; iso-batch: B)
    key_min: int | None = Field(None, ge=1)
    key_max: int | None = Field(None, ge=1)
    # the search's own fits: the rise a record bin of the leader must show (A2 stops), and the bootstrap; the
    # fit stage's defaults, kept apart so that changing the analysis (fit.*) never changes what the sweep trains
    bin_width: float = Field(0.02, gt=0, le=1)
    bootstrap_resamples: int = Field(200, ge=0)
    bootstrap_seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        if isinstance(data, dict) and "grid_points" in data:
            raise ValueError(RETIRED_SEARCH["grid_points"])
        return data

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        if v == "frontier":
            raise ValueError(RETIRED_SEARCH["method: frontier"])
        return SEARCH_METHODS.check(v)

    @model_validator(mode="after")
    def _bounds_in_order(self) -> "SearchParams":
        # a key starts with seeds_min seeds and gains seeds up to seeds_max (core/search/budget.py's seed_cap):
        # a cap below the start would add none and train more than it allows; an empty bracket adds no key
        if self.seeds_max is not None and self.seeds_min > self.seeds_max:
            raise ValueError(f"sweep.search.seeds_min ({self.seeds_min}) is above sweep.search.seeds_max "
                             f"({self.seeds_max}): keys start with seeds_min seeds and gain seeds up to seeds_max; "
                             "set seeds_min <= seeds_max")
        if self.key_min is not None and self.key_max is not None and self.key_min > self.key_max:
            raise ValueError(f"sweep.search.key_min ({self.key_min}) is above sweep.search.key_max ({self.key_max}): "
                             "the bracket would hold no key; set key_min <= key_max (or null)")
        return self


def _rule_entry(value: Any) -> Any:
    """A ``sweep.rules`` entry: a bare name is the rule with its default hyperparameters; an
    unknown name fails here, naming the closest (before the union's own message)."""
    entry = {"rule": value} if isinstance(value, str) else value
    if isinstance(entry, dict) and "rule" in entry and entry["rule"] not in ALLOCATION_RULES.names():
        raise ValueError(f"unknown allocation rule {entry['rule']!r}{closest_hint(entry['rule'], ALLOCATION_RULES.names())} "
                         f"(expected one of: {', '.join(ALLOCATION_RULES.names())})")
    return entry


def _rule_spec() -> Any:
    """The type of a ``sweep.rules`` entry: the registered rules' ``Params`` models, each with a
    ``rule`` key holding its name, as a union told apart by that key (science §4)."""
    models = [create_model(f"{cls.Params.__name__}_{name}", __base__=cls.Params, rule=(Literal[name], ...))
              for name, cls in ALLOCATION_RULES.items()]
    return Annotated[Union[tuple(models)], Field(discriminator="rule"), BeforeValidator(_rule_entry)]


class RunRecordParams(BaseModel):
    """What a run records beside its steps, and how often: evaluations (science §5, §9.1), checkpoints and the
    gradient-noise measurement (§6). The sweep's keys (``sweep.eval_every``, ...) and the fields of every run's
    config (:class:`rollscale.train.run_config.RunConfig`) alike, so each default is here once."""

    # evaluations on one shared budget schedule (science §9.1): the first step whose C reaches each of this many
    # budgets per doubling of C (from c_max / 64 to c_max), so every n gets as many points per doubling;
    # 0 = every eval_every steps instead (a cadence in steps gives a large B few points)
    eval_per_doubling: int = Field(4, ge=0)
    eval_every: int = Field(20, ge=1)
    eval_k: int = Field(4, ge=1)  # samples per validation problem (science §5)
    eval_temperature: float = Field(0.6, ge=0)
    checkpoint_every: int = Field(20, ge=1)  # and at the end
    noise_every: int = Field(0, ge=0)  # online gradient-noise measurement every k steps; 0 = off
    # every step's two random halves of prompts, for the noise along training (science §6.4): one extra gradient
    # buffer (a sharded run: its shard); false where memory is tight (the report then says it was off)
    noise_halves: bool = True

    def run_record(self) -> dict[str, Any]:
        """These settings by name, as a run's config takes them."""
        return {name: getattr(self, name) for name in RunRecordParams.model_fields}


class SweepParams(Section, RunRecordParams):
    """The rollout sweep over n, B_problem and allocation rules (science §1, §4).

    Designs of the CBS-in-RLVR framework: ``prompt_axis`` (n = n[0] fixed,
    B_problem varies), ``rollout_axis`` (B_problem = b_problem[0] fixed, n
    varies), ``iso_batch`` (B = b_total fixed, the split varies with n),
    ``grid`` (every n x B_problem). What each run records and how often
    (``eval_per_doubling``, ``eval_every``, ``eval_k``, ``eval_temperature``,
    ``checkpoint_every``, ``noise_every``): :class:`RunRecordParams`.
    """

    bucket: str = "easy"
    design: Literal["prompt_axis", "rollout_axis", "iso_batch", "grid"] = "rollout_axis"
    n: list[int] = Field(default_factory=lambda: [4, 8, 16])
    b_problem: list[int] = Field(default_factory=lambda: [16])
    b_total: int = Field(128, ge=2)
    # allocation rules (science §4): names, or mappings with the rule's hyperparameters,
    # e.g. [uniform, {rule: pods, keep: 0.5}] (each rule's Params in rollscale/core/rules);
    # min_length 1 (here and for seeds): an empty list would make an empty grid, not a smaller one
    rules: list[_rule_spec()] = Field(default_factory=lambda: ["uniform"], validate_default=True, min_length=1)
    # three seeds per grid point: the fit's bootstrap resamples seeds (science §7)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    b_max: int = Field(1024, ge=1)  # hardware bound: B_problem * n <= b_max
    c_max: int = Field(40000, ge=1)  # rollouts per run; M = c_max / B
    train: TrainParams = Field(default_factory=TrainParams)
    # where the runs train: local (a pool of `workers` processes here) | ray (one Ray task per run)
    executor: Literal["local", "ray"] = "local"
    # Ray cluster ("ray://head:10001" or "auto"); null = the RAY_ADDRESS environment variable,
    # else a local Ray started on demand on this machine
    ray_address: str | None = None
    # resources each run's Ray task asks for (GPUs per run on a GPU cluster, CPUs here)
    ray_cpus_per_run: float = Field(1.0, gt=0)
    # null = 1 when the model is on GPU (model.device cuda, or auto on a cluster with GPUs), else 0
    ray_gpus_per_run: float | None = Field(None, ge=0)
    # processes (GPUs) one run trains on, FSDP2-sharded on one node (rollscale/train/distributed.py,
    # launched with torchrun); a local run of N takes N of the `workers` slots, a Ray run N GPUs
    devices_per_run: int = Field(1, ge=1)
    # how the sweep spends its rollouts: a search method (science §9.4; rollscale/core/search/methods/)
    search: SearchParams = Field(default_factory=SearchParams)

    @field_validator("rules")
    @classmethod
    def _rules_once(cls, v: list) -> list:
        # runs, fits and the report tell rules apart by name: two entries of one rule would mix
        names = [r.rule for r in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rule {twice[0]!r} is listed more than once; one entry per rule "
                             f"(the fits compare rules by name)")
        return v

    @model_validator(mode="after")
    def _seeds_to_start_with(self) -> "SweepParams":
        # a method that starts each key with the first <setting> of sweep.seeds says so (SearchMethod.starts_with,
        # read from its module without importing it); fewer seeds there would start every key with fewer, silently
        # (only a setting the params set: the schema's default starts a one-seed list with its one seed)
        have, s = len(set(self.seeds)), self.search
        start = SEARCH_METHODS.declared(s.method, "starts_with")
        if start is not None and start in s.model_fields_set and getattr(s, start) > have:
            raise ValueError(f"sweep.search.{start} ({getattr(s, start)}) is more than the {have} seed(s) of "
                             f"sweep.seeds: under method {s.method} each key starts with the first {start} of them; "
                             f"list more seeds or lower {start}")
        return self

    @model_validator(mode="after")
    def _steps_fit(self) -> "SweepParams":
        # the run of the fewest rollouts a step has the most steps: c_max / B of it must fit MAX_RUN_STEPS
        b = self.b_total if self.design == "iso_batch" else min(self.n) * min(self.b_problem)
        if self.c_max > MAX_RUN_STEPS * b:
            raise ValueError(f"sweep.c_max ({self.c_max:,}) gives the run of B = {b} rollouts a step "
                             f"{-(-self.c_max // b):,} steps; at most {MAX_RUN_STEPS:,} steps a run fit in memory: "
                             f"sweep.c_max at most {MAX_RUN_STEPS * b:,}")
        return self

    @field_validator("n", "b_problem")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v):
            raise ValueError(f"expected a non-empty list of integers >= 1, got {v}")
        return v

    @field_validator("n")
    @classmethod
    def _group(cls, v: list[int]) -> list[int]:
        if any(x < 2 for x in v):
            raise ValueError(f"a GRPO group needs n >= 2 rollouts per prompt, got {v}")
        return v


class FitParams(Section):
    """Frontier fits and steps to target (science §7)."""

    # record-breaking points: reward bins of this width (validation avg@k)
    bin_width: float = Field(0.02, gt=0, le=1)
    # points of the log grid of C (or M) the frontier F and n* are evaluated on
    grid_points: int = Field(50, ge=2)
    # target reward R* for S(B); null = base (step-0 eval) + target_gain x (best - base), per bucket and rule
    target: float | None = Field(None, ge=0, le=1)
    target_gain: float = Field(0.5, gt=0, le=1)
    # runs whose curves are analysed (a diverged or interrupted run would bias the fits)
    run_status: list[Literal["finished", "stopped", "failed", "running", "interrupted"]] = Field(
        default_factory=lambda: ["finished", "stopped"], min_length=1)
    # 95 % intervals: resample runs (seeds) with replacement this many times and refit; 0 = none (science §7)
    bootstrap_resamples: int = Field(200, ge=0)
    bootstrap_seed: int = 0


class DecisionParams(Section):
    """The practitioner's question (science §9): at C* rollouts, which key, and what reward, within ε."""

    # C*: the rollouts of the production run the study advises (rollscale init --budget sets it);
    # null = sweep.c_max. The study answers up to search.eta x c_max (science §9.3, A3)
    target_budget: int | None = Field(None, ge=1)
    # epsilon, in validation reward: a key within it of the best is as good an answer. One avg@4 evaluation
    # on 100 problems has a standard error up to 0.025 (rollscale/core/fit/power.py), so two evaluations
    # differ detectably only by 0.07; a key's fit pools its evaluations and seeds: on simulated default studies
    # D to the leader is known to +-0.04 with 3 seeds, +-0.055 with 2 (docs/benchmarks.md), so 0.02 settles keys
    # worse by ~0.06; closer keys stay "not decided" until seeds or validation problems are added
    tolerance: float = Field(0.02, gt=0, lt=1)
    # the forecast's shape past the data (science §11.2), read by the search, the fit stage and track: a form of
    # rollscale/core/fit/forms/, or "surface", science §10.1's surface (the forms' baseline). "recent_floor": it
    # meets the long grids' targets for the reward leave-one-grid-out, and the search with it names simulated
    # late winners that one shared rise per doubling misses (`cross` 91.7 % against decay's 25.0, `late` 100 against
    # 33.3): docs/benchmarks.md, "The search and the forecast, simulated"
    forecast_form: str = "recent_floor"

    @field_validator("forecast_form")
    @classmethod
    def _forecast_form(cls, v: str) -> str:
        forms = (*FORECAST_FORMS.names(), SURFACE_FORM)
        if v not in forms:
            raise ValueError(f"unknown forecast form {v!r}{closest_hint(v, forms)} (expected one of: {', '.join(forms)})")
        return v


class ReportParams(Section):
    """The study report."""

    # split-half K_sat above this is drawn at the cap (science §6.3); null = 4 x the largest n
    k_sat_cap: float | None = Field(None, gt=1)


class MeasureParams(Section):
    """Short GRPO runs at large n that measure gradient noise every step (science §6)."""

    bucket: str = "easy"  # whose training split is measured
    n: list[int] = Field(default_factory=lambda: [16, 32])
    b_problem: int = Field(16, ge=2)  # prompts per step (the intraclass rho needs >= 2)
    # measured steps per n (each followed by its GRPO update); the report pools them before any ratio (science
    # §6.2): 9 steps of 16 prompts pool 144 prompts, 3x the 48 of 3 steps. On the embedded default |G|^2 is still
    # not resolved at 144 (its lower bound below 0 at n = 16 and 32; ~100x the prompts would be needed,
    # docs/benchmarks.md): rho and K_sat are, and the report says "signal not resolved". Time is linear in steps
    steps: int = Field(9, ge=1)
    seed: int = 0

    @field_validator("n")
    @classmethod
    def _n(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("expected a non-empty list of group sizes")
        if any(x < 3 for x in v):
            raise ValueError(f"split-half rho needs n >= 3 rollouts per prompt, got {v}")
        return v
