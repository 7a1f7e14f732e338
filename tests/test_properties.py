"""Property-based tests (Hypothesis): for any YAML file, override strings or corpus bytes, the
config loader, override parser and corpus reader return a valid result or raise the project's own
error type (``ConfigError`` / ``CorpusError``, shown by the CLI as one line), never another
exception. Run with ``--hypothesis-show-statistics`` to see the number of generated cases."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cselab.config import Config, ConfigError, load_config
from cselab.data import CorpusError, read_corpus

# tmp_path is shared by the examples of one test: each example overwrites its own file.
SETTINGS = settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a config dataclass (``train.lr``, ``objective.focal.enabled``...)."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        name = f"{prefix}{f.name}"
        out += _keys(tp, f"{name}.") if dataclasses.is_dataclass(tp) else [name]
    return out


KEYS = _keys(Config)
SECTIONS = sorted({k.split(".")[0] for k in KEYS})

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.sampled_from(["cls", "avg", "fp16", "bf16", "cpu", "gpu", "cuda:1",
                                           "auto", "strict", "replace", "1e-5", "-1", "0"]),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
# Real key names most of the time (to reach the type and range checks), arbitrary ones sometimes.
key_names = st.one_of(st.sampled_from(KEYS), st.text(max_size=15))


def nested(pairs: list[tuple[str, object]]) -> dict:
    data: dict = {}
    for dotted, value in pairs:
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            node = child if isinstance(child, dict) else node
        node[last] = value
    return data


def check_config(run: typing.Callable[[], Config]) -> None:
    try:
        config = run()
    except ConfigError as err:
        assert str(err) and "\n" not in str(err)  # the CLI shows it as one line
        return
    assert isinstance(config, Config)
    assert config.validate() is config  # what the loader returns passes validation again
    assert (config.eval.batch_size or 1) >= 1 and config.train.batch_size >= 2  # null: resolved


@SETTINGS
@given(st.lists(st.tuples(key_names, values), max_size=6))
def test_config_files_built_from_keys(tmp_path: Path, pairs: list) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(nested(pairs)), encoding="utf-8")
    check_config(lambda: load_config(path))


@SETTINGS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
@example(b"train: " + b"[" * 5000 + b"]" * 5000)  # PyYAML raises RecursionError on this
@example(b"train:\n  lr: [\n")
def test_config_files_of_any_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    check_config(lambda: load_config(path))


override_strings = st.one_of(
    st.text(max_size=40),
    st.builds(lambda k, v, dashes: f"{dashes}{k}={v}", key_names, st.text(max_size=20),
              st.sampled_from(["--", ""])),
)  # fmt: skip


@SETTINGS
@given(st.lists(override_strings, max_size=5))
@example(["--train.output_dir=" + "[" * 5000])
@example(["--model.name_or_path=runs/[a"])
def test_override_strings(overrides: list[str]) -> None:
    check_config(lambda: load_config(None, overrides))


@SETTINGS
@given(
    st.one_of(
        st.binary(max_size=300),
        st.lists(st.text(max_size=30), max_size=10).map(lambda ls: "\n".join(ls).encode()),
    ),
    st.sampled_from(["strict", "replace"]),
)
def test_corpus_reader_on_any_bytes(tmp_path: Path, data: bytes, errors: str) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    try:
        sentences, stats = read_corpus(path, errors=errors)
    except CorpusError as err:
        assert str(err).startswith(str(path))
        if errors == "replace":  # with replacement the refusals: an empty or compressed corpus
            said = str(err).removeprefix(f"{path}: ")
            compressed = "-compressed file, not text" in said or said.startswith("a zip archive")
            assert "no sentences" in said or compressed
        return
    assert stats.sentences == len(sentences) >= 1
    assert stats.sentences + stats.blank_lines == stats.lines
    assert all(s.strip() and "\n" not in s for s in sentences)
    if errors == "strict":
        assert stats.replaced_lines == 0
        assert sentences == [
            line.rstrip("\r").removeprefix("\ufeff") if i == 0 else line.rstrip("\r")
            for i, line in enumerate(data.decode("utf-8").split("\n"))
            if line.rstrip("\r").removeprefix("\ufeff" if i == 0 else "").strip()
        ]


def test_the_strategies_reach_every_key() -> None:
    assert (
        "train.device" in KEYS and "eval.batch_size" in KEYS and "objective.focal.hardness" in KEYS
    )
    assert SECTIONS == ["data", "eval", "model", "objective", "train"]
    with pytest.raises(ConfigError):  # a sanity check that check_config sees real errors
        load_config(None, ["--eval.batch_size=0"])
