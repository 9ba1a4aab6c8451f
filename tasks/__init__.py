"""Prefect tasks: library calls wrapped with retries on transient errors.

Tasks return values (tables, model weights) and mostly leave writing study
artifacts to the flows. Run by the flows (``python -m flows``), from a clone's copy or
the installed one; no library module imports it.
"""
