"""Your own STS-format pairs: formats, one-line errors, the score, training and `cselab evaluate`."""

from __future__ import annotations

import csv
import json
import math
import zlib
from pathlib import Path

import numpy as np
import pytest

from cselab.config.devset import DEV_COLUMNS
from cselab.evaluation import custom
from cselab.evaluation.datasets import DataFormatError, MissingDataError, load_stsb
from cselab.evaluation.sts import stsb_dev_spearman

PAIRS = [
    ("a man plays a guitar", "a person plays music", 4.2),
    ('she said "no" twice', "she refused, twice", 3.0),
    ("the cat sleeps", "a dog barks", 0.4),
    ("rain falls", "it is raining", 4.8),
    ("stocks fell", "markets dropped sharply", 3.9),
    ("a child reads", "the sun is hot", 0.0),
]


def bag_of_words(sentences: list[str]) -> np.ndarray:
    """A deterministic stand-in encoder: hashed word counts (64 dims)."""
    out = np.zeros((len(sentences), 64))
    for i, s in enumerate(sentences):
        for w in s.split():
            out[i, zlib.crc32(w.encode()) % 64] += 1.0
    return out


def write(path: Path, rows: list[tuple[str, str, float]], cols: tuple[str, str, str]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(dict(zip(cols, r, strict=True))) + "\n" for r in rows))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", *cols])
            w.writerows([(i, *r) for i, r in enumerate(rows)])
    else:  # TSV: plain tab-joined text, quotes written as they are
        lines = ["\t".join(["id", *cols])]
        lines += ["\t".join(map(str, (i, *r))) for i, r in enumerate(rows)]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl", "dataset"])
def test_every_format_reads_the_same_pairs(
    suffix: str, tmp_path: Path, fresh_eval_cache: None
) -> None:
    cols = ("left", "right", "gold")
    if suffix == "dataset":
        datasets = pytest.importorskip("datasets")
        path = tmp_path / "pairs_ds"
        data = {c: [r[i] for r in PAIRS] for i, c in enumerate(cols)}
        datasets.DatasetDict({"validation": datasets.Dataset.from_dict(data)}).save_to_disk(path)
    else:
        path = write(tmp_path / f"pairs{suffix}", PAIRS, cols)
    pairs = custom.read_sts_file(path, cols)
    assert list(zip(pairs.sent1, pairs.sent2, pairs.scores.tolist(), strict=True)) == PAIRS
    # the sentence with quotes and the one with a comma survive TSV and CSV quoting alike
    assert pairs.sent1[1] == 'she said "no" twice' and pairs.sent2[1] == "she refused, twice"


