"""The training machinery: ``losses = task(batch)``, the loop around it, and what a run keeps.

:mod:`.task` (batch → views → objective → named losses), :mod:`.views` (the encoder passes an
objective asks for), :mod:`.gradcache` (the same step in chunks), :mod:`.trainer` (the loop),
:mod:`.step` (the whole step as one function), :mod:`.batches` (the ready batches),
:mod:`.runstate` (model folders, checkpoints, the resume), :mod:`.finish` (the end of a run, as
callbacks), :mod:`.selection` (model selection on a dev score), :mod:`.checkpoint`, :mod:`.rng`,
:mod:`.distributed` and :mod:`.metrics`. The training machinery never imports a specific objective.
"""
