"""The science: estimators, losses, allocation rules, fits, searches and verifiers.

Plain, typed functions of arrays and tables (science §1-§9); no files, no
orchestration, no model loading. One folder per concern:

- ``problems/``: problem sources and sets, verifiers (rewards), difficulty profiling and
  buckets (science §2).
- ``grpo/``: the GRPO step's science: logprobs, the registered loss pieces (``losses/``),
  the allocation rules (``rules/``), overlong shaping and LR rules (science §3, §4).
- ``noise/``: the per-rollout gradient Gram matrix and the gradient-noise estimators (§6).
- ``fit/``: record points, sigmoids, the frontier, bootstrap intervals, targets and the
  study's power (science §7).
- ``search/``: the sweep's search: its rungs and state, the registered methods (``methods/``: grid,
  decision), a grid's replay and simulated studies (science §9.4).

Beside them, the vocabulary every part shares: ``rollouts`` (what an engine is given and
returns), ``metrics`` (avg@k), ``seeds`` and ``checks``.
"""
