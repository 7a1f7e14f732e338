"""Transfer protocol: folds, classifier vs a SentEval-style PyTorch loop, fasttest smoke runs."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import SENTEVAL, needs_senteval
from cselab.evaluation import datasets as ds
from cselab.evaluation import evaluate
from cselab.evaluation import transfer as tr
from cselab.evaluation.embed import EmbeddingCache
from fakes import HashingEncoder

DATA = SENTEVAL
needs_data = needs_senteval
pytestmark = pytest.mark.usefixtures("fresh_eval_cache")


@pytest.fixture
def one_torch_thread():
    """Tiny autograd steps: intra-op threads only add contention on a shared 2-core box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --------------------------------------------------------------------------------------------
# folds


@pytest.mark.parametrize(
    "y",
    [
        np.array([1] * 37 + [0] * 23),
        np.array([5, 0, 3, 3, 1, 2, 4] * 13 + [0, 1, 2]),  # 6 classes, first seen: 5
        np.random.RandomState(3).randint(0, 2, 211),
    ],
)
@pytest.mark.parametrize("k", [5, 10])
def test_stratified_kfold_equals_sklearn(y, k):
    sk = pytest.importorskip("sklearn.model_selection")
    ref = list(
        sk.StratifiedKFold(n_splits=k, shuffle=True, random_state=1111).split(np.zeros(len(y)), y)
    )
    mine = tr.stratified_kfold(y, k, 1111)
    assert len(mine) == k
    for (a_tr, a_te), (b_tr, b_te) in zip(mine, ref, strict=True):
        assert np.array_equal(a_tr, b_tr) and np.array_equal(a_te, b_te)


def test_stratified_kfold_partitions_and_stratifies():
    y = np.array([0] * 50 + [1] * 30)
    folds = tr.stratified_kfold(y, 5, 1111)
    tests = np.concatenate([te for _, te in folds])
    assert sorted(tests.tolist()) == list(range(80))
    assert all(np.bincount(y[te]).tolist() == [10, 6] for _, te in folds)


# --------------------------------------------------------------------------------------------
# classifier


def test_fold_seeds_follow_senteval(monkeypatch):
    """SentEval's nested scheme (MR/CR/SUBJ/MPQA) draws its outer and inner folds with a
    hard-coded seed 1111; the TREC/MRPC k-fold draws them with the configured seed."""
    seen: list[tuple[int, int]] = []
    real = tr.stratified_kfold

    def spy(y: np.ndarray, n_splits: int, seed: int):
        seen.append((len(y), seed))
        return real(y, n_splits, seed)

    monkeypatch.setattr(tr, "stratified_kfold", spy)
    rs = np.random.RandomState(0)
    x, y = rs.randn(30, 4).astype(np.float32), np.array([0, 1] * 15)
    cfg = replace(tr.FAST_CONFIG, kfold=3, seed=7, max_epoch=2)
    res = tr.inner_kfold(x, y, 2, cfg)
    assert len(res["fold_acc"]) == 3
    # one outer split of all 30 rows, then one inner split of each outer training part (20 rows)
    assert seen == [(30, 1111)] + [(20, 1111)] * 3
    seen.clear()
    tr.kfold_then_test(x, y, x[:5], y[:5], 2, cfg)
    assert seen == [(30, 7)]


def test_linear_init_is_torch_default_and_keeps_global_rng():
    torch.manual_seed(7)
    expected_next = torch.rand(3)
    torch.manual_seed(7)
    w = tr.linear_init(10, 3, 1111)
    assert torch.equal(torch.rand(3), expected_next)  # global RNG untouched
    torch.manual_seed(1111)
    layer = torch.nn.Linear(10, 3)
    assert np.array_equal(w[:, :10], layer.weight.detach().numpy())
    assert np.array_equal(w[:, 10], layer.bias.detach().numpy())


