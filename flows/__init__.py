"""Prefect flows: one per study stage, each reading like a methods section.

Run from the project folder (``python -m flows <stage>``): a clone's own copy, else the installed
one (a study folder that ``rollscale init`` wrote holds no code). No library module imports it.
"""
