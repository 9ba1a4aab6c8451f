"""The production run as TRL's ``GRPOConfig`` (TRL 1.16): a YAML ``trl grpo --config`` reads and a Python snippet.

TRL counts completions where the study counts prompts (TRL issues #3061, #3020): a step's effective
batch ``per_device_train_batch_size x processes x gradient_accumulation_steps`` holds completions and
must be divisible by ``num_generations``. One generation batch (``steps_per_generation`` defaults to the
accumulation steps) is one optimizer step, on-policy like the study's (science §3).

Loss aggregation (science §3) against TRL's ``loss_type``: ``token-mean`` is ``dapo`` (active tokens of
the accumulated batch), ``seq-mean-token-mean`` is ``grpo``, ``seq-mean-token-sum-norm`` is ``dr_grpo``
(the constant is ``max_completion_length``); ``seq-mean-token-sum`` has no loss type: ``dr_grpo`` is it
divided by ``max_completion_length``, which AdamW's update does not see (up to its eps) and gradient
clipping does, so ``max_grad_norm`` is divided by the same constant.
"""

from __future__ import annotations

from rollscale.integrations.export.plan import Gap, ProductionRun, Setting, study_gaps
from rollscale.integrations.export.rewards import TRL_REWARDS

__all__ = ["LOSS_TYPES", "micro_groups", "trl_gaps", "trl_settings", "trl_snippet", "trl_yaml"]

# science §3's aggregation -> TRL's loss_type, and whether the match is exact
LOSS_TYPES = {
    "token-mean": ("dapo", True),
    "seq-mean-token-mean": ("grpo", True),
    "seq-mean-token-sum": ("dr_grpo", False),
    "seq-mean-token-sum-norm": ("dr_grpo", True),
}


