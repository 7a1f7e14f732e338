"""``cselab config [PRESET]``: every key of every config section, with its default (or the
preset's value), type and meaning, generated from the dataclasses; a field without a docstring
entry is an error, so a new key cannot go undocumented."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cselab.cli import main
from cselab.config import Config, TrainConfig, load_config
from cselab.config.keys import UndocumentedKey, field_docs, keys
from cselab.objectives.config import GaussianConfig, ObjectiveConfig

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "src/cselab/presets").glob("*.yaml"))


def sections(cls: type, prefix: str = "") -> list[tuple[str, type]]:
    """``(dotted prefix, class)`` of every config section, nested ones included."""
    out = [(prefix, cls)]
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out += sections(tp, f"{prefix}{f.name}.")
    return out


def leaf_keys(data: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(leaf_keys(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def printed(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main(["config", *argv]) == 0
    return capsys.readouterr().out


def test_every_key_is_printed_with_its_default_type_and_meaning(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    text = printed(capsys)
    # The listing is a YAML config: the defaults, key for key, and cselab's loader takes it back.
    assert yaml.safe_load(text) == Config().to_dict()
    (tmp_path / "all.yaml").write_text(text, encoding="utf-8")
    assert load_config(tmp_path / "all.yaml").to_dict() == Config().to_dict()
    lines = text.splitlines()
    at = key_lines(lines)
    for prefix, cls in sections(Config):
        if cls is Config:
            continue
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                continue
            name = f"{prefix}{f.name}"
            assert name in at, f"{name} is not printed"
            comment, j = [], at[name] - 1
            while lines[j].lstrip().startswith("#"):  # the comment right above the key
                comment.insert(0, lines[j].strip().removeprefix("# "))
                j -= 1
            meaning = " ".join(comment)
            # the docstring entry, then the type in brackets
            assert docs[f.name] and meaning.startswith(docs[f.name] + " ["), (name, meaning)
            assert meaning.endswith("]"), meaning


def key_lines(lines: list[str]) -> dict[str, int]:
    """``{dotted key: line index}`` of a YAML text indented by two spaces a level."""
    found: dict[str, int] = {}
    path: list[str] = []
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        path = [*path[:depth], line.strip().split(":", 1)[0]]
        found[".".join(path)] = i
    return found


def test_docstring_entries_are_read_whole() -> None:
    train = field_docs(TrainConfig)
    assert train["max_steps"] == "stop after this many steps (overrides epochs when set)."
    # one entry for two names, and a continuation line that itself holds "Word: ..."
    assert (
        train["warmup_steps"]
        == train["warmup_ratio"]
        == "linear warm-up, then linear decay to 0 (the steps when both are set)."
    )
    batch_multiple = field_docs(GaussianConfig)["batch_multiple"]
    assert batch_multiple.endswith(
        "Paper: 3 (Table 3), i.e. 192 at batch 64, as in the authors' scripts."
    )
    assert "Paper" not in field_docs(GaussianConfig)
    assert field_docs(ObjectiveConfig)["mixcse"] == "see their classes."
    # markup is shown as plain text
    assert field_docs(TrainConfig)["resume"].startswith("continue from output_dir/checkpoint")


def test_every_section_documents_every_key() -> None:
    """Guards the listing: a key added without a docstring entry fails here."""
    for prefix, cls in sections(Config):
        if cls is Config:
            continue  # its fields are the five sections, described by their own classes
        undocumented = [f.name for f in dataclasses.fields(cls) if not field_docs(cls).get(f.name)]
        assert not undocumented, f"{prefix}: {undocumented}"
    assert [k.name for k in keys(Config()) if not k.meaning] == []


@dataclass
class _Probe:
    """A section with a key nobody documented.

    Attributes:
        known: documented.
    """

    known: int = 1
    forgotten: int = 2


def test_an_undocumented_key_is_an_error() -> None:
    with pytest.raises(UndocumentedKey, match="_Probe: no docstring entry .* for forgotten"):
        keys(_Probe())


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_values(preset: Path, capsys: pytest.CaptureFixture) -> None:
    text = printed(capsys, preset.stem)
    assert yaml.safe_load(text) == load_config(preset).to_dict()
    first = preset.read_text(encoding="utf-8").splitlines()[0].removeprefix("#").strip()
    assert first.split()[0] in text.split("\n\n")[0]  # the preset's own notes head the listing


def test_preset_changes_values_and_lists_the_presets(capsys: pytest.CaptureFixture) -> None:
    text = printed(capsys, "focal-bert-base")
    values = leaf_keys(yaml.safe_load(text))
    assert values["objective.focal.enabled"] is True and values["objective.focal.hardness"] == 0.3
    header = " ".join(line.removeprefix("#").strip() for line in text.split("\n\n")[0].splitlines())
    assert f"Presets ({ROOT / 'src/cselab/presets'}): " in header
    for preset in PRESETS:
        assert preset.stem in header


def test_presets_folder_and_file_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine.yaml").write_text("train:\n  max_steps: 7\n", encoding="utf-8")
    monkeypatch.setenv("CSELAB_CONFIGS", str(tmp_path))
    assert leaf_keys(yaml.safe_load(printed(capsys, "mine")))["train.max_steps"] == 7
    assert "Presets (" + str(tmp_path) + "): mine" in printed(capsys)
    other = tmp_path / "sub"
    other.mkdir()
    (other / "x.yml").write_text("model:\n  max_seq_len: 64\n", encoding="utf-8")
    values = leaf_keys(yaml.safe_load(printed(capsys, str(other / "x.yml"))))
    assert values["model.max_seq_len"] == 64


def test_unknown_preset_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "a.yaml").write_text("{}\n", encoding="utf-8")
    assert main(["config", "nosuch", "--presets", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"cselab config: error: unknown preset or config file 'nosuch' (presets in {tmp_path}: a)"
    ]
    (tmp_path / "a.yaml").unlink()
    assert main(["config", "nosuch", "--presets", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"cselab config: error: unknown preset or config file 'nosuch' (no presets in {tmp_path})"
    ]
    assert main(["config", "--presets", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"cselab config: error: --presets {tmp_path / 'none'}: folder not found"
    ]


def test_train_help_points_to_config(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "`cselab config`" in " ".join(capsys.readouterr().out.split())


def test_a_preset_name_is_a_name_not_a_path(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cselab config ../x/evil`` joined the name onto the presets folder and read any YAML
    file on disk (issue 31): a name with a separator is refused, unless it is a file given as
    such."""
    presets = tmp_path / "configs"
    presets.mkdir()
    (presets / "a.yaml").write_text("{}\n", encoding="utf-8")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "evil.yaml").write_text("model:\n  max_seq_len: 7\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path / "x")  # "../x/evil" names no file from here
    assert main(["config", "../x/evil", "--presets", str(presets)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "cselab config: error: config file not found: ../x/evil (and a preset is a name without "
        f"a path separator; presets in {presets}: a)"
    ]
    # the file named as a file is read, as `cselab train FILE` reads it
    assert main(["config", "../x/evil.yaml", "--presets", str(presets)]) == 0
    assert "max_seq_len: 7" in capsys.readouterr().out


def test_the_listing_names_the_sweep_presets_and_shows_one(capsys: pytest.CaptureFixture) -> None:
    """``cselab config`` lists the sweep presets beside the run presets; ``cselab config NAME``
    of a sweep preset prints its file and the command that runs it."""
    from cselab.cli import main
    from cselab.config.presets import SWEEPS, preset_names, presets_dir

    sweeps = preset_names(presets_dir() / SWEEPS)
    assert "focal-vs-simcse" in sweeps
    assert main(["config"]) == 0
    assert (
        f"Sweep presets ({presets_dir() / SWEEPS}): {', '.join(sweeps)}" in capsys.readouterr().out
    )
    assert main(["config", "focal-vs-simcse"]) == 0
    out = capsys.readouterr().out
    assert "run it with: cselab sweep focal-vs-simcse" in out and "base: demo-minilm" in out
