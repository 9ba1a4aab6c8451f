"""One GRPO run: the step, the run loop, its evaluations and the checkpointed run store (the sweep over runs is rollscale.sweep)."""
