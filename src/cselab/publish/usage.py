"""The model card's usage snippets: the model loaded with sentence-transformers, with
``transformers`` alone, and with cselab, each giving the vectors the model was trained to give.

The ``transformers`` snippet spells out the inference pooler from its one definition
(:data:`cselab.model.pooling.POOLER_MEANINGS`). Every snippet starts with the line
``model_id = "..."``, which :func:`cselab.publish.card.set_model_id` rewrites (e.g. on push).
"""

from __future__ import annotations

from ..model.config import ModelConfig
from ..model.pooling import LAST_LAYER, POOLER_MEANINGS, inference_pooler_name


def _pooling_lines(kind: str) -> str:
    """``transformers`` code turning ``out`` (and ``batch``) into ``vectors`` as pooler ``kind``."""
    meaning = POOLER_MEANINGS[kind]
    if meaning.token == "cls":
        pool = "vectors = out.last_hidden_state[:, 0]  # the [CLS] token"
        if meaning.head:
            pool += (
                "\n# the MLP head trained with the model: tanh(W h + b)\n"
                "from pathlib import Path\n"
                "from huggingface_hub import snapshot_download\n"
                "from safetensors.torch import load_file\n\n"
                "folder = model_id if Path(model_id).is_dir() else snapshot_download(model_id)\n"
                'head = load_file(f"{folder}/2_Dense/model.safetensors")\n'
                'vectors = torch.tanh(vectors @ head["linear.weight"].T + head["linear.bias"])'
            )
        return pool
    if meaning.layers == LAST_LAYER:
        layers = "out.last_hidden_state"
    else:
        summed = " + ".join(f"out.hidden_states[{i}]" for i in meaning.layers)
        layers = f"({summed}) / {len(meaning.layers)}"
    return (
        f"hidden = {layers}\n"
        'mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)\n'
        "vectors = (hidden * mask).sum(1) / mask.sum(1)  # mean over real tokens"
    )


def usage_snippets(model_id: str, model: ModelConfig) -> str:
    """Snippets that run as written (tested by executing them against a saved model)."""
    kind = inference_pooler_name(model.pooler, model.mlp_only_train)
    st = f'''```python
model_id = "{model_id}"
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(model_id)
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
embeddings = model.encode(sentences)
print(embeddings.shape, model.similarity(embeddings, embeddings))
```'''
    hidden = ", output_hidden_states=True" if POOLER_MEANINGS[kind].layers != LAST_LAYER else ""
    hf = f'''```python
model_id = "{model_id}"
import torch
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModel.from_pretrained(model_id).eval()
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
with torch.no_grad():
    out = model(**batch{hidden})
{_pooling_lines(kind)}
cosine = torch.nn.functional.normalize(vectors, dim=-1) @ torch.nn.functional.normalize(vectors, dim=-1).T
print(vectors.shape, cosine)
```'''
    cs = f'''```python
model_id = "{model_id}"
import cselab

model = cselab.load(model_id)
vectors = model.encode(["A man is playing a guitar.", "Someone is playing music."])
print(vectors.shape)
```'''
    return (
        f"With sentence-transformers (pooling `{kind}`, as trained):\n\n{st}\n\n"
        f"With `transformers` only:\n\n{hf}\n\n"
        f"With cselab:\n\n{cs}"
    )
