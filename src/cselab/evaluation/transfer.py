"""Transfer tasks with SentEval's protocol: logistic regression on frozen sentence vectors.

What is reproduced (sources in ``docs/evaluation.md``):

* the classifier of SentEval ``senteval/tools/classifier.py`` with ``nhid=0``: one
  ``nn.Linear`` (PyTorch default init after ``torch.manual_seed(seed)``), cross-entropy with
  mean reduction (SentEval sets ``size_average = False`` *after* building the loss, which has no
  effect on PyTorch >= 1.0, the versions SimCSE ran), L2 penalty as the optimizer's
  ``weight_decay`` on weight and bias, batches from ``np.random.permutation`` after
  ``np.random.seed(seed)``, early stopping on dev accuracy every ``epoch_size`` passes
  (stop after ``tenacity + 1`` non-improvements in total), at most 200 epochs, best model kept;
* the validation schemes of ``senteval/tools/validation.py``: nested k-fold (MR, CR, SUBJ,
  MPQA), k-fold on train then test (TREC, MRPC), train/dev/test (SST-2); L2 grid
  ``10**-5 .. 10**-2``; folds of scikit-learn's ``StratifiedKFold(shuffle=True,
  random_state=1111)`` (>= 0.22 algorithm, re-implemented here);
* each task's sample order (SentEval sorts by token count, then label, before encoding; the
  order decides the folds and the batches).

The classifier is trained in NumPy with the analytic gradient (no autograd) and all L2 values of
the grid in lockstep (they share the seed, so they see the same batches): the same arithmetic
as SentEval's loop, much faster on CPU.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import datasets
from .embed import EmbeddingCache
from .names import TRANSFER_TASKS

log = logging.getLogger(__name__)

L2_GRID = tuple(10.0**t for t in range(-5, -1))  # SentEval, usepytorch=True
SEED = 1111


@dataclass(frozen=True)
class ClassifierConfig:
    """SentEval ``params['classifier']`` + ``kfold``.

    ``test`` and ``fasttest`` are SimCSE ``evaluation.py``'s two settings (``dev`` mode uses
    the fast one, as SimCSE does).
    """

    optim: str = "adam"
    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200
    kfold: int = 10
    seed: int = SEED


TEST_CONFIG = ClassifierConfig(optim="adam", batch_size=64, tenacity=5, epoch_size=4, kfold=10)
FAST_CONFIG = ClassifierConfig(optim="rmsprop", batch_size=128, tenacity=3, epoch_size=2, kfold=5)


def config_for_mode(mode: str) -> ClassifierConfig:
    """``test`` -> full SentEval setting; ``fasttest`` / ``dev`` -> SimCSE's fast setting."""
    if mode == "test":
        return TEST_CONFIG
    if mode in ("fasttest", "dev"):
        return FAST_CONFIG
    raise ValueError(f"unknown mode {mode!r}; expected test, dev or fasttest")


# --------------------------------------------------------------------------------------------
# folds


