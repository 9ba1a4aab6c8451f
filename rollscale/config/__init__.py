"""The one validated config tree: ``StudyParams`` from params.yaml to the step (study.py), its data section
(data.py), the stage sections (sections.py) and the commands' sections (commands.py); which model owns a key
(keys.py); what types let through (checks.py)."""

from rollscale.config.study import *  # noqa: F403 (the tree's public names: study.__all__)
from rollscale.config.study import __all__  # noqa: F401
