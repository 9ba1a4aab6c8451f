"""The GRPO step's science (science §3, §4): per-token logprobs, the loss (``loss``) composed
of the registered pieces in ``losses/``, the allocation rules in ``rules/`` with what they
share (``allocation``), and overlong shaping and the learning-rate rules (``shaping``)."""