def stratified_kfold(
    y: np.ndarray, n_splits: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Folds of scikit-learn's ``StratifiedKFold(n_splits, shuffle=True, random_state=seed)``.

    The algorithm of scikit-learn >= 0.22: classes are numbered by first appearance; the
    number of test samples of each class per fold comes from dealing the class-sorted labels
    round-robin over the folds; each class's fold labels are laid out in blocks and shuffled by
    one ``RandomState(seed)`` (in class order); fold ``i`` is test where the label is ``i``.
    """
    y = np.asarray(y)
    _, first, inverse = np.unique(y, return_index=True, return_inverse=True)
    # rank of each class's first occurrence = its number "by order of appearance"
    appearance = np.argsort(np.argsort(first))
    encoded = appearance[inverse.reshape(-1)]
    n_classes = len(first)
    counts = np.bincount(encoded, minlength=n_classes)
    if np.all(counts < n_splits):
        raise ValueError(f"n_splits={n_splits} is greater than the size of every class")
    dealt = np.sort(encoded)
    allocation = np.stack(
        [np.bincount(dealt[i::n_splits], minlength=n_classes) for i in range(n_splits)]
    )
    rng = np.random.RandomState(seed)
    test_fold = np.empty(len(y), dtype=np.int64)
    for k in range(n_classes):
        fold_of = np.repeat(np.arange(n_splits), allocation[:, k])
        rng.shuffle(fold_of)
        test_fold[encoded == k] = fold_of
    everything = np.arange(len(y))
    return [(everything[test_fold != i], everything[test_fold == i]) for i in range(n_splits)]


# --------------------------------------------------------------------------------------------
# the classifier


def linear_init(in_dim: int, n_classes: int, seed: int) -> np.ndarray:
    """``nn.Linear(in_dim, n_classes)`` right after ``torch.manual_seed(seed)``, as ``[W | b]``.

    The global torch RNG is restored afterwards (the trainer may call us mid-training).
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = torch.nn.Linear(in_dim, n_classes)
        weight = layer.weight.detach().numpy().astype(np.float32)
        bias = layer.bias.detach().numpy().astype(np.float32)
    return np.concatenate([weight, bias[:, None]], axis=1)  # (C, D + 1)


def _augment(x: np.ndarray) -> np.ndarray:
    """Append a column of ones so the bias is the last weight column (and is decayed too)."""
    x = np.asarray(x, dtype=np.float32)
    return np.concatenate([x, np.ones((x.shape[0], 1), dtype=np.float32)], axis=1)


class _Optimizer:
    """PyTorch's Adam / RMSprop update rules (default settings, ``weight_decay`` = L2)."""

    def __init__(self, kind: str, shape: tuple[int, ...]) -> None:
        if kind not in ("adam", "rmsprop"):
            raise ValueError(f"unsupported optimizer {kind!r} (SentEval settings use adam/rmsprop)")
        self.kind = kind
        self.step_count = 0
        self.m = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)

    def keep(self, rows: np.ndarray) -> None:
        self.m = self.m[rows]
        self.v = self.v[rows]

    def step(self, w: np.ndarray, grad: np.ndarray) -> None:
        self.step_count += 1
        if self.kind == "adam":  # torch.optim.Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
            b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
            self.m *= b1
            self.m += (1 - b1) * grad
            self.v *= b2
            self.v += (1 - b2) * grad * grad
            corr1 = 1 - b1**self.step_count
            corr2 = 1 - b2**self.step_count
            denom = np.sqrt(self.v) / np.float32(np.sqrt(corr2)) + np.float32(eps)
            w -= np.float32(lr / corr1) * self.m / denom
        else:  # torch.optim.RMSprop(lr=1e-2, alpha=0.99, eps=1e-8)
            alpha, lr, eps = 0.99, 1e-2, 1e-8
            self.v *= alpha
            self.v += (1 - alpha) * grad * grad
            w -= np.float32(lr) * grad / (np.sqrt(self.v) + np.float32(eps))


@dataclass
class FitResult:
    """One L2 value's outcome: best dev accuracy (fraction) and the weights that reached it."""

    l2reg: float
    dev_accuracy: float
    weights: np.ndarray  # (C, D + 1)
    epochs: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(_augment(x) @ self.weights.T, axis=1)

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(self.predict(x) == np.asarray(y))) if len(y) else float("nan")


