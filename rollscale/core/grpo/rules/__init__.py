"""The allocation rules (science §4), one module each.

Every module here is imported the first time a rule is looked up
(:data:`rollscale.registry.ALLOCATION_RULES`) and registers its rule there: adding a rule is
adding a module (see docs/architecture.md, "Where to add"). What they share is
:mod:`rollscale.core.grpo.allocation`.
"""

PLUGIN_PACKAGE = True  # its modules are found at run time (dvc.yaml lists the folder)
