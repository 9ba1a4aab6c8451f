"""Prefect tasks: library calls wrapped with caching, retries and persisted results.

Tasks return values (tables, model weights), never write study artifacts
themselves, so a cached result can never point at a file that was deleted;
the flows write artifacts.
"""
