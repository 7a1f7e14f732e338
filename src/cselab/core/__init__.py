"""The foundation every layer may import: the version, the user-error types, typed config loading
and the kind of training data (:class:`~.datakind.DataKind`).

Nothing here imports another part of cselab, torch or numpy.
"""
