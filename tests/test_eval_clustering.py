"""Clustering evaluation (``cselab evaluate --clustering``): the V-measure against its
definition and scikit-learn, k-means on the encoder's vectors, and the task kind going through
the registry into the JSON, the printed tables, the model card and the Hub ``model-index``."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from cselab.cli import main
from cselab.core.errors import UserError
from cselab.evaluation import api, report
from cselab.evaluation.clustering import (
    RUNS,
    ClusteringTask,
    evaluate_clustering,
    read_labelled_file,
    v_measure,
)
from cselab.evaluation.registry import TASK_KINDS
from cselab.model.encoder import load
from cselab.publish.card import evaluation_parts
from cselab.publish.hub_metadata import evaluation_results

TOPICS = {
    "food": ["i cooked pasta with tomato", "the soup was hot", "we baked fresh bread",
             "she likes spicy noodles", "a salad with cheese"],
    "sport": ["the team won the match", "he scored a late goal", "they ran a marathon",
              "the keeper saved a penalty", "a tennis final in june"],
    "space": ["the rocket reached orbit", "a comet passed the sun", "astronauts left the station",
              "the telescope found a planet", "mars has two moons"],
}  # fmt: skip


def labelled_file(path: Path) -> Path:
    rows = "".join(f"{t}\t{label}\n" for label, texts in TOPICS.items() for t in texts)
    path.write_text("text\tlabel\n" + rows, encoding="utf-8")
    return path


def v_measure_reference(labels: list, clusters: list) -> float:
    """Rosenberg & Hirschberg (2007) Eq. 1-5, term by term from the counts (slow, plain)."""
    n = len(labels)
    a = Counter(zip(labels, clusters, strict=True))
    n_c, n_k = Counter(labels), Counter(clusters)
    h_c = -sum(m / n * math.log(m / n) for m in n_c.values())
    h_k = -sum(m / n * math.log(m / n) for m in n_k.values())
    h_c_k = -sum(m / n * math.log(m / n_k[k]) for (_, k), m in a.items())
    h_k_c = -sum(m / n * math.log(m / n_c[c]) for (c, _), m in a.items())
    h = 1.0 if h_c == 0 else 1 - h_c_k / h_c
    c = 1.0 if h_k == 0 else 1 - h_k_c / h_k
    return 0.0 if h + c == 0 else 2 * h * c / (h + c)


def test_v_measure_is_its_definition_and_sklearns() -> None:
    rng = np.random.default_rng(0)
    for n, classes, clusters in ((40, 3, 3), (25, 2, 5), (60, 6, 2), (10, 1, 3), (12, 4, 1)):
        labels = [f"L{x}" for x in rng.integers(0, classes, n)]
        found = rng.integers(0, clusters, n).tolist()
        assert v_measure(labels, found) == pytest.approx(
            v_measure_reference(labels, found), abs=1e-12
        )
    assert v_measure(["a", "a", "b", "b"], [7, 7, 3, 3]) == 1.0  # cluster ids are names only
    assert v_measure(["a", "a", "b", "b"], [0, 0, 0, 0]) == 0.0  # complete, not homogeneous
    metrics = pytest.importorskip("sklearn.metrics")
    labels = rng.integers(0, 4, 50).tolist()
    found = rng.integers(0, 3, 50).tolist()
    assert v_measure(labels, found) == pytest.approx(
        metrics.v_measure_score(labels, found), abs=1e-12
    )


def test_kmeans_finds_separated_groups_and_averages_its_runs() -> None:
    rng = np.random.default_rng(1)
    centres = np.eye(4)[:3] * 10
    labels = [i % 3 for i in range(30)]
    vectors = centres[labels] + rng.normal(scale=0.1, size=(30, 4))
    out = evaluate_clustering(vectors, [str(x) for x in labels])
    assert out == {"kind": "clustering", "v_measure": 1.0, "n": 30, "clusters": 3, "runs": RUNS}


def test_bad_clustering_files_are_one_line(tmp_path: Path) -> None:
    no_label = tmp_path / "a.tsv"
    no_label.write_text("text\tclass\nx\t1\ny\t2\nz\t1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"a\.tsv.*label"):
        read_labelled_file(no_label)
    one = tmp_path / "b.tsv"
    one.write_text("text\tlabel\nx\t1\ny\t1\nz\t1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"b\.tsv.*3 rows with 1 labels"):
        read_labelled_file(one)
    with pytest.raises(UserError, match="not found"):
        read_labelled_file(tmp_path / "none.tsv")


def test_integer_labels_are_read_as_the_labels_they_are(tmp_path: Path) -> None:
    """A JSON integer label, and a saved dataset's ``ClassLabel`` column (integers), cluster
    like their text; a boolean is no label."""
    import datasets

    rows = [{"text": t, "label": i} for i, texts in enumerate(TOPICS.values()) for t in texts]
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    names = datasets.ClassLabel(names=list(TOPICS))
    saved = tmp_path / "saved"
    features = datasets.Features({"text": datasets.Value("string"), "label": names})
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(saved))
    want = tuple(str(r["label"]) for r in rows)
    assert read_labelled_file(jsonl).labels == read_labelled_file(saved).labels == want
    jsonl.write_text('{"text": "x", "label": true}\n', encoding="utf-8")
    with pytest.raises(
        UserError, match=r"labels\.jsonl:1: column 'label' holds a boolean \(true\), not text"
    ):
        read_labelled_file(jsonl)


def test_cselab_evaluate_clustering_reaches_json_tables_card_and_hub(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from scipy.cluster.vq import kmeans2

    path = labelled_file(tmp_path / "topics.tsv")
    saved = tmp_path / "out.json"
    assert main(["evaluate", str(tiny_bert), "--clustering", str(path), "--dims", "8",
                 "-o", str(saved)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    out = json.loads(saved.read_text())
    assert out["tasks"] == [] and list(out["results"]) == ["topics.tsv"]  # no SentEval task
    result = out["results"]["topics.tsv"]
    # the reference: the encoder's vectors, normalised, k-means by scipy, V-measure by definition
    labels = [label for label, texts in TOPICS.items() for _ in texts]
    texts = [t for ts in TOPICS.values() for t in ts]
    x = np.asarray(load(str(tiny_bert)).encode(texts), dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    runs = [v_measure_reference(labels, kmeans2(x, 3, minit="++", seed=s)[1].tolist())
            for s in range(RUNS)]  # fmt: skip
    assert result["v_measure"] == pytest.approx(float(np.mean(runs)), abs=1e-9)
    assert result["kind"] == "clustering" and result["n"] == 15 and result["clusters"] == 3
    value = round(100 * result["v_measure"], 2)
    assert out["headline"] == {"clustering": {"topics.tsv": value}}
    assert set(out["dims"]["8"]["results"]) == {"topics.tsv"}
    assert "**Your clustering files: V-measure x 100 of k-means vs labels**" in printed
    assert f"| {value:.2f} |" in printed and "**Dimension 8**" in printed
    assert f"| {value:.2f} |" in evaluation_parts(out)["senteval"]
    (hub,) = evaluation_results(out)
    assert (hub.task_type, hub.dataset_type, hub.metric_type, hub.metric_value) == (
        "clustering", "topics.tsv", "v_measure", value,
    )  # fmt: skip


def test_tasks_clustering_without_its_file_says_to_give_it(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--tasks clustering`` names the option that gives the data (not "unknown task"); with
    ``--clustering PATH`` it runs that file alone, as ``--clustering PATH`` without ``--tasks``."""
    assert main(["evaluate", str(tiny_bert), "--tasks", "clustering"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "cselab evaluate: error: task 'clustering' runs on your own data, not a benchmark: give "
        "it with --clustering PATH (your own labelled sentences (a table with text and label "
        "columns))"
    )
    with pytest.raises(UserError) as err:  # the library names its own way to give the data
        api.parse_tasks("sts,sts-file")
    assert str(err.value) == (
        "task 'sts-file' runs on your own data, not a benchmark: pass the file as sts_files=[PATH]"
    )
    path = labelled_file(tmp_path / "topics.tsv")
    saved = tmp_path / "out.json"
    argv = ["evaluate", str(tiny_bert), "--tasks", "clustering", "--clustering", str(path)]
    assert main([*argv, "-o", str(saved)]) == 0
    out = json.loads(saved.read_text())
    assert out["tasks"] == [] and list(out["results"]) == ["topics.tsv"]


def test_the_library_runs_the_task_object_as_the_cli(tiny_bert: Path, tmp_path: Path) -> None:
    path = labelled_file(tmp_path / "topics.tsv")
    out = api.evaluate(load(str(tiny_bert)), [ClusteringTask(read_labelled_file(path))])
    assert out["headline"]["clustering"]["topics.tsv"] == round(
        100 * out["results"]["topics.tsv"]["v_measure"], 2
    )


def test_report_card_and_hub_read_every_kind_from_the_registry(monkeypatch) -> None:
    """A kind added to the registry shows in the headline, the tables, ``cselab evaluate``'s
    printout, the card's parts, the ``model-index`` and ``cselab compare --plot`` with no other
    change."""
    from cselab.evaluation.tasks import TaskKind

    class Toy(TaskKind):
        kind = "toy"
        headline = "toy"
        panel = ("Toy", "points")

        @classmethod
        def headline_row(cls, results, dev):
            return {"T": 12.5} if "toy" in results else None

        @classmethod
        def title(cls, mode):
            return f"Toy ({mode})"

        @classmethod
        def extra_markdown(cls, names, outs):
            return ["toy extra"]

        @classmethod
        def entry_markdown(cls, out):
            return {"toy:one": "toy entry"}

        @classmethod
        def hub_results(cls, out, table):
            return [dict(task_type="toy", dataset_type="t", dataset_name="t", metric_type="m",
                         metric_value=table["toy"]["T"])]  # fmt: skip

    monkeypatch.setitem(TASK_KINDS, "toy", Toy)
    out = {"model": "m", "mode": "test", "results": {"toy": {"kind": "toy"}}}
    assert report.headline(out) == {"toy": {"T": 12.5}}
    assert report.markdown(out).startswith("**Toy (test)**\n\n| Model | T |")
    assert report.evaluation_markdown(out).endswith("toy extra\n\ntoy entry")
    assert evaluation_parts(out)["toy:one"] == "`cselab evaluate --toy`: toy entry"
    assert [r.metric_value for r in evaluation_results(out)] == [12.5]
    from cselab.insight.plots import plot_task_scores

    (ax,) = plot_task_scores([out], ["m"]).axes
    assert (ax.get_title(), ax.get_ylabel()) == ("Toy", "points")
