"""`rollscale sql`: DuckDB queries over the study's tables (storage.py), with their checks, time limit and
Ctrl-C (sql.py)."""
