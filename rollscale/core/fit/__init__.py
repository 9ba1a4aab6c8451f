"""Frontier analysis (science §7): record points and fits (``curves``, the ``sigmoid``,
``least_squares``), the frontier and n*(C) (``frontier``, ``tables``), bootstrap intervals
over seeds (``bootstrap``), steps to target (``targets``),
the study's tables (``analysis``, ``columns``) and what a study can resolve (``power``)."""
