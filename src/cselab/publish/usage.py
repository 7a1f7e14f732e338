"""The model card's usage snippets: the model loaded with sentence-transformers, with
``transformers`` alone, and with cselab, each giving the vectors the model was trained to give.

The ``transformers`` snippet spells out the inference pooler from its one definition
(:data:`cselab.model.pooling.POOLER_MEANINGS`). Every snippet starts with the line
``model_id = "..."``, which :func:`cselab.publish.card.set_model_id` rewrites (e.g. on push).
"""

from __future__ import annotations

from ..model.config import ModelConfig
from ..model.pooling import LAST_LAYER, POOLER_MEANINGS, inference_pooler_name
from ..model.st_folder import BIDIRECTIONAL_NOT_REPRODUCED, PROMPT_NOT_REPRODUCED

#: cselab's ``prompt`` pooler (PromptBERT) with ``transformers`` alone: the card's snippet and
#: docs/objectives.md show this function as written (tested to give ``cselab.load``'s vectors).
PROMPT_RECIPE = '''import torch


def prompt_vectors(model, tokenizer, sentences, template, denoise=False, max_length=512):
    """cselab's pooler "prompt" (PromptBERT) with transformers alone, a sentence at a time.

    template: cselab.json's prompt.template; denoise: its prompt.denoise_inference;
    max_length: sentence_bert_config.json's max_seq_length (the sentence with [CLS] and [SEP]).
    """
    before, after = template.replace("[MASK]", tokenizer.mask_token).split("[X]")
    prefix = tokenizer(before, add_special_tokens=False)["input_ids"]
    suffix = tokenizer(after, add_special_tokens=False)["input_ids"]
    alone = [tokenizer.cls_token_id, *prefix, *suffix, tokenizer.sep_token_id]
    at = alone.index(tokenizer.mask_token_id)  # the [MASK] column of the template alone
    cut = 1 + len(prefix)  # where the sentence goes
    vectors = []
    with torch.no_grad():
        for sentence in sentences:
            ids = tokenizer(sentence, truncation=True, max_length=max_length)["input_ids"][1:-1]
            row = torch.tensor([alone[:cut] + ids + alone[cut:]])
            where = at if at < cut else at + len(ids)
            vector = model(input_ids=row).last_hidden_state[0, where]
            if denoise:  # the template alone, its positions after the sentence shifted by len(ids)
                positions = torch.arange(len(alone))
                positions[cut:] += len(ids)
                # a mask of ones: without one, transformers reads the jump in the positions as
                # the start of a second, packed sequence and masks attention across it
                noise = model(input_ids=torch.tensor([alone]), position_ids=positions[None],
                              attention_mask=torch.ones(1, len(alone), dtype=torch.long))
                vector = vector - noise.last_hidden_state[0, at]
            vectors.append(vector)
    return torch.stack(vectors)
'''


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
    if meaning.token == "lasttoken":
        return (
            'mask = batch["attention_mask"]\n'
            "last = mask.shape[1] - 1 - mask.flip(1).argmax(1)  # the last real token\n"
            "vectors = out.last_hidden_state[torch.arange(len(last)), last]"
        )
    if meaning.token == "weightedmean":
        return (
            'mask = batch["attention_mask"].to(out.last_hidden_state.dtype)\n'
            "weights = mask.cumsum(1) * mask  # SGPT: the i-th real token weighs i\n"
            "weights = weights / weights.sum(1, keepdim=True)\n"
            "vectors = (out.last_hidden_state * weights.unsqueeze(-1)).sum(1)"
        )
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


def pooling_words(model: ModelConfig) -> str:
    """What the inference pooler of ``model`` computes, in words (the card's usage line)."""
    kind = inference_pooler_name(model.pooler, model.mlp_only_train)
    summary = POOLER_MEANINGS[kind].summary
    if kind != model.pooler:  # cls with mlp_only_train: the head served training only
        return (
            f"{summary}, pooling `{kind}`: trained with pooler `{model.pooler}`, whose MLP head "
            "was used in training only (`mlp_only_train`, as in SimCSE)"
        )
    return f"{summary}, pooling `{kind}`, as trained"


def _load_lines(adapters_base: str | None, config: str = "") -> str:
    """``transformers`` code loading ``model_id`` as ``model`` (``config``: the keyword passing
    a changed config); a folder of LoRA adapters: its base model, then the adapters (``peft``)."""
    if adapters_base is None:
        return f"model = AutoModel.from_pretrained(model_id{config}).eval()"
    return (
        "from peft import PeftModel\n\n"
        "# the folder holds LoRA adapters: its base model first, then them\n"
        f"model = AutoModel.from_pretrained({adapters_base!r}{config})\n"
        "model = PeftModel.from_pretrained(model, model_id).eval()"
    )


def usage_snippets(model_id: str, model: ModelConfig, adapters_base: str | None = None) -> str:
    """Snippets that run as written (tested by executing them against a saved model).
    ``adapters_base``: the folder holds LoRA adapters on that base model."""
    kind = inference_pooler_name(model.pooler, model.mlp_only_train)
    if POOLER_MEANINGS[kind].token == "mask":
        return _prompt_snippets(model_id, model)
    if model.bidirectional:
        return _bidirectional_snippets(model_id, kind, adapters_base)
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
{_load_lines(adapters_base)}
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
with torch.no_grad():
    out = model(**batch{hidden})
{_pooling_lines(kind)}
cosine = torch.nn.functional.normalize(vectors, dim=-1) @ torch.nn.functional.normalize(vectors, dim=-1).T
print(vectors.shape, cosine)
```'''
    return (
        f"With sentence-transformers ({pooling_words(model)}):\n\n{st}\n\n"
        f"With `transformers` only:\n\n{hf}\n\n"
        f"With cselab:\n\n{_cselab_snippet(model_id)}"
    )


def _bidirectional_snippets(model_id: str, kind: str, adapters_base: str | None) -> str:
    """A decoder trained without its causal mask (LLM2Vec): sentence-transformers through
    cselab's module (:data:`~cselab.model.st_folder.ENCODER_MODULE`), cselab, or
    ``transformers`` with the two switches cselab sets
    (``cselab.model.backbones.make_bidirectional``)."""
    config_of = "model_id" if adapters_base is None else repr(adapters_base)
    hf = f'''```python