def micro_groups(run: ProductionRun) -> int:
    """Prompt groups per micro-batch: the most that divide B_problem and whose completions stay within
    ``micro_batch_tokens`` at the longest completion (the study's bound on a micro-batch's padded tokens)."""
    fits = max(1, run.train.micro_batch_tokens // max(run.sampling.max_new_tokens * run.n, 1))
    return max(g for g in range(1, run.b_problem + 1) if run.b_problem % g == 0 and g <= fits)


def trl_settings(run: ProductionRun) -> list[Setting]:
    """The ``GRPOConfig`` fields (and ``trl grpo``'s script fields) of ``run``, each with its study quantity."""
    t, s = run.train, run.sampling
    groups = micro_groups(run)
    loss_type, exact = LOSS_TYPES[t.agg_mode]
    clip = t.grad_clip / s.max_new_tokens if t.agg_mode == "seq-mean-token-sum" else t.grad_clip
    reward = TRL_REWARDS.get(run.verifiers[0])
    out = [
        Setting("num_generations", run.n, "n: rollouts per prompt (science §1)"),
        Setting("per_device_train_batch_size", groups * run.n,
                f"completions per micro-batch: {groups} prompt groups x n (sweep.train.micro_batch_tokens)"),
        Setting("gradient_accumulation_steps", run.b_problem // groups,
                f"micro-batches a step: B_problem / {groups}, so a step holds B = B_problem x n = {run.batch} "
                "completions on one process (with P processes divide it by P)"),
        Setting("max_steps", run.steps, f"M = ceil(budget / B) = ceil({run.budget or run.c_star} / {run.batch}) (the "
                                         "production run's rollouts)"),
        Setting("learning_rate", run.lr, f"lr_base x sqrt(B / B_base) = {t.lr_base:g} x sqrt({run.trained_per_step} / "
                f"{t.b_base}) (sweep.train.lr_base, b_base; science §3)"),
        Setting("lr_scheduler_type", "constant_with_warmup", "linear warm-up then constant (science §3)"),
        Setting("warmup_steps", t.warmup_steps, "sweep.train.warmup_steps"),
        Setting("weight_decay", t.weight_decay, "sweep.train.weight_decay (AdamW)"),
        Setting("max_grad_norm", clip, "sweep.train.grad_clip" + (f" / max_completion_length: dr_grpo's loss is "
                                                                  "the study's divided by it" if clip != t.grad_clip else "")),
        Setting("num_iterations", t.ppo_epochs, "sweep.train.ppo_epochs: optimizer steps per batch"),
        Setting("beta", t.kl_coef, f"KL coefficient, k3 estimator (sweep.train.kl_coef; recipe {t.recipe} for "
                                   f"bucket {run.bucket})"),
        Setting("entropy_coef", t.entropy_coef, f"entropy bonus (sweep.train.entropy_coef; recipe {t.recipe})"),
        Setting("epsilon", 0.2, "eps_low of the clipped surrogate (science §3)"),
        Setting("epsilon_high", run.eps_high, f"eps_high: clip-higher {'on' if t.clip_higher else 'off'} "
                                             "(sweep.train.clip_higher)"),
        Setting("loss_type", loss_type, f"sweep.train.agg_mode {t.agg_mode}" + ("" if exact else " (nearest; see the "
                                                                                           "notes above)")),
        Setting("scale_rewards", "group" if t.advantage_scale == "group" else "none",
                f"sweep.train.advantage_scale {t.advantage_scale} (group: GRPO; none: Dr.GRPO)"),
        Setting("mask_truncated_completions", t.overlong_filter, "sweep.train.overlong_filter"),
        Setting("temperature", s.temperature, "sampling.temperature"),
        Setting("top_p", s.top_p, "sampling.top_p"),
        Setting("top_k", s.top_k, "sampling.top_k (0 = off)"),
        Setting("max_completion_length", s.max_new_tokens, "sampling.max_new_tokens"),
        Setting("gradient_checkpointing", t.gradient_checkpointing, "sweep.train.gradient_checkpointing (memory only)"),
        Setting("bf16", t.autocast_bf16, "sweep.train.autocast_bf16: forward passes in bf16"),
    ]
    if t.tis_cap > 0:
        out += [Setting("vllm_importance_sampling_mode", "token_truncate",
                        "the study's truncated importance sampling of a separate sampler (with use_vllm only)"),
                Setting("vllm_importance_sampling_clip_max", t.tis_cap, "sweep.train.tis_cap")]
    else:
        out.append(Setting("vllm_importance_sampling_correction", False, "sweep.train.tis_cap 0: off"))
    out.append(Setting("model_name_or_path", run.model, "model.name_or_path (a tiny model: the base stage's folder)"))
    if run.lora is not None:
        out += [Setting("use_peft", True, "model.lora.enabled: LoRA adapters are trained"),
                Setting("lora_r", run.lora.r, "model.lora.r"),
                Setting("lora_alpha", run.lora.alpha, "model.lora.alpha"),
                Setting("lora_dropout", run.lora.dropout, "model.lora.dropout"),
                Setting("lora_target_modules", list(run.lora.target_modules), "model.lora.target_modules")]
    funcs = ([reward] if reward else []) + (["get_soft_overlong_punishment"] if t.overlong_penalty_cache > 0 else [])
    if funcs:
        out.append(Setting("reward_funcs", funcs, f"the study's verifier {run.verifiers[0]!r} on the dataset's answer "
                           "column (science §2)" + (", plus DAPO's soft overlong penalty (see the notes)"
                                                    if t.overlong_penalty_cache > 0 else "")))
    return out


def trl_gaps(run: ProductionRun) -> list[Gap]:
    """What TRL 1.16's GRPOTrainer cannot express of ``run`` (besides :func:`study_gaps`)."""
    t = run.train
    gaps = study_gaps(run, "TRL")
    if run.rule == "dynamic":
        gaps.append(Gap("rule dynamic", "dynamic sampling (drop groups whose rewards are all equal, draw until "
                        "B_problem groups vary): TRL's GRPOTrainer keeps every group; the export is plain GRPO"))
    loss_type, exact = LOSS_TYPES[t.agg_mode]
    if not exact:
        gaps.append(Gap(f"sweep.train.agg_mode {t.agg_mode}", f"no TRL loss_type sums tokens per sequence; {loss_type} "
                        "is it divided by max_completion_length (max_grad_norm divided too, so clipping acts alike)"))
    if t.entropy_coef > 0 and t.agg_mode != "token-mean":
        gaps.append(Gap("sweep.train.entropy_coef", f"TRL's entropy bonus is the token mean whatever the loss_type; "
                        f"the study aggregates it like the loss ({t.agg_mode})"))
    if t.overlong_filter and t.agg_mode == "seq-mean-token-mean":
        gaps.append(Gap("sweep.train.overlong_filter", "TRL's grpo loss counts a masked truncated completion as a "
                        "sequence of the mean; the study's does not"))
    if t.overlong_penalty_cache > 0:
        gaps.append(Gap("sweep.train.overlong_penalty_cache", "trl grpo's get_soft_overlong_punishment is built with "
                        "max_completion_len=1280, soft_punish_cache=256; in Python use trl.rewards."
                        f"get_soft_overlong_punishment({run.sampling.max_new_tokens}, {t.overlong_penalty_cache})"))
    if run.verifiers[0] not in TRL_REWARDS:
        gaps.append(Gap("reward", f"the study's verifier {run.verifiers[0]!r} is a module:function: wrap it with "
                        "rollscale.integrations.export.rewards.trl_reward in Python (trl grpo imports a dotted path only)"))
    return gaps


def _yaml_value(value: object) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def trl_yaml(run: ProductionRun, source: str) -> str:
    """The YAML ``trl grpo --config FILE`` (TRL's own parser) reads, every field with its study quantity."""
    prompt, answer = run.columns
    lines = ([f"# NOT AN ANSWER (written with --force): {run.refusal}"] if run.refusal else []) + [
             f"# TRL GRPOConfig for the production run of the rollscale study {source}",
             f"# {run.headline()}",
             f"# run: trl grpo --config THIS_FILE --dataset_name {run.dataset} (columns {prompt}, {answer}: the "
             "study's data.tables mapping), or the Python snippet beside it",
             "# TRL counts completions: per_device_train_batch_size x processes x gradient_accumulation_steps "
             f"= B = {run.batch}"]
    gaps = trl_gaps(run)
    if gaps:
        lines.append("# NOT EXPRESSED in TRL (the run differs from the study here):")
        lines += [f"#   - {g.what}: {g.why}" for g in gaps]
    for s in trl_settings(run):
        lines.append(f"# {s.source}")
        lines.append(f"{s.key}: {_yaml_value(s.value)}")
    return "\n".join(lines) + "\n"


def trl_snippet(run: ProductionRun, yaml_name: str) -> str:
    """A Python script that trains the run from the YAML with TRL's own parser."""
    verifier = run.verifiers[0]
    reward = f'trl_reward("{verifier}")'
    extra = (f", get_soft_overlong_punishment({run.sampling.max_new_tokens}, {run.train.overlong_penalty_cache})"
             if run.train.overlong_penalty_cache > 0 else "")
    penalty = "from trl.rewards import get_soft_overlong_punishment\n" if extra else ""
    prompt, answer = run.columns
    warning = f"NOT AN ANSWER (written with --force): {run.refusal}\n\n" if run.refusal else ""
    rename = (f'.rename_columns({ {c: t for c, t in ((prompt, "prompt"), (answer, "answer")) if c != t} !r})'
              if (prompt, answer) != ("prompt", "answer") else "")
    return f'''"""{warning}The production run of the rollscale study: {run.headline()}.

Settings: {yaml_name} (each with the study quantity it comes from). The study's data map the prompt to column
{prompt!r} and the answer to {answer!r} (data.tables); the reward is the study's verifier {verifier!r} (science §2).
"""
from datasets import load_dataset
from trl import GRPOTrainer, get_peft_config
{penalty}from trl.scripts.grpo import make_parser

from rollscale.integrations.export.rewards import trl_reward

script_args, args, model_args, _ = make_parser().parse_args_and_config(["--config", "{yaml_name}"])
train = load_dataset("{run.dataset}", split="train"){rename}  # columns: prompt, answer
trainer = GRPOTrainer(model=model_args.model_name_or_path, reward_funcs=[{reward}{extra}], args=args,
                      train_dataset=train, peft_config=get_peft_config(model_args))
trainer.train()
'''
