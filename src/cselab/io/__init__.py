"""Files in and out, for every layer: atomic writes, content digests, the readers of text and
table files, and the names of a run folder's files."""
