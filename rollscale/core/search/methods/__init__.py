"""The sweep's search methods (``sweep.search.method``), one module each: ``grid`` (every run to C_max),
``decision`` (science §9.4: stop once the decision at C* is made) and ``forecast`` (§10.5: the same decision read
from the forecast at a C* up to 8 x C_max, keys settled before C_max).

Each module registers its method, a :class:`~rollscale.core.search.methods.base.SearchMethod`, in
:data:`rollscale.registry.SEARCH_METHODS` under the module's name, and is imported only when chosen:
adding a method is adding a module (docs/architecture.md, "Where to add").
"""

PLUGIN_PACKAGE = True  # its modules are found at run time (dvc.yaml lists the folder)
