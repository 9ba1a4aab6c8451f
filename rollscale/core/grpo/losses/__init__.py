"""The pieces of the GRPO loss (science §3), each a pure function, registered by name:
advantage estimators (:mod:`.advantages`), policy losses (:mod:`.policy`), aggregations
(:mod:`.aggregation`); the regularisers are in :mod:`.regularizers`.
:func:`rollscale.core.grpo.loss.grpo_loss` composes them.

Every module here is imported when ``params.yaml`` is validated (the names it may use come
from :mod:`rollscale.registry`), so none imports torch at module level: tensor methods do
everything a loss needs, and torch is loaded by the step that calls them. A new policy loss
(GSPO, CISPO) is one module here with ``@POLICY_LOSSES.register(name)``; its settings are
fields of ``TrainParams`` (rollscale/config/sections.py), which it reads from ``settings``.
"""

PLUGIN_PACKAGE = True  # its modules are found at run time (dvc.yaml lists the folder)
