"""The study's verifiers (science §2) as TRL reward functions and verl ``compute_score`` functions.

An exported production run scores its rollouts with the verifier the study used: TRL calls
``reward(completions, answer=..., **columns)`` with the dataset's ``answer`` column (``trl grpo``'s
``reward_funcs`` takes these by dotted path, e.g. ``rollscale.integrations.export.rewards.numeric``);
verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` from the file and
function named by ``reward.custom_reward_function.path`` / ``.name``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollscale.core.problems.rewards import reward_fn

__all__ = ["TRL_REWARDS", "exact", "math", "numeric", "trl_reward", "verl_exact", "verl_math", "verl_numeric"]


def _text(completion: Any) -> str:
    """A TRL completion as text: a string, or the conversational form's last message content."""
    if isinstance(completion, list):
        return str(completion[-1]["content"]) if completion else ""
    return str(completion)


def trl_reward(verifier: str) -> Callable[..., list[float]]:
    """A TRL reward function scoring each completion against the ``answer`` column with ``verifier``
    (``numeric``, ``math``, ``exact`` or a ``module:function``; science §2)."""
    verify = reward_fn(verifier)

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [float(verify(_text(c), str(a))) for c, a in zip(completions, answer, strict=True)]

    reward.__name__ = verifier.rsplit(":", 1)[-1]
    return reward


numeric = trl_reward("numeric")
math = trl_reward("math")
exact = trl_reward("exact")
# verifier name -> the dotted path `trl grpo --reward_funcs` imports
TRL_REWARDS = {name: f"{__name__}.{name}" for name in ("numeric", "math", "exact")}


def _verl(verifier: str) -> Callable[..., float]:
    verify = reward_fn(verifier)

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                      **_: Any) -> float:
        return float(verify(str(solution_str), str(ground_truth)))

    return compute_score


verl_numeric = _verl("numeric")
verl_math = _verl("math")
verl_exact = _verl("exact")