def fit_logreg(
    x_train: np.ndarray,
    y_train: np.ndarray,
    n_classes: int,
    l2regs: Sequence[float],
    config: ClassifierConfig,
    validation: tuple[np.ndarray, np.ndarray] | None = None,
    validation_split: float | None = None,
) -> list[FitResult]:
    """SentEval ``MLP(nhid=0).fit`` for each L2 value, all trained in lockstep.

    Each L2 value is a fresh SentEval classifier with the same seed: same initial weights, same
    permutations. So one loop serves them all; a value that stops early is dropped from the
    stack. Dev data: ``validation`` or, as SentEval's ``validation_split``, the first
    ``int(split * n)`` samples of a seeded permutation.
    """
    rng = np.random.RandomState(config.seed)
    x = np.asarray(x_train, dtype=np.float32)
    y = np.asarray(y_train, dtype=np.int64)
    if validation is not None:
        x_dev, y_dev = np.asarray(validation[0], dtype=np.float32), np.asarray(validation[1])
    elif validation_split is not None:
        perm = rng.permutation(len(x))
        cut = int(validation_split * len(x))
        x_dev, y_dev = x[perm[:cut]], y[perm[:cut]]
        x, y = x[perm[cut:]], y[perm[cut:]]
    else:
        raise ValueError("give validation data or a validation_split")

    xa, xa_dev = _augment(x), _augment(x_dev)
    onehot = np.eye(n_classes, dtype=np.float32)[y]
    n_regs = len(l2regs)
    w = np.repeat(linear_init(x.shape[1], n_classes, config.seed)[None], n_regs, axis=0)
    decay = np.asarray(l2regs, dtype=np.float32)[:, None, None]
    opt = _Optimizer(config.optim, w.shape)
    active = np.arange(n_regs)  # which L2 values the stacked arrays hold
    best_acc = np.full(n_regs, -1.0)
    best_w = w.copy()
    strikes = np.zeros(n_regs, dtype=np.int64)
    epochs = np.zeros(n_regs, dtype=np.int64)
    bs = config.batch_size
    n = len(xa)
    nepoch = 0
    while len(active) and nepoch <= config.max_epoch:
        for _ in range(config.epoch_size):
            perm = rng.permutation(n)
            for start in range(0, n, bs):
                idx = perm[start : start + bs]
                xb = xa[idx]
                logits = np.matmul(xb, w.transpose(0, 2, 1))  # (R, B, C)
                logits -= logits.max(axis=2, keepdims=True)
                np.exp(logits, out=logits)
                logits /= logits.sum(axis=2, keepdims=True)
                logits -= onehot[idx]
                logits /= np.float32(len(idx))  # mean-reduced cross-entropy
                grad = np.matmul(logits.transpose(0, 2, 1), xb)  # (R, C, D + 1)
                grad += decay * w
                opt.step(w, grad)
        nepoch += config.epoch_size
        pred = np.argmax(np.matmul(xa_dev, w.transpose(0, 2, 1)), axis=2)
        acc = (pred == y_dev[None]).mean(axis=1) if len(y_dev) else np.zeros(len(active))
        keep = np.ones(len(active), dtype=bool)
        for j, r in enumerate(active):
            epochs[r] = nepoch
            if acc[j] > best_acc[r]:
                best_acc[r] = acc[j]
                best_w[r] = w[j]
            else:
                if strikes[r] >= config.tenacity:
                    keep[j] = False
                strikes[r] += 1
        if not keep.all():
            active, w, decay = active[keep], w[keep], decay[keep]
            opt.keep(keep)
    return [
        FitResult(float(l2regs[r]), float(best_acc[r]), best_w[r], int(epochs[r]))
        for r in range(n_regs)
    ]


def _pct(fraction: float) -> float:
    return round(100 * fraction, 2)


# --------------------------------------------------------------------------------------------
# validation schemes (SentEval senteval/tools/validation.py)


def l2_scores_by_kfold(
    x: np.ndarray, y: np.ndarray, n_classes: int, config: ClassifierConfig, fold_seed: int
) -> list[float]:
    """Dev accuracy (%, 2 decimals) of every ``L2_GRID`` value, averaged over a stratified
    ``config.kfold``-fold split of ``(x, y)`` drawn with ``fold_seed``: how SentEval picks the
    L2 penalty."""
    per_reg = np.zeros((len(L2_GRID), config.kfold))
    for f, (tr, te) in enumerate(stratified_kfold(y, config.kfold, fold_seed)):
        fits = fit_logreg(x[tr], y[tr], n_classes, L2_GRID, config, validation=(x[te], y[te]))
        per_reg[:, f] = [fit.dev_accuracy for fit in fits]
    return [round(100 * float(np.mean(row)), 2) for row in per_reg]


