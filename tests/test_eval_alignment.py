"""Alignment and uniformity (Wang & Isola 2020) against their direct formulas."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from cselab.evaluation import alignment as au
from cselab.evaluation import datasets as ds
from cselab.evaluation.embed import EmbeddingCache


def _unit(rows):
    x = np.asarray(rows, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_alignment_direct_formula():
    x = _unit([[1, 0], [0, 1], [1, 1]])
    y = _unit([[0, 1], [0, 1], [1, -1]])
    # squared distances: |(1,-1)|^2 = 2, 0, |(0, 2/sqrt2)|^2 = 2  -> mean 4/3
    assert au.alignment(x, y) == pytest.approx(4 / 3)
    assert au.alignment(x, y, alpha=1) == pytest.approx((2**0.5 + 0 + 2**0.5) / 3)


def test_uniformity_direct_formula_and_blocks():
    x = _unit(np.random.RandomState(0).randn(37, 5))
    pairs = [
        math.exp(-2 * float(np.sum((x[i] - x[j]) ** 2)))
        for i, j in itertools.combinations(range(37), 2)
    ]
    expected = math.log(sum(pairs) / len(pairs))
    assert au.uniformity(x) == pytest.approx(expected, rel=1e-10)
    assert au.uniformity(x, block=4) == pytest.approx(expected, rel=1e-10)  # blocked sum
    # antipodal pair: distance^2 = 4 -> log(exp(-8)) = -8
    assert au.uniformity(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(-8.0)


def test_uniformity_matches_torch_pdist():
    torch = pytest.importorskip("torch")
    x = _unit(np.random.RandomState(1).randn(50, 8))
    t = torch.from_numpy(x)
    ref = torch.pdist(t, p=2).pow(2).mul(-2).exp().mean().log().item()
    assert au.uniformity(x) == pytest.approx(ref, rel=1e-9)


def test_align_uniform_on_stsb_dev_fixture(tmp_path):
    ds.clear_cache()
    folder = tmp_path / "STS" / "STSBenchmark"
    folder.mkdir(parents=True)
    rows = [("a", "b", 4.5), ("a", "c", 4.0), ("c", "d", 5.0), ("b", "d", 1.0)]
    (folder / "sts-dev.csv").write_text(
        "".join(f"g\tf\ty\t{i}\t{s}\t{p}\t{q}\n" for i, (p, q, s) in enumerate(rows))
    )
    vecs = {"a": [1, 0], "b": [1, 1], "c": [0, 1], "d": [-1, 1]}

    class Enc:
        def encode(self, sentences, batch_size=128):
            return np.array([vecs[s] for s in sentences], dtype=np.float32)

    res = au.align_uniform(EmbeddingCache(Enc()), tmp_path)
    n = {k: _unit([v])[0] for k, v in vecs.items()}
    # positives: (a,b) 4.5 and (c,d) 5.0; (a,c) at exactly 4.0 is not "> 4"
    assert res["n_pairs"] == 2 and res["n_sentences"] == 4
    assert res["alignment"] == pytest.approx(
        (np.sum((n["a"] - n["b"]) ** 2) + np.sum((n["c"] - n["d"]) ** 2)) / 2
    )
    x = np.stack([n[k] for k in "abcd"])
    assert res["uniformity"] == pytest.approx(au.uniformity(x))
    ds.clear_cache()


def test_any_array_layout_is_taken() -> None:
    """Every other row (a strided view), a Fortran-ordered and a read-only array give the
    numbers of their contiguous copies, as the numpy code before did, with no warning."""
    import warnings

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((9, 4)), rng.standard_normal((9, 4))
    frozen = y.copy()
    frozen.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for view in (x[::2], np.asfortranarray(x), x[::-1, ::-1]):
            copy = np.ascontiguousarray(view)
            assert au.uniformity(view) == pytest.approx(au.uniformity(copy), rel=1e-12)
            assert au.alignment(view[:4], frozen[:4]) == pytest.approx(
                au.alignment(copy[:4], y[:4]), rel=1e-12
            )
        assert au.uniformity(x[::2]) != pytest.approx(au.uniformity(x), rel=1e-6)  # other rows
