"""A sweep's search (science §9.4): its settings, groups and rungs (``state``), the methods, one module each
(``methods/``, dispatched by ``decisions``), a grid's replay (``replay``, ``agreement``) and simulated studies."""
