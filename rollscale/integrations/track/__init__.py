"""A production run tracked against the study's forecast (``rollscale track``; docs/integrations.md).

:mod:`.logs` reads the run's logs as they grow (TensorBoard event files, an MLflow run, verl's JSONL file
logger); :mod:`.points` turns its reward into points at rollouts C, one per step however often the run was
resumed, and says when it has left the band; :mod:`.band` is the study's band at every C up to C*
(science §9.3); :mod:`.advice` compares the run's logged settings with the study's; :mod:`.page` draws it.
"""