def test_file_score_is_cosine_correlation_and_equals_stsb_dev(
    tmp_path: Path, senteval_dir: Path, fresh_eval_cache: None
) -> None:
    stsb = load_stsb("dev", senteval_dir)
    path = write(
        tmp_path / "stsb_dev.tsv",
        list(zip(stsb.sent1, stsb.sent2, stsb.scores.tolist(), strict=True)),
        DEV_COLUMNS,
    )
    spearman = custom.dev_evaluator(str(path), "spearman")
    assert spearman.name == "dev_spearman"
    # the same pairs score exactly as the built-in STS-B dev evaluation
    assert spearman(bag_of_words) == stsb_dev_spearman(bag_of_words, senteval_dir)
    # Pearson, by hand: cosine per pair in a loop, then the textbook formula
    pairs = custom.read_sts_file(path)
    a, b = bag_of_words(list(pairs.sent1)), bag_of_words(list(pairs.sent2))
    cos = [
        sum(x * y for x, y in zip(u, v, strict=True))
        / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)) or math.inf)
        for u, v in zip(a, b, strict=True)
    ]
    g = pairs.scores.tolist()
    mc, mg = sum(cos) / len(cos), sum(g) / len(g)
    num = sum((c - mc) * (x - mg) for c, x in zip(cos, g, strict=True))
    den = math.sqrt(sum((c - mc) ** 2 for c in cos) * sum((x - mg) ** 2 for x in g))
    pearson = custom.dev_evaluator(str(path), "pearson")
    assert pearson.name == "dev_pearson"
    assert pearson(bag_of_words) == pytest.approx(100 * num / den, rel=1e-9)
    assert custom.dev_evaluator("none") is None
    assert custom.dev_evaluator("stsb").name == "stsb_dev"


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("h.tsv", "id\ts1\tsentence2\tscore\n", r"h\.tsv:1: no column 'sentence1' in the header"),
        ("s.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\td\tabc\n",
         r"s\.tsv:3: column 'score': 'abc' is not a finite number"),
        ("n.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\td\tnan\n",
         r"n\.tsv:3: column 'score': 'nan' is not a finite number"),
        ("e.csv", "sentence1,sentence2,score\na,b,1\n\" \",d,2\n",
         r"e\.csv:3: column 'sentence1' is empty"),
        ("m.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\n",
         r"m\.tsv:3: column 'sentence2' is missing"),
        ("j.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 1}\n{"sentence1": "a"\n',
         r"j\.jsonl:2: invalid JSON"),
        ("k.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 1}\n\n{"sentence1": "a", "score": 2}\n',
         r"k\.jsonl:3: column 'sentence2' is missing"),
        ("b.jsonl", '{"sentence1": "a", "sentence2": "b", "score": true}\n',
         r"b\.jsonl:1: column 'score': True is not a finite number"),
        ("few.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\td\t2\n",
         r"few\.tsv: 2 scored pairs; at least 5 are needed"),
        ("c.tsv", "sentence1\tsentence2\tscore\n" + "a\tb\t3\n" * 6,
         r"c\.tsv: every score in column 'score' is 3: no correlation"),
        ("x.txt", "whatever\n", r"x\.txt: unknown format"),
    ],
)  # fmt: skip
def test_bad_files_are_one_line_errors_naming_file_line_and_column(
    name: str, content: str, needle: str, tmp_path: Path, fresh_eval_cache: None
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataFormatError, match=needle) as info:
        custom.read_sts_file(path)
    assert "\n" not in str(info.value)


def test_bad_dataset_folders(tmp_path: Path, fresh_eval_cache: None) -> None:
    datasets = pytest.importorskip("datasets")
    with pytest.raises(MissingDataError, match="STS file not found"):
        custom.read_sts_file(tmp_path / "nothing")
    rows = {"sentence1": ["a"] * 6, "sentence2": ["b"] * 6, "score": [1, 2, None, 4, 5, 6]}
    ds = datasets.Dataset.from_dict(rows)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(tmp_path / "two")
    with pytest.raises(DataFormatError, match=r"splits train, test; point at one split's folder"):
        custom.read_sts_file(tmp_path / "two")
    with pytest.raises(DataFormatError, match=r"train: row 2: column 'score' is missing"):
        custom.read_sts_file(tmp_path / "two" / "train")
    with pytest.raises(
        DataFormatError, match=r"no column 'label' \(the dataset has columns: sentence1"
    ):
        custom.read_sts_file(tmp_path / "two" / "train", ["sentence1", "sentence2", "label"])


# ------------------------------------------------------------------------------------------
# Model selection during training, and `cselab evaluate --sts-file`