model_id = "{model_id}"
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

config = AutoConfig.from_pretrained({config_of})
config.is_causal = False  # the mask builders build the padding-only mask
tokenizer = AutoTokenizer.from_pretrained(model_id)
tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
{_load_lines(adapters_base, ", config=config")}
for module in model.modules():  # and no attention module applies its own causal flag
    if isinstance(getattr(module, "is_causal", None), bool):
        module.is_causal = False
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
with torch.no_grad():
    out = model(**batch)
{_pooling_lines(kind)}
print(vectors.shape)
```'''
    return (
        f"With sentence-transformers and cselab installed ({BIDIRECTIONAL_NOT_REPRODUCED}):\n\n"
        f"{_st_module_snippet(model_id)}\n\nWith cselab:\n\n{_cselab_snippet(model_id)}\n\n"
        f"With `transformers` only (the causal mask removed as cselab does):\n\n{hf}"
    )


def _st_module_snippet(model_id: str) -> str:
    """sentence-transformers loading a folder whose one module is cselab's encoder."""
    return f'''```python
model_id = "{model_id}"
from sentence_transformers import SentenceTransformer

# the folder's module is cselab's own (pip install cselab); trust_remote_code lets it be imported
model = SentenceTransformer(model_id, trust_remote_code=True)
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
embeddings = model.encode(sentences)
print(embeddings.shape, model.similarity(embeddings, embeddings))
```'''


def _cselab_snippet(model_id: str) -> str:
    return f'''```python
model_id = "{model_id}"
import cselab

model = cselab.load(model_id)
vectors = model.encode(["A man is playing a guitar.", "Someone is playing music."])
print(vectors.shape)
```'''


def _prompt_snippets(model_id: str, model: ModelConfig) -> str:
    """The ``prompt`` pooler: sentence-transformers through cselab's module, cselab, or
    ``transformers`` with :data:`PROMPT_RECIPE`."""
    p = model.prompt
    hf = f'''```python
model_id = "{model_id}"
from transformers import AutoModel, AutoTokenizer

{PROMPT_RECIPE}
tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModel.from_pretrained(model_id).eval()
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
vectors = prompt_vectors(model, tokenizer, sentences, {p.template!r}, denoise={p.denoise_inference})
print(vectors.shape)
```'''
    return (
        f"With sentence-transformers and cselab installed ({PROMPT_NOT_REPRODUCED}):\n\n"
        f"{_st_module_snippet(model_id)}\n\n"
        f"With cselab:\n\n{_cselab_snippet(model_id)}\n\n"
        f"With `transformers` only (PromptBERT's template around each sentence):\n\n{hf}"
    )


def prompt_usage(
    model_id: str, model: ModelConfig, counts: dict[str, dict[str, int]] | None = None
) -> str:
    """The card's part on the model's named prompts (``model.prompts``): what each is, whether
    the pooling reads its tokens, and how to use them; empty for a model without prompts.
    ``counts``: the folder's ``prompt_counts`` (:func:`~cselab.model.st_folder.prompt_count_differences`),
    the prompts whose sentence-transformers vectors differ from cselab's, said after."""
    if not model.prompts:
        return ""
    rows = "\n".join(f"| `{name}` | `{text!r}` |" for name, text in model.prompts.items())
    default = model.default_prompt_name
    template = POOLER_MEANINGS[inference_pooler_name(model.pooler, model.mlp_only_train)]
    template_read = template.token == "mask"  # the vector is a template's [MASK] state
    pooled = (
        "the model reads them with the sentence inside its template"
        if template_read
        else "their tokens are pooled with the sentence's"
        if model.pool_prompt
        else "their tokens are left out of the pooling (sentence-transformers' "
        "`include_prompt=False`)"
    )
    # the folder's module is cselab's own for these (st_folder): sentence-transformers needs it
    remote = ", trust_remote_code=True" if template_read or model.bidirectional else ""
    first = next(iter(model.prompts))
    return f"""

### Prompts

The model was trained to read its texts after a prompt; give each text its prompt by name
({pooled}{f"; `{default}` is used when none is named" if default else ""}):

| name | text |
| --- | --- |
{rows}

```python
model_id = "{model_id}"
import cselab

model = cselab.load(model_id)
vectors = model.encode(["A man is playing a guitar."], prompt_name={first!r})
print(vectors.shape)
```

sentence-transformers reads the same prompts from `config_sentence_transformers.json`:
`SentenceTransformer(model_id{remote}).encode(texts, prompt_name={first!r})`.{_count_note(counts)}"""


def _count_note(counts: dict[str, dict[str, int]] | None) -> str:
    """The card's sentence on prompts sentence-transformers counts differently (none: empty)."""
    if not counts:
        return ""
    each = "; ".join(
        f"`{name}` as {c['sentence_transformers']} tokens where the model was trained with "
        f"{c['cselab']}"
        for name, c in counts.items()
    )
    return (
        f"\n\n**Its vectors with these prompts differ from the trained model's**: it counts a "
        f"prompt as the prompt tokenised alone ({each}), and its `include_prompt=False` pooling "
        "then leaves the text's first tokens out as well. Encode with cselab "
        "(`cselab.load(model_id)`) for the vectors the model was trained and evaluated with."
    )
