"""The DVC stages: their specs, locks and dvc status (specs.py), code deps (deps.py), what each ran on
(record.py), the outputs' checksums (outputs.py) and the study's status (status.py)."""
