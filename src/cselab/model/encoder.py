"""The model layer's public names, gathered from their homes.

``from cselab.model.encoder import SentenceEncoder, load`` is how the rest of cselab and its
users reach a model. Each job has its own module:

* :mod:`.sentence_encoder`: :class:`SentenceEncoder` (backbone + pooler; building, forward,
  tokenising, saving);
* :mod:`.inference`: batched ``encode`` and the bf16 inference copy (:data:`PRECISIONS`);
* :mod:`.st_folder`: the saved folder (Hugging Face + sentence-transformers + ``cselab.json``)
  and what a sentence-transformers folder says about inference;
* :mod:`.loader`: :func:`load`, opening a folder of any kind;
* :mod:`.dropout`: :func:`dropout_disabled` (ImSimCSE's off-dropout view);
* :mod:`.unpad`: :func:`compile_encoder` (``train.compile``: the packed forward as one graph).
"""

from __future__ import annotations

from .dropout import dropout_disabled
from .inference import PRECISIONS
from .loader import load
from .sentence_encoder import SentenceEncoder
from .st_folder import CSELAB_FILE, HEAD_FILE
from .unpad import compile_encoder

__all__ = [
    "CSELAB_FILE",
    "HEAD_FILE",
    "PRECISIONS",
    "SentenceEncoder",
    "compile_encoder",
    "dropout_disabled",
    "load",
]
