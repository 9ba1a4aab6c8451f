"""Prefect flows: one per study stage, each reading like a methods section."""