def test_training_selects_on_a_dev_file_and_validates_it_first(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, fresh_eval_cache: None
) -> None:
    from conftest import write_corpus
    from cselab.cli import main

    corpus = write_corpus(tmp_path)
    dev = write(tmp_path / "dev.tsv", PAIRS, ("a", "b", "sim"))
    common = [
        "train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
        f"--data.cache_dir={tmp_path / 'cache'}", "--train.batch_size=8", "--train.max_steps=4",
        "--train.eval_steps=2", f"--eval.dev={dev}",
    ]  # fmt: skip
    # wrong column names: one line, before the corpus is tokenised
    out_bad = tmp_path / "bad"
    assert main([*common, f"--train.output_dir={out_bad}"]) == 2
    err = capsys.readouterr().err
    assert f"cselab train: error: {dev}:1: no column 'sentence1' in the header" in err
    assert not (tmp_path / "cache").exists() and not out_bad.exists()

    out = tmp_path / "out"
    # metric names are case-insensitive, as retrieval's NDCG@10 always was (issue 31)
    argv = [*common, "--eval.dev_columns=[a,b,sim]", "--eval.dev_metric=Pearson"]
    assert main([*argv, f"--train.output_dir={out}"]) == 0
    assert f"dev_pearson ({dev}): before" in capsys.readouterr().out
    with (out / "metrics.csv").open() as fh:
        logged = [r for r in csv.DictReader(fh) if r["dev_pearson"]]
    assert [int(r["step"]) for r in logged] == [0, 2, 4] and "stsb_dev" not in logged[0]
    results = json.loads((out / "results.json").read_text())
    assert results["dev"] == {"name": "dev_pearson", "source": str(dev)}
    best = max(logged, key=lambda r: float(r["dev_pearson"]))  # step 0 counts, as for STS-B
    assert results["best_dev_pearson"] == float(best["dev_pearson"])
    assert results["best_step"] == int(best["step"])

    out_none = tmp_path / "none"
    assert main([*common, "--eval.dev=none", f"--train.output_dir={out_none}"]) == 0
    results = json.loads((out_none / "results.json").read_text())
    assert results["best_step"] == 4 and results["best_stsb_dev"] is None
    assert "stsb_dev" not in (out_none / "metrics.csv").read_text()


