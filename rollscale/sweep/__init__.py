"""The sweep over runs: its grid of run configs, the search's groups, and the rungs that train and decide."""
