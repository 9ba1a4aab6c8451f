"""Prefect flows: one per study stage, each reading like a methods section.

Run from the project folder (``python -m flows <stage>``), never installed as a package.
"""
