"""The study's answer as a production run of TRL or verl (``rollscale export``; docs/integrations.md).

:mod:`.plan` picks the key from the ``decision`` table with every setting its runs trained with;
:mod:`.trl_config` and :mod:`.verl_overrides` write them in the framework's own keys, each with the
study quantity it comes from, and say what the framework cannot express; :mod:`.rewards` gives the
study's verifiers in each framework's reward signature; :mod:`.command` is the CLI's call.
"""
