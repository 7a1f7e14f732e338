"""The model layer: a Hugging Face encoder plus pooling, loaded from the Hub or a folder.

:mod:`.encoder` gathers the public names: :class:`~cselab.model.sentence_encoder.SentenceEncoder`
(the model), :func:`~cselab.model.loader.load` (opening any model folder), batched inference
(:mod:`.inference`) and the saved folder (:mod:`.st_folder`). Below them: :mod:`.pooling` (how a
sentence vector is read), :mod:`.unpad`, :mod:`.attention` and :mod:`.dropout` (the CPU fast
path, a model setting: ``model.fast_path``), :mod:`.hf_models` (what cselab reads from models
it did not train) and :mod:`.hub` (where models and corpora come from). Nothing here knows about
objectives or training.
"""
