"""The foundation every layer may import: the version, the user-error types and typed config loading.

Nothing here imports another part of cselab, torch or numpy.
"""