def senteval_fit(x, y, n_classes, l2reg, cfg, validation=None, validation_split=None):
    """SentEval's ``MLP(nhid=0).fit`` written out with torch autograd (the reference)."""
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], n_classes))
    loss_fn = torch.nn.CrossEntropyLoss()
    loss_fn.size_average = False  # what SentEval does; a no-op on torch >= 1.0
    optim = torch.optim.Adam if cfg.optim == "adam" else torch.optim.RMSprop
    opt = optim(model.parameters())
    opt.param_groups[0]["weight_decay"] = l2reg
    if validation is not None:
        (tx, ty), (dx, dy) = (x, y), validation
    else:
        perm = np.random.permutation(len(x))
        cut = int(validation_split * len(x))
        tx, ty, dx, dy = x[perm[cut:]], y[perm[cut:]], x[perm[:cut]], y[perm[:cut]]
    tx, ty = torch.tensor(tx), torch.tensor(ty)
    dx, dy = torch.tensor(dx), torch.tensor(dy)
    nepoch, best, strikes, stop, best_model = 0, -1.0, 0, False, None
    while not stop and nepoch <= cfg.max_epoch:
        for _ in range(cfg.epoch_size):
            perm = np.random.permutation(len(tx))
            for i in range(0, len(tx), cfg.batch_size):
                idx = torch.as_tensor(perm[i : i + cfg.batch_size])
                loss = loss_fn(model(tx[idx]), ty[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        nepoch += cfg.epoch_size
        with torch.no_grad():
            acc = float((model(dx).argmax(1) == dy).double().mean())
        if acc > best:
            best, best_model = acc, copy.deepcopy(model)
        else:
            if strikes >= cfg.tenacity:
                stop = True
            strikes += 1
    lin = best_model[0]
    weights = np.concatenate([lin.weight.detach().numpy(), lin.bias.detach().numpy()[:, None]], 1)
    return best, weights, nepoch


@pytest.mark.parametrize(
    "cfg",
    # max_epoch lowered to keep the autograd reference fast; the cap itself is then exercised
    [replace(tr.FAST_CONFIG, max_epoch=40), replace(tr.TEST_CONFIG, max_epoch=24)],
    ids=["fasttest", "test"],
)
def test_lockstep_numpy_fit_equals_senteval_torch_loop(cfg, one_torch_thread):
    rs = np.random.RandomState(0)
    x = rs.randn(400, 12).astype(np.float32)
    y = (x[:, 0] + 0.8 * rs.randn(400) > 0).astype(np.int64)
    x_tr, y_tr, x_dev, y_dev = x[:300], y[:300], x[300:], y[300:]
    fits = tr.fit_logreg(x_tr, y_tr, 2, tr.L2_GRID, cfg, validation=(x_dev, y_dev))
    for reg, fit in list(zip(tr.L2_GRID, fits, strict=True))[::3]:  # 1e-5 and 1e-2
        best, weights, nepoch = senteval_fit(x_tr, y_tr, 2, reg, cfg, validation=(x_dev, y_dev))
        assert fit.dev_accuracy == pytest.approx(best)
        assert fit.epochs == nepoch
        np.testing.assert_allclose(fit.weights, weights, atol=1e-5)
    # validation_split path (the final refit of the k-fold schemes), 3 classes
    y3 = np.digitize(x[:, 1], [-0.5, 0.5])
    fit = tr.fit_logreg(x, y3, 3, [1e-3], cfg, validation_split=0.05)[0]
    best, weights, nepoch = senteval_fit(x, y3, 3, 1e-3, cfg, validation_split=0.05)
    assert fit.dev_accuracy == pytest.approx(best) and fit.epochs == nepoch
    np.testing.assert_allclose(fit.weights, weights, atol=1e-5)


def test_f1_binary_matches_definition():
    y = np.array([1, 1, 1, 0, 0, 1, 0])
    p = np.array([1, 0, 1, 1, 0, 1, 0])
    tp, fp, fn = 3, 1, 1
    assert tr.f1_binary(y, p) == pytest.approx(2 * tp / (2 * tp + fp + fn))


def test_senteval_sort_order_is_stable_by_length_then_label():
    data = ds.LabelledSentences("t", ("b b", "a", "c c", "d", "e e e"), np.array([1, 1, 0, 0, 0]))
    sentences, labels = tr._sorted_sentences(data)
    assert sentences == ["d", "a", "c c", "b b", "e e e"] and labels.tolist() == [0, 1, 0, 1, 0]


# --------------------------------------------------------------------------------------------
# smoke tests (fasttest mode, subsets)


def _binary_fixture(root: Path, n: int = 150) -> None:
    """An MR folder whose label is readable from one word, so a working protocol nears 100 %."""
    rs = np.random.RandomState(0)
    words = [f"w{i}" for i in range(300)]
    mr = root / "MR"
    mr.mkdir(parents=True)
    for name, cue in (("rt-polarity.pos", "great"), ("rt-polarity.neg", "awful")):
        lines = [" ".join([*rs.choice(words, rs.randint(3, 12)), cue]) for _ in range(n)]
        (mr / name).write_text("\n".join(lines) + "\n", encoding="latin-1")


def test_fasttest_binary_task_learns_a_readable_label(tmp_path):
    _binary_fixture(tmp_path)
    cfg = tr.FAST_CONFIG
    res = tr.evaluate_transfer_task(
        EmbeddingCache(HashingEncoder(dim=32)), "MR", tmp_path, "fasttest"
    )
    assert res["ndev"] == res["ntest"] == 300
    assert len(res["fold_acc"]) == cfg.kfold and set(res["l2reg"]) <= set(tr.L2_GRID)
    assert res["acc"] > 90 and res["devacc"] > 90
    assert res["acc"] == round(float(np.mean(res["fold_acc"])), 2)


@needs_data
def test_fasttest_smoke_on_real_subsets(tmp_path):
    """TREC and MRPC on real files (first 600 training lines), fasttest, through ``evaluate``."""
    for rel in ("TREC/train_5500.label", "MRPC/msr_paraphrase_train.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(DATA / rel, "rb") as f:
            head = b"".join(f.readline() for _ in range(600))
        (tmp_path / rel).write_bytes(head)
    for rel in ("TREC/TREC_10.label", "MRPC/msr_paraphrase_test.txt"):
        (tmp_path / rel).write_bytes((DATA / rel).read_bytes())
    out = evaluate(HashingEncoder(dim=32), tasks="TREC,MRPC", mode="fasttest", data_dir=tmp_path)
    trec, mrpc = out["results"]["TREC"], out["results"]["MRPC"]
    assert (trec["ndev"], trec["ntest"]) == (600, 500)
    assert (mrpc["ndev"], mrpc["ntest"]) == (599, 1725)
    assert 100 / 6 < trec["acc"] <= 100 and 0 < mrpc["f1"] <= 100
    assert trec["classifier"]["optim"] == "rmsprop" and trec["classifier"]["kfold"] == 5
    assert out["headline"]["transfer"]["TREC"] == trec["acc"]
    assert out["headline"]["transfer"]["Avg"] is None  # not all 7 tasks


def test_dev_mode_reports_dev_accuracy(tmp_path):
    _binary_fixture(tmp_path, n=60)
    out = evaluate(HashingEncoder(dim=16), tasks="MR", mode="dev", data_dir=tmp_path)
    assert out["headline"]["transfer"]["MR"] == out["results"]["MR"]["devacc"]
