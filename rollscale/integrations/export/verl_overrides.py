"""The production run as Hydra overrides of verl's ``ppo_trainer`` config (verl 0.9).

verl counts prompts where TRL counts completions: ``data.train_batch_size`` and
``actor_rollout_ref.actor.ppo_mini_batch_size`` are prompts, each multiplied by ``rollout.n``
inside verl (verl issues #180, #1524, #2333). A mini-batch of the whole batch is one optimizer
step a batch, on-policy like the study's (science §3); ``trainer.total_training_steps`` is M.
verl has the four aggregations of science §3 under the same names (``loss_agg_mode``) and the
k3 KL as ``low_var_kl``; Dr.GRPO's advantage without the std is ``norm_adv_by_std_in_grpo=False``.
Keys starting with ``+`` are added to the config (verl's DAPO reward manager reads them).
"""

from __future__ import annotations

import shlex

from rollscale.integrations.export.plan import Gap, ProductionRun, Setting, study_gaps

__all__ = ["verl_gaps", "verl_settings", "verl_shell"]

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.rollout"


def verl_settings(run: ProductionRun) -> list[Setting]:
    """The ``ppo_trainer`` overrides of ``run``, each with its study quantity (science §1, §3)."""
    t, s = run.train, run.sampling
    out = [
        Setting("algorithm.adv_estimator", "grpo", "GRPO's group-relative advantage (science §3)"),
        Setting("algorithm.norm_adv_by_std_in_grpo", t.advantage_scale == "group",
                f"sweep.train.advantage_scale {t.advantage_scale} (group: divide by the std; none: Dr.GRPO)"),
        Setting(f"{_R}.n", run.n, "n: rollouts per prompt (science §1)"),
        Setting("data.train_batch_size", run.b_problem, "B_problem: prompts a step (verl counts prompts)"),
        Setting(f"{_A}.ppo_mini_batch_size", run.b_problem,
                f"B_problem prompts (x n = {run.batch} rollouts inside verl): one optimizer step a batch"),
        Setting(f"{_A}.ppo_epochs", t.ppo_epochs, "sweep.train.ppo_epochs: optimizer steps per batch"),
        Setting("trainer.total_training_steps", run.steps,
                f"M = ceil(budget / B) = ceil({run.budget or run.c_star} / {run.batch}) (the production run's "
                "rollouts)"),
        Setting(f"{_A}.optim.lr", run.lr, f"lr_base x sqrt(B / B_base) = {t.lr_base:g} x sqrt({run.trained_per_step} / "
                f"{t.b_base}) (sweep.train.lr_base, b_base; science §3)"),
        Setting(f"{_A}.optim.lr_warmup_steps", t.warmup_steps, "sweep.train.warmup_steps (then constant)"),
        Setting(f"{_A}.optim.weight_decay", t.weight_decay, "sweep.train.weight_decay (verl's default is 0.01)"),
        Setting(f"{_A}.optim.clip_grad", t.grad_clip, "sweep.train.grad_clip (the engine workers' key)"),
        Setting(f"{_A}.grad_clip", t.grad_clip, "sweep.train.grad_clip (the FSDP actor's key)"),
        Setting(f"{_A}.use_kl_loss", t.kl_coef > 0, f"KL in the loss (recipe {t.recipe} for bucket {run.bucket})"),
        Setting(f"{_A}.kl_loss_coef", t.kl_coef, "sweep.train.kl_coef"),
        Setting(f"{_A}.kl_loss_type", "low_var_kl", "the k3 estimator exp(ref - new) - (ref - new) - 1 (science §3)"),
        Setting("algorithm.use_kl_in_reward", False, "the study's KL is in the loss, not the reward"),
        Setting(f"{_A}.entropy_coeff", t.entropy_coef, f"sweep.train.entropy_coef (recipe {t.recipe})"),
        Setting(f"{_A}.clip_ratio_low", 0.2, "eps_low of the clipped surrogate (science §3)"),
        Setting(f"{_A}.clip_ratio_high", run.eps_high,
                f"eps_high: clip-higher {'on' if t.clip_higher else 'off'} (sweep.train.clip_higher)"),
        Setting(f"{_A}.loss_agg_mode", t.agg_mode, "sweep.train.agg_mode (verl has the same four modes)"),
        Setting(f"{_A}.loss_scale_factor", s.max_new_tokens,
                "seq-mean-token-sum-norm's constant: sampling.max_new_tokens (verl's default is the padded length)"),
        Setting(f"{_A}.use_dynamic_bsz", True, "micro-batches bounded in tokens, as the study's"),
        Setting(f"{_A}.ppo_max_token_len_per_gpu", t.micro_batch_tokens, "sweep.train.micro_batch_tokens"),
        Setting(f"{_R}.temperature", s.temperature, "sampling.temperature"),
        Setting(f"{_R}.top_p", s.top_p, "sampling.top_p"),
        Setting(f"{_R}.top_k", s.top_k if s.top_k > 0 else -1, "sampling.top_k (verl: -1 = off)"),
        Setting("data.max_response_length", s.max_new_tokens, "sampling.max_new_tokens (rollout.response_length)"),
        Setting("actor_rollout_ref.model.enable_gradient_checkpointing", t.gradient_checkpointing,
                "sweep.train.gradient_checkpointing (memory only)"),
        Setting("actor_rollout_ref.model.path", run.model, "model.name_or_path (a tiny model: the base stage's folder)"),
    ]
    if run.lora is not None:
        out += [Setting("actor_rollout_ref.model.lora_rank", run.lora.r, "model.lora.r (LoRA on: model.lora.enabled)"),
                Setting("actor_rollout_ref.model.lora_alpha", run.lora.alpha, "model.lora.alpha"),
                Setting("actor_rollout_ref.model.target_modules", list(run.lora.target_modules),
                        "model.lora.target_modules")]
    if t.tis_cap > 0:
        out += [Setting("algorithm.rollout_correction.rollout_is", "token",
                        "token-level truncated importance sampling of the sampler's mismatch (sweep.train.tis_cap)"),
                Setting("algorithm.rollout_correction.rollout_is_threshold", t.tis_cap, "sweep.train.tis_cap")]
    if run.rule == "dynamic":
        out += [Setting("algorithm.filter_groups.enable", True, "rule dynamic: drop groups whose rewards are all equal"),
                Setting("algorithm.filter_groups.max_num_gen_batches", int(run.rule_args.get("max_draws", 0)) //
                        run.b_problem, "rule dynamic's max_draws / B_problem: generation batches a step at most")]
    if t.overlong_penalty_cache > 0:
        out += [Setting("reward.reward_manager.name", "dapo", "DAPO's reward manager: the soft overlong penalty"),
                Setting("+reward.reward_kwargs.max_resp_len", s.max_new_tokens, "sampling.max_new_tokens"),
                Setting("+reward.reward_kwargs.overlong_buffer_cfg.enable", True, "sweep.train.overlong_penalty_cache > 0"),
                Setting("+reward.reward_kwargs.overlong_buffer_cfg.len", t.overlong_penalty_cache,
                        "sweep.train.overlong_penalty_cache (tokens)"),
                Setting("+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", 1.0,
                        "the penalty reaches -1 at max_new_tokens (DAPO eq. 13)"),
                Setting("+reward.reward_kwargs.overlong_buffer_cfg.log", False, "verl's own switch")]
    if run.verifiers[0] in ("numeric", "math", "exact"):
        from rollscale.integrations.export import rewards

        out += [Setting("reward.custom_reward_function.path", rewards.__file__, "the study's verifiers as verl "
                        "compute_score functions"),
                Setting("reward.custom_reward_function.name", f"verl_{run.verifiers[0]}",
                        f"the study's verifier {run.verifiers[0]!r} against reward_model.ground_truth (science §2)")]
    return out


