"""Gradient noise (science §6): the per-rollout gradient Gram matrix (``gram``, built by the
``hooks`` from per-rollout ``blocks``), and the estimators on it: B_noise (``signal``,
``estimators``, ``ema``), within-group correlation rho and K_sat/K_crit (``correlation``),
and K_sat's summaries (``summary``)."""
