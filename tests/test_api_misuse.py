"""The public Python API misused as users misuse it: a count that is no count, one file where a
list of files is taken, a model path where a loaded model is, one override where a list is. Each
is a typed error of :mod:`cselab.core.errors` naming the argument, never a wrong result or a
library's traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cselab
from cselab.core.errors import ConfigError, ConfigSettingError, SettingError

STS_ROWS = [
    ("a cat sits", "a cat is sitting", 4.5),
    ("a dog runs", "the dog is running", 4.0),
    ("stocks fell", "a man sings", 0.5),
    ("it rains", "rain is falling", 4.2),
    ("he sings", "markets dropped", 0.2),
    ("red car", "blue car", 2.0),
]


@pytest.fixture(scope="module")
def encoder(tiny_bert: Path):
    return cselab.load(tiny_bert)


@pytest.fixture
def sts_file(tmp_path: Path) -> Path:
    path = tmp_path / "my.tsv"
    rows = "".join(f"{a}\t{b}\t{s}\n" for a, b, s in STS_ROWS)
    path.write_text("sentence1\tsentence2\tscore\n" + rows)
    return path


@pytest.mark.parametrize("setting", ["batch_size", "max_seq_len"])
@pytest.mark.parametrize("value", [0, -1, 2.5, "8"])
def test_encode_refuses_a_count_that_is_no_count(encoder, setting: str, value) -> None:
    # batch_size: -1 returned the uninitialised output array; 0 divided by zero.
    # max_seq_len: 0 truncated at the default length without a word; -1 was the tokenizer's
    # OverflowError
    with pytest.raises(ConfigSettingError, match=rf"^{setting}=.* is refused") as err:
        encoder.encode(["a cat", "a dog"], **{setting: value})
    assert err.value.setting == setting


def test_encode_refuses_an_unknown_precision_naming_it(encoder) -> None:
    with pytest.raises(ConfigSettingError, match="precision='fp16'") as err:
        encoder.encode(["a cat"], precision="fp16")
    assert err.value.setting == "precision"


def test_evaluate_takes_one_sts_file_as_a_path_or_its_text(encoder, sts_file: Path) -> None:
    # one str was read as a list of one-character file names ("/": the root folder)
    want = cselab.evaluate(encoder, None, sts_files=[sts_file])["results"]
    for one in (sts_file, str(sts_file)):
        assert cselab.evaluate(encoder, None, sts_files=one)["results"] == want


def test_evaluate_refuses_a_model_path_for_the_encoder(tiny_bert: Path, sts_file: Path) -> None:
    # a str has .encode(): it was called with batch_size=, a TypeError of str.encode
    for given in (tiny_bert, str(tiny_bert)):
        with pytest.raises(ConfigError, match=r"cselab\.load"):
            cselab.evaluate(given, None, sts_files=[sts_file])


def test_load_config_takes_one_override_as_a_string() -> None:
    # a str was taken as a list of one-character overrides ("override 't' is not of the form")
    config = cselab.load_config(None, "train.max_steps=5")
    assert config.train.max_steps == 5


@pytest.mark.parametrize("k", [0, 2.5, "3"])
def test_search_refuses_a_k_that_is_no_count(tmp_path: Path, k) -> None:
    vectors = np.eye(4, dtype=np.float32)
    index = cselab.Index.from_vectors(tmp_path / "idx", vectors, list("abcd"), "m", "avg")
    with pytest.raises(SettingError, match=r"^k=.* is refused"):
        index.search_vectors(vectors[:1], k=k)


@pytest.mark.parametrize("field, value", [("chunk_size", "x"), ("batch_size", 2.5)])
def test_index_settings_refuse_a_count_that_is_no_whole_number(field: str, value) -> None:
    # "x" was int()'s ValueError; 2.5 passed and failed deep in the tokenizer's batching
    with pytest.raises(SettingError, match=rf"^{field}=.* is refused") as err:
        cselab.IndexSettings(**{field: value}).validate()
    assert err.value.setting == field


@pytest.mark.parametrize(
    "config, named",
    [
        # passed validate(), then failed at the model's load (or never: a wrong run)
        (lambda: cselab.Config(model=cselab.ModelConfig(pooler="maxx")), "model.pooler"),
        # a TypeError of '>' between str and int
        (lambda: cselab.Config(train=cselab.TrainConfig(lr="fast")), "train.lr"),
        # an AttributeError of dict
        (lambda: cselab.Config(train={"max_steps": 5}), "TrainConfig"),
    ],
)
def test_a_config_built_in_python_is_checked_as_a_file_is(config, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        config().validate()


def test_evaluate_names_its_own_keyword_for_the_sts_columns(encoder, sts_file: Path) -> None:
    # the hint named eval.dev_columns or columns=, which evaluate() does not take
    with pytest.raises(ValueError, match=r"sts_columns="):
        cselab.evaluate(encoder, None, sts_files=[sts_file], sts_columns=["a", "b", "c"])


def test_load_config_and_train_take_a_preset_s_name_as_the_command_line_does() -> None:
    # "config file not found: simcse-bert-base" before: only `cselab train` knew the presets
    config = cselab.load_config("simcse-bert-base", ["train.max_steps=7"])
    assert config.train.max_steps == 7 and config.model.name_or_path == "bert-base-uncased"
    from cselab.config.presets import find_preset

    assert config == cselab.load_config(find_preset("simcse-bert-base"), "train.max_steps=7")
    with pytest.raises(
        ConfigError, match=r"unknown preset or config file 'simcse-bert-bsae' .*simcse-bert-base"
    ):
        cselab.load_config("simcse-bert-bsae")


def test_train_takes_the_sections_as_a_mapping_and_names_a_wrong_type(tmp_path: Path) -> None:
    # a dict was pathlib's TypeError ("expected str, bytes or os.PathLike object, not dict")
    from cselab.app.train import as_config

    sections = {"train": {"output_dir": str(tmp_path / "out"), "max_steps": 3}}
    assert as_config(sections) == cselab.load_config(
        None, [f"train.output_dir={tmp_path / 'out'}", "train.max_steps=3"]
    )
    assert sections == {"train": {"output_dir": str(tmp_path / "out"), "max_steps": 3}}
    with pytest.raises(ConfigError, match="train.max_stepz"):
        cselab.train({"train": {"max_stepz": 3}})
    with pytest.raises(ConfigError, match="a mapping of sections, not int"):
        cselab.train(3)


def test_a_config_built_in_python_keeps_paths_and_numpy_numbers_as_the_loader_does(
    tmp_path: Path,
) -> None:
    # a Path or a numpy number passed validate(), then save_config failed in yaml ("cannot
    # represent an object"); a Path is what Python code has at hand
    from cselab.config import save_config

    config = cselab.Config(
        train=cselab.TrainConfig(output_dir=tmp_path / "run", batch_size=np.int64(16)),
        objective=cselab.ObjectiveConfig(temperature=np.float64(0.1)),
    ).validate()
    assert config.train.output_dir == str(tmp_path / "run")
    assert type(config.train.batch_size) is int and type(config.objective.temperature) is float
    save_config(config, tmp_path / "c.yaml")
    assert cselab.load_config(tmp_path / "c.yaml") == config
    with pytest.raises(
        ConfigError, match=r"train.batch_size: expected an integer, got np.float32\(2.5\)"
    ):
        cselab.Config(train=cselab.TrainConfig(batch_size=np.float32(2.5))).validate()


def test_a_yaml_name_that_is_no_file_reads_the_preset_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # as the command line takes it, but a name ending in .yaml is often meant as a file
    import logging

    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="cselab"):
        config = cselab.load_config("simcse-bert-base.yaml")
    assert config == cselab.load_config("simcse-bert-base")
    said = [r.getMessage() for r in caplog.records if "no such file here" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("simcse-bert-base.yaml: no such file here")
    with pytest.raises(ConfigError, match=r"^no config file named \(the name is empty\)$"):
        cselab.load_config("")


def test_encode_takes_any_iterable_of_text_and_names_an_item_that_is_not(encoder) -> None:
    # a generator was "object has no len()"; None or a list holding a number failed deep in
    # the tokenizer
    want = encoder.encode(["a cat", "a dog"])
    np.testing.assert_array_equal(encoder.encode(s for s in ["a cat", "a dog"]), want)
    np.testing.assert_array_equal(encoder.encode(np.array(["a cat", "a dog"])), want)
    with pytest.raises(TypeError, match=r"^encode\(\) takes a list of sentences, not NoneType$"):
        encoder.encode(None)
    with pytest.raises(TypeError, match=r"item 1 is int$"):
        encoder.encode(["a cat", 2])


def test_evaluate_takes_one_matryoshka_dimension_as_a_number(encoder, sts_file: Path) -> None:
    # "int is not iterable"
    one = cselab.evaluate(encoder, None, sts_files=sts_file, dims=8)
    assert one["dims"].keys() == {"8"}
    assert one["dims"] == cselab.evaluate(encoder, None, sts_files=sts_file, dims=[8])["dims"]
