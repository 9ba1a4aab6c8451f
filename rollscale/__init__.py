"""rollscale: how to spend rollouts when post-training an LLM with verifiable rewards.

The library layer: the science of docs/science.md as plain, typed
functions and small classes. No orchestration (Prefect, DVC) and no artifact
paths live here.
"""

from rollscale.parsing import serialize

__version__ = "0.1.0"

serialize()  # one ast.parse at a time in the process, before any flow starts its threads (rollscale/parsing.py)