def verl_gaps(run: ProductionRun) -> list[Gap]:
    """What verl's ``ppo_trainer`` cannot express of ``run`` (besides :func:`study_gaps`)."""
    t = run.train
    gaps = study_gaps(run, "verl")
    if run.rule == "dynamic":
        gaps.append(Gap("rule dynamic", "algorithm.filter_groups is applied by verl's DAPO recipe and its v1 "
                        "trainer, not by main_ppo's RayPPOTrainer; and verl's steps count trained batches while the "
                        "study's C counts every drawn rollout, so M = C* / B overstates the study's steps"))
    if run.lora is not None and run.lora.dropout > 0:
        gaps.append(Gap("model.lora.dropout", "verl's LoRA has no dropout setting: it trains without"))
    if t.overlong_filter:
        gaps.append(Gap("sweep.train.overlong_filter", "verl's ppo_trainer has no loss mask for truncated responses "
                        "(the study drops them from the loss): they are trained on"))
    if run.verifiers[0] not in ("numeric", "math", "exact"):
        gaps.append(Gap("reward", f"the study's verifier {run.verifiers[0]!r}: point reward.custom_reward_function "
                        "at a compute_score(data_source, solution_str, ground_truth, extra_info) calling it"))
    return gaps


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return str(value)


def verl_shell(run: ProductionRun, source: str) -> str:
    """A bash script: the overrides as an array with a comment each, then verl's entry point with them."""
    prompt, answer = run.columns
    lines = ["#!/usr/bin/env bash", *([f"# NOT AN ANSWER (written with --force): {run.refusal}"] if run.refusal else []),
             f"# verl overrides of ppo_trainer for the production run of the rollscale study {source}",
             f"# {run.headline()}",
             "# verl counts prompts: data.train_batch_size = B_problem, rollouts a step = B_problem x rollout.n "
             f"= {run.batch}",
             f"# add data.train_files / data.val_files ({run.dataset}: the study's prompt column {prompt!r}, "
             f"answer column {answer!r} as reward_model.ground_truth) and your trainer.* (n_gpus_per_node, nnodes, "
             "logger)"]
    gaps = verl_gaps(run)
    if gaps:
        lines.append("# NOT EXPRESSED in verl (the run differs from the study here):")
        lines += [f"#   - {g.what}: {g.why}" for g in gaps]
    lines.append("OVERRIDES=(")
    for s in verl_settings(run):
        lines.append(f"  # {s.source}")
        lines.append(f"  {shlex.quote(f'{s.key}={_value(s.value)}')}")
    lines += [")", 'python3 -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"']
    return "\n".join(lines) + "\n"
