"""The science: estimators, losses, allocation rules, fits and verifiers.

Plain, typed functions of arrays and tables (science §1-§7); no files, no
orchestration, no model loading.
"""
