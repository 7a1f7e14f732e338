"""The model layer: a Hugging Face encoder plus pooling, loaded from the Hub or a folder.

:mod:`.encoder` (:class:`~cselab.model.encoder.SentenceEncoder`), :mod:`.pooling` (how a sentence
vector is read), :mod:`.unpad` (the padding-free training forward) and :mod:`.hub` (where models
and corpora come from). Nothing here knows about objectives or training.
"""
