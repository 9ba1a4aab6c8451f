"""What the study suggests when a production run leaves its band: its settings against the run's own.

The run's settings come from its log where the log keeps them (TRL's TrainingArguments in TensorBoard's
``args`` text or an MLflow run's params; verl's config flattened with "/" in MLflow's params); the study's
are the exported ones (:func:`rollscale.integrations.export.trl_config.trl_settings`,
:func:`rollscale.integrations.export.verl_overrides.verl_settings`). A learning rate, batch or n that differs
is the first thing to check (science §3: the learning rate is scaled with the batch).
"""

from __future__ import annotations

import math

from rollscale.integrations.export.plan import ProductionRun
from rollscale.integrations.export.trl_config import trl_settings
from rollscale.integrations.export.verl_overrides import verl_settings

__all__ = ["setting_differences"]

# the settings compared: what moves a run's curve (science §1, §3); the rest are compared only when logged
_COMPARED = ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
             "beta", "epsilon_high", "loss_type", "scale_rewards", "max_steps", "temperature", "num_iterations",
             "actor_rollout_ref.rollout.n", "data.train_batch_size", "actor_rollout_ref.actor.optim.lr",
             "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.clip_ratio_high",
             "actor_rollout_ref.actor.loss_agg_mode", "trainer.total_training_steps")


def _same(study: object, logged: object) -> bool:
    if isinstance(study, bool):
        return str(logged).lower() == str(study).lower()
    if isinstance(study, (int, float)):
        try:
            return math.isclose(float(study), float(str(logged)), rel_tol=1e-6, abs_tol=1e-12)
        except ValueError:
            return False
    return str(study) == str(logged)


def setting_differences(run: ProductionRun, logged: dict[str, object]) -> list[str]:
    """``key: study X, run Y`` for each compared setting the run's log states with another value."""
    out = []
    for s in [*trl_settings(run), *verl_settings(run)]:
        if s.key not in _COMPARED:
            continue
        for name in (s.key, s.key.replace(".", "/")):  # verl's config in MLflow params is "/"-flattened
            if name in logged and logged[name] is not None and not _same(s.value, logged[name]):
                out.append(f"{s.key}: study {s.value!r}, run {logged[name]!r} ({s.source})")
    return out
