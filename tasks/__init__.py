"""Prefect tasks: library calls wrapped with retries on transient errors.

Tasks return values (tables, model weights) and mostly leave writing study
artifacts to the flows. Run from the project folder (``python -m flows``),
never installed as a package.
"""
