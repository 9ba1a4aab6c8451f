"""`rollscale check`: can the study answer? Its findings (findings.py), the budget, evaluations, learning rate,
memory and profile checks, the machine's calibration, and each stage's estimated time (timing.py)."""
