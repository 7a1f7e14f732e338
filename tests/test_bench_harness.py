"""The benchmarks' shared harness (``bench/harness.py``): the order sides run in, the medians and
ratios the tables report, the timing windows, the fresh-process protocol and the files written.
Pure functions and tiny processes only: nothing here is timed."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
import textwrap
from pathlib import Path

import harness  # bench/ is on sys.path (conftest)
import pytest

from cselab.evaluation.report import markdown_table

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_alternation_runs_every_side_once_per_round() -> None:
    assert harness.alternation(["a", "b"], 2) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    # ABBA: every second round reversed, so a drift in load hits both sides alike
    order = harness.alternation(["a", "b"], 3, abba=True)
    assert [side for _, side in order] == ["a", "b", "b", "a", "a", "b"]
    assert [rnd for rnd, _ in order] == [0, 0, 1, 1, 2, 2]
    assert harness.alternation(["a", "b"], 0) == []


def test_medians_and_ratios() -> None:
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.median(iter([1.0, 4.0])) == 2.5
    # median over median, not the median of the round ratios
    ours, peer = [10.0, 30.0, 20.0], [10.0, 5.0, 20.0]
    assert harness.ratio(ours, peer) == 2.0
    assert harness.round_ratios(ours, peer) == [1.0, 6.0, 1.0]


def test_window_rates_from_step_end_times() -> None:
    ends = [1.0, 2.0, 3.0, 5.0, 9.0]
    # steps after the first (warm-up) one: 3 steps of 8 sentences between t=2 and t=9
    assert harness.window_rate(ends, 8, 1) == pytest.approx(8 * 3 / 7)
    # 2-step windows of 4-sentence steps from start=0: marks 0 1 2 3 5 9, windows [0, 2] ->
    # 8/2 sentences/s and [2, 5] -> 8/3; the last, incomplete window is left out
    assert harness.median_window_rate(ends, 0.0, 4, window=2) == pytest.approx((4 + 8 / 3) / 2)
    assert harness.median_window_rate([1.0], 0.0, 4, window=2) is None


def test_command_is_quoted_for_a_shell() -> None:
    cmd = harness.command("bench_train.py", ["--runs", "", "--out", "a b.md"], prefix="nice python")
    assert cmd == "nice python bench/bench_train.py --runs '' --out 'a b.md'"
    assert shlex.split(cmd)[3:] == ["--runs", "", "--out", "a b.md"]
    assert harness.command("bench_eval.py", []) == "python bench/bench_eval.py"


def test_pick_sides_names_an_unknown_side() -> None:
    assert harness.pick_sides(" b, a ,", ("a", "b")) == ["b", "a"]
    with pytest.raises(SystemExit, match="unknown side 'c'; choose from a, b"):
        harness.pick_sides("a,c", ("a", "b"))


def test_markdown_table_alignment() -> None:
    table = markdown_table(["name", "n", "x"], [["a", 1, ""], ["b", 22, "y"]], align="lr")
    assert table.splitlines() == [
        "| name | n | x |",
        "|---|---:|---|",
        "| a | 1 | |",
        "| b | 22 | y |",
    ]
    # no alignment: the separator every cselab table had before
    assert markdown_table(["a", "b"], []).splitlines()[1] == "|---|---|"


def test_run_sides_alternates_fresh_processes(tmp_path: Path) -> None:
    """Each run is its own process with its own scratch folder; results come back per side, in
    round order, through the worker's last JSON line."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            sys.path.insert(0, {str(BENCH)!r})
            from harness import reply
            print("{{not the answer")
            reply({{"side": sys.argv[1], "pid": os.getpid(), "scratch": sys.argv[2],
                    "env": os.environ.get("SIDE_ENV")}})
            """
        ),
        encoding="utf-8",
    )
    seen = []
    results = harness.run_sides(
        script, ["x", "y"], 2, lambda side, tmp: [side, str(tmp)],
        env=lambda side: {"SIDE_ENV": side.upper(), "PATH": ""},
        done=lambda rnd, side, res: seen.append((rnd, side, res["side"])),
    )  # fmt: skip
    assert seen == [(0, "x", "x"), (0, "y", "y"), (1, "x", "x"), (1, "y", "y")]
    assert [r["env"] for r in results["x"]] == ["X", "X"]
    pids = [r["pid"] for rs in results.values() for r in rs]
    assert len(set(pids)) == 4  # a fresh process per run
    scratch = [r["scratch"] for rs in results.values() for r in rs]
    assert len(set(scratch)) == 4 and not any(Path(s).exists() for s in scratch)


def test_run_worker_failure_names_the_side(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit('no luck here')\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"(?s)peer fp32 failed:.*no luck here"):
        harness.run_worker(script, [], what="peer fp32")


def test_results_files_and_wiki_lines(tmp_path: Path) -> None:
    page, data = tmp_path / "new" / "page.md", tmp_path / "new" / "data.json"
    harness.write_page(page, "# title\n")
    harness.write_json(data, {"a": [1, 2]})
    assert page.read_text(encoding="utf-8") == "# title\n"
    assert data.read_text(encoding="utf-8") == json.dumps({"a": [1, 2]}, indent=2)
    assert sorted(p.name for p in page.parent.iterdir()) == ["data.json", "page.md"]  # no temp left
    text = tmp_path / "lines.txt"
    text.write_text(" one \n\n  \ntwo\u2028half\nthree\n", encoding="utf-8")
    assert harness.wiki_lines(path=text) == ["one", "two\u2028half", "three"]
    assert harness.wiki_lines(2, text) == ["one", "two\u2028half"]


def test_throughput_table_of_bench_train() -> None:
    """A script's table: medians, ratio of medians and per-round ratios, through the one
    markdown writer."""
    spec = importlib.util.spec_from_file_location("bench_train", BENCH / "bench_train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_train"] = module  # dataclasses look their module up
    assert spec.loader is not None
    spec.loader.exec_module(module)
    rates = {"peer fp32": [50.0, 40.0], "cselab fp32": [90.0, 80.0], "cselab bf16": [1.0],
             "cselab-compiled fp32": [120.0, 80.0]}  # fmt: skip
    assert module.throughput_table(rates).splitlines() == [
        "| precision | side | peer sent/s | side sent/s | ratio | per-round ratios | target | met |",
        "|---|---|---|---|---|---|---|---|",
        "| fp32 | cselab | 45.0 | 85.0 | **1.89×** | 1.80, 2.00 | ≥ 2.2× | no |",
        "| fp32 | cselab-compiled | 45.0 | 100.0 | **2.22×** | 2.40, 2.00 | ≥ 2.2× | yes |",
    ]


def test_peak_rss_is_this_process_vmhwm() -> None:
    current, peak = harness.rss_mib()
    assert harness.peak_rss_mib() >= peak or peak != peak  # NaN where /proc is absent
    assert not peak < current
