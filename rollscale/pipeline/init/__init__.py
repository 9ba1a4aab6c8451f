"""`rollscale init`: the command (command.py), the values it sizes a study with and why (values.py), fitting a
study into --hours (hours.py), and the study folder of the user's own (project.py)."""
