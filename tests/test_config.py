"""Config: SimCSE defaults, YAML + overrides, errors that name the key, presets load."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from cselab.config import Config, ConfigError, apply_overrides, load_config
from cselab.model.choices import PoolerName

REPO = Path(__file__).resolve().parents[1]
POOLERS = typing.get_args(PoolerName)  # cls, cls_before_pooler, avg, ...


def test_defaults_are_simcse_unsup_bert_base() -> None:
    c = Config()
    assert (c.train.lr, c.train.batch_size, c.train.epochs) == (3e-5, 64, 1)
    assert c.model.max_seq_len == 32 and c.objective.temperature == 0.05
    # null: the table of backbones' default, resolved when the model loads (cls for BERT)
    assert c.model.pooler is None and c.model.mlp_only_train is True
    assert (c.train.eval_steps, c.train.seed, c.train.grad_clip) == (None, 42, 1.0)
    assert c.eval_cadence == 125  # SimCSE's; MNTP's is 0 (its last step kept), unless set
    assert load_config(None, ["--objective.mntp.enabled=true"]).eval_cadence == 0
    mntp = ["--objective.mntp.enabled=true", "--train.eval_steps=50"]
    assert load_config(None, mntp).eval_cadence == 50


def test_yaml_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 1.0e-5\n  batch_size: 32\nmodel:\n  pooler: avg\n")
    c = load_config(f, ["--train.lr=3e-5", "--model.dropout=0.2", "train.max_steps=10"])
    assert c.train.lr == 3e-5 and isinstance(c.train.lr, float)
    assert c.train.batch_size == 32 and c.model.pooler == "avg"
    assert c.model.dropout == 0.2 and c.train.max_steps == 10


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("--train.lrr=1", "train.lrr"),
        ("--nosuch.key=1", "nosuch"),
        ("--train.batch_size=abc", "train.batch_size"),
        ("--model.pooler=max", "model.pooler"),
        ("--train.resume=yes please", "train.resume"),
        ("--objective.temperature=0", "objective.temperature"),
        ("--train.batch_size=1", "train.batch_size"),
        ("--model.dropout=1.5", "model.dropout"),
        ("--train.output_dir=", "train.output_dir is empty: name the run's folder"),
        ("--model.revision=12345e6", "YAML read a number: quote the value to keep it as text"),
        ("--train.output_dir=  ", "train.output_dir is empty"),
    ],
)
def test_bad_values_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--model.pooler=clss", f"model.pooler: expected one of {', '.join(POOLERS)} or null, "
         "got 'clss'"),
        ("--train.compile_mode=fast", "train.compile_mode: expected one of default, "
         "reduce-overhead, max-autotune or null, got 'fast'"),
        ("--train.max_steps=2.5", "train.max_steps: expected a whole number or null, got 2.5"),
        ("--train.compile=maybe", "train.compile: expected true/false or null, got 'maybe'"),
        ("--train.report_to=5", "train.report_to: expected a list or null, got 5"),
    ],
)  # fmt: skip
def test_a_choice_or_null_is_said_in_words_not_python_type_names(
    override: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value) == message


def test_a_removed_key_says_why_and_its_last_default_still_loads(tmp_path: Path) -> None:
    """``model.unpad_cuda`` is gone: set to ``true`` it is refused with the reason; the
    ``false`` that every config saved by an earlier cselab records loads as before."""
    saved = tmp_path / "config.yaml"
    saved.write_text("model:\n  pooler: avg\n  unpad_cuda: false\ntrain:\n  lr: 1.0e-5\n")
    c = load_config(saved)
    assert c.model.pooler == "avg" and c.train.lr == 1e-5 and "unpad_cuda" not in c.to_dict()
    for text in ("true", "1", "'false'"):
        saved.write_text(f"model:\n  unpad_cuda: {text}\n")
        with pytest.raises(ConfigError) as err:
            load_config(saved)
        assert str(err.value) == (
            f"{saved}: model.unpad_cuda was removed: varlen attention was slower than padded on the "
            "GPUs measured (docs/results/gpu_benchmark.md)"
        )
    with pytest.raises(ConfigError, match=r"model\.unpad_cuda was removed"):
        load_config(None, ["--model.unpad_cuda=true"])


def test_a_removed_keyword_of_load_says_why(tiny_bert: Path) -> None:
    """``cselab.load(..., unpad_cuda=True)`` (code written for an earlier cselab) is refused
    with the reason, not a ``TypeError`` from deep in ``from_pretrained``; ``False``, which
    changed nothing, still loads."""
    import cselab

    with pytest.raises(ConfigError) as err:
        cselab.load(str(tiny_bert), unpad_cuda=True)
    assert str(err.value) == (
        "cselab.load: unpad_cuda=True: unpad_cuda was removed: varlen attention was slower "
        "than padded on the GPUs measured (docs/results/gpu_benchmark.md)"
    )
    assert cselab.load(str(tiny_bert), unpad_cuda=False).encode(["a b"]).shape[0] == 1


@pytest.mark.parametrize("text", ["1e-5", "1E-5", "1.0e-5", "+1e-5", "0.00001", "1e-05"])
def test_a_config_file_reads_an_exponent_as_a_number_as_an_override_does(
    tmp_path: Path, text: str
) -> None:
    """YAML 1.1 (PyYAML's default) reads ``1e-5`` as text; a config file reads it as the
    override ``--train.lr=1e-5`` does."""
    f = tmp_path / "c.yaml"
    f.write_text(f"train:\n  lr: {text}\n  max_steps: 1e3\n  warmup_ratio: .5e-1\n")
    c = load_config(f)
    assert c.train.lr == 1e-5 and c.train.max_steps == 1000 and c.train.warmup_ratio == 0.05
    assert load_config(None, [f"--train.lr={text}"]).train.lr == 1e-5


def test_a_string_that_reads_as_a_number_is_saved_quoted(tmp_path: Path) -> None:
    """What :func:`save_config` writes reads back the same (a resume compares it)."""
    from cselab.config import load_yaml, save_config

    c = load_config(None, ["--train.output_dir='1e5'"])
    assert c.train.output_dir == "1e5"
    save_config(c, tmp_path / "config.yaml")
    assert load_yaml(tmp_path / "config.yaml")["train"]["output_dir"] == "1e5"
    assert load_config(tmp_path / "config.yaml").to_dict() == c.to_dict()


def test_a_config_file_s_bad_key_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "bad3.yaml"
    f.write_text("train:\n  batch_sise: 32\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(err.value).startswith(f"{f}: unknown config key 'train.batch_sise' (valid: ")
    f.write_text("train:\n  lr: fast\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, ["--train.batch_size=32"])  # an override that does not touch it
    assert str(err.value) == f"{f}: train.lr: expected a number, got 'fast'"
    # an override's own error is not the file's, and an override can mend the file's value
    with pytest.raises(ConfigError) as err:
        load_config(f, ["--train.lr=0.1", "--train.batch_size=x"])
    assert str(err.value) == "train.batch_size: expected an integer, got 'x'"
    assert load_config(f, ["--train.lr=0.1"]).train.lr == 0.1


def test_a_key_given_twice_in_a_config_file_is_refused_naming_file_line_and_key(
    tmp_path: Path,
) -> None:
    f = tmp_path / "dup.yaml"
    f.write_text("train:\n  lr: 1.0e-5\n  batch_size: 32\n  lr: 3.0e-5\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(err.value) == (
        f"{f}:4:3: key 'lr' appears twice in one mapping (first on line 2); names must be unique"
    )
    f.write_text("model:\n  pooler: avg\nmodel:\n  dropout: 0.1\n")  # a section twice
    with pytest.raises(ConfigError, match=r"dup\.yaml:3:1: key 'model' appears twice"):
        load_config(f)


def test_override_syntax_error() -> None:
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides({}, ["--train.lr"])


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "path", sorted((REPO / "src/cselab/presets").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_preset_loads(path: Path) -> None:
    config = load_config(path)
    assert config.train.batch_size >= 2


def test_simcse_presets_match_the_paper() -> None:
    expected = {
        "bert-base": (64, 3e-5),
        "bert-large": (64, 1e-5),
        "roberta-base": (512, 1e-5),
        "roberta-large": (512, 3e-5),
    }
    for name, (batch, lr) in expected.items():
        c = load_config(REPO / "src/cselab/presets" / f"simcse-{name}.yaml")
        assert (c.train.batch_size, c.train.lr) == (batch, lr), name


def test_a_run_saved_with_a_removed_key_resumes_and_compares_as_today_s() -> None:
    """A checkpoint (or a sweep cell's ``config.yaml``) written by an earlier cselab records
    ``model.unpad_cuda: false``: a resume's check sees no difference from today's config, and
    a sweep's settings are the same; a removed key set to anything else still differs."""
    from cselab.config import Config
    from cselab.training.rundir import check_resumable, saved_settings

    today = Config().to_dict()
    earlier = {**today, "model": {**today["model"], "unpad_cuda": False}}
    assert check_resumable(earlier, today, Path("ck.pt")) == []
    assert saved_settings(earlier) == saved_settings(today)
    other = {**today, "model": {**today["model"], "unpad_cuda": True}}
    with pytest.raises(ConfigError, match="model.unpad_cuda"):
        check_resumable(other, today, Path("ck.pt"))
