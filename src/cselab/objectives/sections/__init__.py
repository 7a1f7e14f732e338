"""The ``objective:`` sub-sections, one torch-free module per paper beside its paper module.

Each module holds its section's dataclass: the keys, their defaults, the words ``cselab config``
prints (the docstring) and ``validate(facts)``. :mod:`cselab.objectives.config` assembles them
into :class:`~cselab.objectives.config.ObjectiveConfig`; the paper module of the same name
(``cselab.objectives.<paper>``) builds its part from the section.
"""
