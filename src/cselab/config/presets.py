"""The presets: run configs shipped inside the package, named by ``cselab train NAME``,
``cselab config NAME`` and a sweep's ``base: NAME``.

The one home of the preset files is ``cselab/presets/`` (package data, so a wheel carries them;
sweeps in ``cselab/presets/sweeps/``). ``--presets DIR`` or ``$CSELAB_CONFIGS`` point at another
folder of one's own. A name is a name: a separator in it is refused, so a name never reads a file
outside the folder; a path to a YAML file is taken as it is.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path

from ..core.errors import ConfigError, ConfigSettingError
from ..io.readers import check_file, reraise_as

#: The environment variable naming a folder of one's own presets (``--presets DIR`` wins).
PRESETS_ENV = "CSELAB_CONFIGS"
#: The subfolder of a presets folder holding the sweep files (``cselab sweep NAME``).
SWEEPS = "sweeps"

log = logging.getLogger("cselab")


def packaged_presets() -> Path:
    """The presets folder shipped in the package (``cselab/presets``)."""
    # A wheel or an editable install both unpack to files on disk: as_file is the identity here.
    return Path(str(resources.files("cselab") / "presets"))


def presets_dir(explicit: str | None = None) -> Path:
    """``--presets DIR``, else ``$CSELAB_CONFIGS``, else the packaged presets."""
    if explicit:
        folder = Path(explicit).expanduser()
        if not folder.is_dir():
            raise ConfigSettingError("presets", explicit, "{setting}: folder not found")
        return folder
    if os.environ.get(PRESETS_ENV):
        folder = Path(os.environ[PRESETS_ENV]).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"${PRESETS_ENV}={folder}: folder not found")
        return folder
    return packaged_presets()


def preset_names(folder: Path) -> list[str]:
    """The presets in ``folder``: its ``*.yaml`` files, by name without the ending."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


def find_preset(
    name: str,
    folder: Path | None = None,
    what: str = "preset or config file",
    file: str = "config file",
) -> Path:
    """A YAML file given as a path, or a preset named in ``folder`` (default: :func:`presets_dir`).

    A name with a ``.yaml`` ending that is no file here is the preset of that name, as the
    command line takes it; which file was read is logged.

    Raises :class:`ConfigError` listing the presets when ``name`` is neither (``what`` says
    what it may be, ``file`` what a path names).
    """
    if not name.strip():  # "" would be the working directory
        raise ConfigError(f"no {file} named (the name is empty)")
    path = Path(name).expanduser()
    if path.is_file():
        return path
    folder = presets_dir() if folder is None else folder
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    # a preset is a name in the folder, never a path: "../x" would read any YAML file on disk
    is_name = stem not in ("", ".", "..") and not any(
        sep in stem for sep in ("/", "\\", os.sep, os.altsep or "/")
    )
    if is_name and (folder / f"{stem}.yaml").is_file():
        if stem != name:  # meant as a file, perhaps: say which one is read
            log.info("%s: no such file here; reading the preset %s", name, folder / f"{stem}.yaml")
        return folder / f"{stem}.yaml"
    if path.is_dir():  # the readers' words, not "not found"
        with reraise_as(ConfigError):
            check_file(path, file)
    names = preset_names(folder)
    listed = f"presets in {folder}: {', '.join(names)}" if names else f"no presets in {folder}"
    if not is_name:
        base = Path(stem.replace("\\", "/")).name
        if base and (folder / f"{base}.yaml").is_file():  # e.g. the old configs/NAME.yaml
            raise ConfigError(
                f"{file} not found: {name} (a preset is named without its folder: {base})"
            )
        raise ConfigError(
            f"{file} not found: {name} (and a preset is a name without a path separator; {listed})"
        )
    if stem != name:  # a file name: read as a config file would be
        raise ConfigError(f"{file} not found: {name}")
    raise ConfigError(f"unknown {what} {name!r} ({listed})")


def find_sweep(name: str, folder: Path | None = None) -> Path:
    """A sweep YAML file given as a path, or a sweep preset named in ``folder/sweeps``."""
    folder = presets_dir() if folder is None else folder
    return find_preset(name, folder / SWEEPS, what="sweep file or preset", file="sweep file")
