"""What a sampling engine is given and returns: :class:`SamplingConfig` and :class:`Rollout`
(science §1: every rollout generated counts in C; §3: its log-probs feed the off-policy correction).

Plain records in the lowest layer that needs them: the allocation rules and
profiling (core) read rollouts, the engines (:mod:`rollscale.lm.engines`)
make them, the trainer trains on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingConfig:
    """Every generation setting, explicit: no engine falls back to a model's generation_config."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Rollout:
    """One sampled completion of one prompt."""

    text: str
    token_ids: list[int]  # completion tokens, EOS included when produced
    n_tokens: int
    truncated: bool  # hit max_new_tokens without an end marker
    reward: float = float("nan")
    extra: dict = field(default_factory=dict)
    # log-prob of each sampled token under the distribution it was drawn from (temperature,
    # top-k and top-p applied): the off-policy correction's logp_old (science §3); None when
    # the engine does not report them
    logprobs: list[float] | None = None
