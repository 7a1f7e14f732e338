"""The composition root: a run assembled from its config, above every layer it uses.

:mod:`.plan` resolves a run's facts once (``resolve(config) -> RunPlan``); :mod:`.train` builds
the trainer and its collaborators from them and runs it (``cselab train``, ``cselab.train`` and
every sweep cell come through :func:`cselab.app.train.train`).
"""
