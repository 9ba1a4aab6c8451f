"""GRPO training: the run loop, its grid of run configs and the checkpointed run store."""