def inner_kfold(x: np.ndarray, y: np.ndarray, n_classes: int, config: ClassifierConfig) -> dict:
    """MR/CR/SUBJ/MPQA: k outer folds; in each, the L2 value is picked by an inner k-fold on
    the outer training part, then refit there (5 % held out for early stopping) and tested.

    Both fold splits use seed 1111 whatever ``config.seed`` is: SentEval's
    ``InnerKFoldClassifier`` hard-codes ``random_state=1111`` for them (its classifier and
    the other schemes' folds do follow the configured seed)."""
    dev_scores: list[float] = []
    test_scores: list[float] = []
    chosen: list[float] = []
    for train_idx, test_idx in stratified_kfold(y, config.kfold, SEED):
        x_tr, y_tr = x[train_idx], y[train_idx]
        scores = l2_scores_by_kfold(x_tr, y_tr, n_classes, config, fold_seed=SEED)
        best = int(np.argmax(scores))
        dev_scores.append(scores[best])
        chosen.append(L2_GRID[best])
        final = fit_logreg(x_tr, y_tr, n_classes, [L2_GRID[best]], config, validation_split=0.05)
        test_scores.append(_pct(final[0].accuracy(x[test_idx], y[test_idx])))
    return {
        "devacc": round(float(np.mean(dev_scores)), 2),
        "acc": round(float(np.mean(test_scores)), 2),
        "fold_acc": test_scores,
        "fold_devacc": dev_scores,
        "l2reg": chosen,
    }


def kfold_then_test(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    n_classes: int,
    config: ClassifierConfig,
) -> dict:
    """TREC/MRPC: pick the L2 value by k-fold on train, refit on all train (5 % held out for
    early stopping), report test accuracy and the test predictions."""
    scores = l2_scores_by_kfold(x_train, y_train, n_classes, config, fold_seed=config.seed)
    best = int(np.argmax(scores))
    final = fit_logreg(x_train, y_train, n_classes, [L2_GRID[best]], config, validation_split=0.05)
    yhat = final[0].predict(x_test)
    return {
        "devacc": scores[best],
        "acc": _pct(float(np.mean(yhat == y_test))),
        "l2reg": L2_GRID[best],
        "l2_scores": dict(zip(map(str, L2_GRID), scores, strict=True)),
        "yhat": yhat,
    }


def train_dev_test(
    x: dict[str, np.ndarray], y: dict[str, np.ndarray], n_classes: int, config: ClassifierConfig
) -> dict:
    """SST-2: train on train for each L2 value with dev early stopping, pick by dev accuracy,
    report test accuracy. (SentEval refits the chosen value with the same seed and data, which
    reproduces the same model; the lockstep run already holds it.)"""
    fits = fit_logreg(
        x["train"], y["train"], n_classes, L2_GRID, config, validation=(x["dev"], y["dev"])
    )
    scores = [_pct(fit.dev_accuracy) for fit in fits]
    best = int(np.argmax(scores))
    return {
        "devacc": scores[best],
        "acc": _pct(fits[best].accuracy(x["test"], y["test"])),
        "l2reg": L2_GRID[best],
        "l2_scores": dict(zip(map(str, L2_GRID), scores, strict=True)),
    }


