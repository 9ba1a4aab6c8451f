"""The sweep's search methods (``sweep.search.method``), one module each: ``grid`` (every run to C_max)
and ``decision`` (science §9.4, the default: stop once the decision at C* is made).

Each module registers its method, a :class:`~rollscale.core.search.methods.base.SearchMethod`, in
:data:`rollscale.registry.SEARCH_METHODS` under the module's name, and is imported only when chosen:
adding a method is adding a module (docs/architecture.md, "Where to add").
"""

PLUGIN_PACKAGE = True  # its modules are found at run time (dvc.yaml lists the folder)
