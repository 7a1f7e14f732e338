"""The package version (a leaf: the CLI, the model card and the Hub commit message read it)."""

__version__ = "0.1.0"