def f1_binary(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """F1 of class 1 (scikit-learn's ``f1_score`` default, as SentEval's MRPC)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    tp = float(np.sum((y_pred == 1) & (y_true == 1)))
    fp = float(np.sum((y_pred == 1) & (y_true == 0)))
    fn = float(np.sum((y_pred == 0) & (y_true == 1)))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


# --------------------------------------------------------------------------------------------
# tasks


def _ntok(sentence: str) -> int:
    return len(sentence.split())


def _sorted_sentences(data: datasets.LabelledSentences) -> tuple[list[str], np.ndarray]:
    """SentEval's order: stable sort by (token count, label)."""
    order = sorted(range(len(data)), key=lambda i: (_ntok(data.sentences[i]), data.labels[i]))
    return [data.sentences[i] for i in order], data.labels[order]


def _sorted_pairs(data: datasets.LabelledPairs) -> tuple[list[str], list[str], np.ndarray]:
    """SentEval MRPC order: stable sort by (tokens of A, tokens of B, label)."""
    order = sorted(
        range(len(data)),
        key=lambda i: (_ntok(data.sent1[i]), _ntok(data.sent2[i]), data.labels[i]),
    )
    return [data.sent1[i] for i in order], [data.sent2[i] for i in order], data.labels[order]


def _binary(cache: EmbeddingCache, task: str, data_dir: Path, config: ClassifierConfig) -> dict:
    sentences, labels = _sorted_sentences(datasets.load_binary(task, data_dir))
    x = cache.embed(sentences)
    res = inner_kfold(x, labels, 2, config)
    return {**res, "ndev": len(labels), "ntest": len(labels)}


def _sst2(cache: EmbeddingCache, data_dir: Path, config: ClassifierConfig) -> dict:
    x: dict[str, np.ndarray] = {}
    y: dict[str, np.ndarray] = {}
    for split in ("train", "dev", "test"):
        sentences, y[split] = _sorted_sentences(datasets.load_sst2(split, data_dir))
        x[split] = cache.embed(sentences)
    res = train_dev_test(x, y, 2, config)
    return {**res, "ndev": len(y["dev"]), "ntest": len(y["test"])}


def _trec(cache: EmbeddingCache, data_dir: Path, config: ClassifierConfig) -> dict:
    s_tr, y_tr = _sorted_sentences(datasets.load_trec("train", data_dir))
    s_te, y_te = _sorted_sentences(datasets.load_trec("test", data_dir))
    res = kfold_then_test(cache.embed(s_tr), y_tr, cache.embed(s_te), y_te, 6, config)
    res.pop("yhat")
    return {**res, "ndev": len(y_tr), "ntest": len(y_te)}


def _mrpc(cache: EmbeddingCache, data_dir: Path, config: ClassifierConfig) -> dict:
    feats: dict[str, np.ndarray] = {}
    labels: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        a_s, b_s, labels[split] = _sorted_pairs(datasets.load_mrpc(split, data_dir))
        a, b = cache.embed(a_s), cache.embed(b_s)
        feats[split] = np.concatenate([np.abs(a - b), a * b], axis=1)  # SentEval's [|u-v|, u*v]
    res = kfold_then_test(feats["train"], labels["train"], feats["test"], labels["test"], 2, config)
    res["f1"] = _pct(f1_binary(labels["test"], res.pop("yhat")))
    return {**res, "ndev": len(labels["train"]), "ntest": len(labels["test"])}


_RUNNERS: dict[str, Callable[[EmbeddingCache, Path, ClassifierConfig], dict]] = {
    **{t: (lambda c, d, cfg, t=t: _binary(c, t, d, cfg)) for t in datasets.BINARY_TASKS},
    "SST2": _sst2,
    "TREC": _trec,
    "MRPC": _mrpc,
}


def evaluate_transfer_task(
    cache: EmbeddingCache,
    task: str,
    data_dir: str | os.PathLike[str],
    mode: str = "test",
    config: ClassifierConfig | None = None,
) -> dict:
    """One transfer task: ``{"devacc", "acc", "ndev", "ntest", "l2reg", ...}`` (accuracies in %).

    ``config`` overrides the mode's classifier setting (tests use fewer folds).
    """
    if task not in _RUNNERS:
        raise ValueError(
            f"unknown transfer task {task!r}; expected one of {', '.join(TRANSFER_TASKS)}"
        )
    cfg = config or config_for_mode(mode)
    t0 = time.perf_counter()
    res = _RUNNERS[task](cache, Path(data_dir), cfg)
    log.info(
        "%s: acc %.2f (dev %.2f) in %.1fs",
        task,
        res["acc"],
        res["devacc"],
        time.perf_counter() - t0,
    )
    return {**res, "classifier": {**cfg.__dict__}}


__all__ = [
    "FAST_CONFIG",
    "L2_GRID",
    "TEST_CONFIG",
    "TRANSFER_TASKS",
    "ClassifierConfig",
    "FitResult",
    "config_for_mode",
    "evaluate_transfer_task",
    "f1_binary",
    "fit_logreg",
    "inner_kfold",
    "kfold_then_test",
    "l2_scores_by_kfold",
    "linear_init",
    "stratified_kfold",
    "train_dev_test",
]