def test_evaluate_scores_sts_files_with_table_and_json(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, fresh_eval_cache: None
) -> None:
    from cselab import load
    from cselab.cli import main

    f = write(tmp_path / "domain.tsv", PAIRS, DEV_COLUMNS)
    g = write(tmp_path / "other.jsonl", PAIRS[::-1], DEV_COLUMNS)
    out = tmp_path / "res.json"
    assert main(["evaluate", str(tiny_bert), "--sts-file", str(f), "--sts-file", str(g),
                 "-o", str(out)]) == 0  # fmt: skip
    table = capsys.readouterr().out
    assert "**Your STS files: Spearman x 100 of cosine vs score**" in table
    assert "| domain.tsv | other.jsonl |" in table and "STS12" not in table
    saved = json.loads(out.read_text())
    expected = custom.PairsScorer(custom.read_sts_file(f))(load(str(tiny_bert)))
    assert saved["results"]["domain.tsv"]["spearman"] * 100 == pytest.approx(expected, rel=1e-12)
    assert saved["results"]["domain.tsv"]["n"] == 6
    assert saved["headline"]["sts_files"]["domain.tsv"] == round(expected, 2)
    # a bad file is one line, before the model is loaded
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence1\tsentence2\n")
    assert main(["evaluate", "no/such/model", "--sts-file", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("bad.tsv:1: no column 'score' in the header (the file has columns: "
                        "sentence1, sentence2); "
                        "name the columns with --sts-columns S1,S2,SCORE")  # fmt: skip
    assert len(err.splitlines()) == 1


def test_train_names_the_dev_columns_key(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, fresh_eval_cache: None
) -> None:
    """A dev file without the score column: ``cselab train`` names its own override
    (``--eval.dev_columns=``), not the library's ``columns=`` argument."""
    from conftest import write_corpus
    from cselab.cli import main

    corpus = write_corpus(tmp_path)
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence1\tsentence2\na\tb\n")
    argv = [
        "train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
        f"--data.cache_dir={tmp_path / 'cache'}", "--train.batch_size=8", "--train.max_steps=2",
        f"--eval.dev={bad}", f"--train.output_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("; name the columns with --eval.dev_columns=[S1,S2,SCORE]"), err
    assert "columns=(" not in err


def test_dev_file_is_checked_whatever_the_cadence(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, fresh_eval_cache: None
) -> None:
    """``--eval.dev=<missing file>`` with ``train.eval_steps=0`` is refused (it was accepted and
    ``results.json`` named STS-B dev), before anything is trained."""
    from conftest import write_corpus
    from cselab.cli import main

    corpus = write_corpus(tmp_path)
    missing = tmp_path / "no-such-dev.tsv"
    out = tmp_path / "run"
    argv = [
        "train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
        f"--data.cache_dir={tmp_path / 'cache'}", "--train.batch_size=8", "--train.max_steps=2",
        "--train.eval_steps=0", f"--eval.dev={missing}", f"--train.output_dir={out}",
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(missing) in err
    assert not (out / "results.json").exists()


def test_the_dev_set_is_tokenised_once_and_scores_as_before(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, fresh_eval_cache: None
) -> None:
    """The trainer's evaluator tokenises its dev sentences once (kept on the model's device)
    and scores exactly as encoding them afresh with ``encoder.encode`` does, for a dev file and
    for STS-B dev (every number: the score, alignment, uniformity)."""
    from cselab.evaluation.alignment import POSITIVE_THRESHOLD, alignment, l2_normalize, uniformity
    from cselab.evaluation.embed import call_encoder
    from cselab.evaluation.sts import _stsb_dev_plan, correlations, cosine_similarity
    from cselab.model.encoder import load

    encoder = load(str(tiny_bert))
    tokenize, calls = encoder.tokenize, []
    encoder.tokenize = lambda *a, **k: calls.append(1) or tokenize(*a, **k)  # type: ignore[method-assign]
    path = write(tmp_path / "dev.tsv", PAIRS, DEV_COLUMNS)
    pairs = custom.read_sts_file(path)
    scorer = custom.PairsScorer(pairs, "spearman", batch_size=4)  # 12 sentences: 3 batches
    first = scorer(encoder)
    assert len(calls) == 3
    assert scorer(encoder) == first and len(calls) == 3  # the second evaluation: no tokenising
    vectors = call_encoder(encoder, list(scorer.unique), 4)
    system = cosine_similarity(vectors[scorer.i1], vectors[scorer.i2])
    assert first == 100.0 * correlations(system, pairs.scores)["spearman"]

    # STS-B dev's first 300 pairs, in SentEval's layout (the whole set is slow on the CPU)
    short = tmp_path / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv"
    short.parent.mkdir(parents=True)
    with (senteval_dir / "STS/STSBenchmark/sts-dev.csv").open(encoding="utf-8") as fh:
        short.write_text("".join(fh.readline() for _ in range(300)), encoding="utf-8")
    dev = custom.dev_evaluator("stsb", data_dir=short.parents[2], batch_size=64)
    calls.clear()
    got = [dev(encoder), dev(encoder)]
    unique, i1, i2, gold = _stsb_dev_plan(short.parents[2])
    assert len(calls) == -(-len(unique) // 64)  # one tokenising, for both evaluations
    vectors = call_encoder(encoder, list(unique), 64)
    unit, positive = l2_normalize(vectors), gold > POSITIVE_THRESHOLD
    expected = {
        "stsb_dev": 100.0 * correlations(cosine_similarity(vectors[i1], vectors[i2]), gold)["spearman"],
        "align": alignment(unit[i1[positive]], unit[i2[positive]]),
        "uniform": uniformity(unit),
    }  # fmt: skip
    assert got == [expected, expected]


def test_vectors_kept_on_the_device_come_in_input_order(tiny_bert: Path) -> None:
    """``encode_batches(on_device=True)`` (the dev set's vectors for measures computed on the
    device) gives the host copy's rows, in the input order, for sentences the batching sorts
    by length (a permutation that is not its own inverse)."""
    import torch

    from cselab.model.encoder import load
    from cselab.model.inference import encode_batches, tokenized_batches

    encoder = load(str(tiny_bert))
    sentences = ["a b", "a much longer sentence than the others", "c", "of middle length", "x y"]
    batches = tokenized_batches(encoder, sentences, 2)
    host = encode_batches(encoder, batches)
    kept = encode_batches(encoder, batches, on_device=True)
    assert isinstance(kept, torch.Tensor) and kept.device == encoder.device
    np.testing.assert_array_equal(kept.cpu().numpy(), host)
    np.testing.assert_array_equal(host, encoder.encode(sentences, batch_size=2))


@pytest.mark.parametrize("family", ["bert", "modernbert", "llama"])
@pytest.mark.parametrize("fast_path", [True, False], ids=["packed", "padded"])
def test_dev_vectors_under_the_run_s_autocast(
    tiny_bert: Path, tmp_path: Path, family: str, fast_path: bool
) -> None:
    """``encode_batches(autocast="bf16")`` runs the forward under bf16 autocast (the run plan's
    ``eval_precision`` on a GPU), on an encoder, ModernBERT and a decoder, through the CPU's
    packed forward and the padded one a GPU runs: float32 vectors close to the fp32 ones but
    not equal to them, and the fp32 default still ``encode()``'s. The weights are not copied
    or cast."""
    import torch

    from backbone_models import make_tiny
    from cselab.model.encoder import load
    from cselab.model.inference import encode_batches, tokenized_batches

    folder = tiny_bert if family == "bert" else make_tiny(family, tmp_path / family)
    pooler = "avg" if family == "llama" else None
    encoder = load(str(folder), pooler=pooler, fast_path=fast_path)
    sentences = ["a b", "a much longer sentence than the others", "c", "of middle length"]
    batches = tokenized_batches(encoder, sentences, 2)
    full = encode_batches(encoder, batches)
    low = encode_batches(encoder, batches, autocast="bf16")
    assert low.dtype == np.float32 and low.shape == full.shape
    assert not np.array_equal(low, full)
    cos = (low * full).sum(1) / np.linalg.norm(low, axis=1) / np.linalg.norm(full, axis=1)
    assert cos.min() > 0.98  # bf16 keeps ~3 significant digits; a wrong mask is far off
    assert all(p.dtype == torch.float32 for p in encoder.parameters())
    np.testing.assert_array_equal(full, encoder.encode(sentences, batch_size=2))
    with pytest.raises(ValueError, match=r"autocast must be one of fp32, bf16, fp16"):
        encode_batches(encoder, batches, autocast="int8")


def test_the_dev_evaluator_encodes_as_the_plan_says(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DevEvaluator.encode_with`` (the run plan's ``eval_batch_size`` and ``eval_precision``)
    reaches the scorer of a pairs file: its batches are made at that size and encoded under
    that autocast."""
    import cselab.model.inference as inference
    from cselab.config.devset import resolve_dev_set
    from cselab.evaluation.custom import DevEvaluator
    from cselab.model.encoder import load

    asked: list[str] = []
    real = inference.encode_batches

    def spy(*args, autocast: str = "fp32", **kwargs):  # noqa: ANN002, ANN003, ANN202
        asked.append(autocast)
        return real(*args, autocast=autocast, **kwargs)

    monkeypatch.setattr(inference, "encode_batches", spy)

    path = tmp_path / "dev.tsv"
    rows = ["sentence1\tsentence2\tscore"] + [
        f"a man plays {i}\tsomeone plays {'a flute' if i % 2 else 'music'} {i}\t{i % 5}"
        for i in range(12)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    encoder = load(str(tiny_bert))
    evaluator = DevEvaluator(resolve_dev_set(str(path)))
    fp32 = evaluator(encoder)
    assert evaluator._scorer.repeated._batches.key[3] == 128
    evaluator.encode_with(5, "bf16")
    bf16 = evaluator(encoder)
    scorer = evaluator._scorer
    assert (scorer.batch_size, scorer.precision) == (5, "bf16")
    assert scorer.repeated._batches.key[3] == 5  # batched again at the new size
    assert len(scorer.repeated._batches.inputs) == -(-len(scorer.unique) // 5)
    assert isinstance(bf16, float) and isinstance(fp32, float)
    assert asked == ["fp32", "bf16"]


@pytest.mark.parametrize(
    "columns", [["sentence1", "sentence2", ""], ["a", "a", "score"], ["a", "b"]]
)
def test_dev_columns_the_evaluation_refuses_are_refused_when_the_config_is_read(
    tmp_path: Path, columns: list[str]
) -> None:
    """``eval.dev_columns`` is held to the rule the STS file reader applies, when the config is
    read: an empty column name was accepted there and refused only once the run opened the file."""
    from cselab.config import Config, EvalConfig
    from cselab.core.errors import ConfigError

    path = write(tmp_path / "dev.tsv", PAIRS, DEV_COLUMNS)
    with pytest.raises(ConfigError, match="three distinct names"):
        custom.read_sts_file(path, columns)
    with pytest.raises(ConfigError, match=r"^eval\.dev_columns must be three distinct names"):
        Config(eval=EvalConfig(dev=str(path), dev_columns=columns)).validate()
