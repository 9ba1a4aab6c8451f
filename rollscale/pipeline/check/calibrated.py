"""The stored calibration of this machine (:mod:`rollscale.pipeline.check.calibration` measures it): its seconds
(:class:`Calibration`), the key of every setting they depend on (:func:`calibration_key`), and the stored record
read back while that key matches (:func:`stored_calibration`, ``artifacts/calibration.json``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rollscale.config import StudyParams

__all__ = ["CALIBRATION_FILE", "Calibration", "calibration_key", "stored_calibration"]

CALIBRATION_FILE = "calibration.json"


@dataclass(frozen=True)
class Calibration:
    """Seconds on this machine, one worker. A generate call of R rollouts decodes to its longest answer:
    ``max_new_tokens x (gen_s_per_step + R x gen_s_per_token)`` (:meth:`generate_s`);
    ``train_s_per_step + tokens x train_s_per_token`` an update of tokens of prompt and completion; the measure stage's Gram pass
    over B rollouts: ``tokens x (gram_s_per_token + B x gram_s_per_token_rollout)``; ``base_s``: the base
    stage's work (the tiny model's ``base.steps``, or loading a real model). ``probe_kl``: the learning-rate
    probe's per-token KL to the start after each of its steps at ``probe_lr`` (empty: not measured)."""

    key: str
    gen_s_per_step: float
    gen_s_per_token: float
    train_s_per_step: float
    train_s_per_token: float
    gram_s_per_token: float
    gram_s_per_token_rollout: float
    prompt_tokens: float
    base_s: float
    load_s: float
    measured_s: float
    probe_lr: float = float("nan")
    probe_kl: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "probe_kl", tuple(float(v) for v in self.probe_kl))  # a list when read from JSON

    def generate_s(self, rollouts: int, batch_size: int, max_new_tokens: int) -> float:
        """Seconds to generate ``rollouts`` in calls of at most ``batch_size``, each to ``max_new_tokens``."""
        calls = -(-rollouts // batch_size) if rollouts > 0 else 0
        return max_new_tokens * (calls * self.gen_s_per_step + rollouts * self.gen_s_per_token)

    def to_json(self) -> dict:
        return asdict(self)


def _base_fingerprint(artifacts: str | Path | None) -> str:
    path = Path(artifacts or "") / "base" / "model_ref.json"
    return path.read_text() if artifacts is not None and path.is_file() else ""


def calibration_key(p: StudyParams, artifacts: str | Path | None = None) -> str:
    """What the measured throughputs depend on: the model (the base stage's, once it has run: a trained
    model's answers end sooner than a fresh one's), the sampler's engine, the update's memory settings,
    the threads and the prompts' source (not the lengths or the grid: the estimate scales them)."""
    s, t, d = p.sampling, p.sweep.train, p.data
    parts = [p.model.model_dump_json(), s.backend, str(s.batch_size), str(s.engine_dtype), str(s.max_model_len),
             json.dumps(s.chat_template_kwargs, sort_keys=True, default=str), str(t.micro_batch_tokens),
             str(t.autocast_bf16), str(t.gradient_checkpointing), str(p.torch_threads),
             p.base.model_dump_json() if p.model.kind == "tiny" else "", d.source, str(d.name), str(d.path),
             json.dumps([str(x.path) for x in d.tables]), _base_fingerprint(artifacts)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def stored_calibration(p: StudyParams, artifacts: str | Path | None) -> Calibration | None:
    """The stored calibration when its key is this study's, else None."""
    path = Path(artifacts or "") / CALIBRATION_FILE
    if artifacts is None or not path.is_file():
        return None
    try:
        cal = Calibration(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return cal if cal.key == calibration_key(p, artifacts) else None
