"""The presets: run configs shipped inside the package, named by ``cselab train NAME``,
``cselab config NAME`` and a sweep's ``base: NAME``.

The one home of the preset files is ``cselab/presets/`` (package data, so a wheel carries them;
sweeps in ``cselab/presets/sweeps/``). ``--presets DIR`` or ``$CSELAB_CONFIGS`` point at another
folder of one's own. A name is a name: a separator in it is refused, so a name never reads a file
outside the folder; a path to a YAML file is taken as it is.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from ..core.errors import ConfigError

#: The environment variable naming a folder of one's own presets (``--presets DIR`` wins).
PRESETS_ENV = "CSELAB_CONFIGS"
#: The subfolder of a presets folder holding the sweep files (``cselab sweep NAME``).
SWEEPS = "sweeps"


def packaged_presets() -> Path:
    """The presets folder shipped in the package (``cselab/presets``)."""
    # A wheel or an editable install both unpack to files on disk: as_file is the identity here.
    return Path(str(resources.files("cselab") / "presets"))


def presets_dir(explicit: str | None = None) -> Path:
    """``--presets DIR``, else ``$CSELAB_CONFIGS``, else the packaged presets."""
    if explicit:
        folder = Path(explicit).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"--presets {explicit}: folder not found")
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


def find_preset(name: str, folder: Path | None = None, what: str = "preset or config file") -> Path:
    """A YAML file given as a path, or a preset named in ``folder`` (default: :func:`presets_dir`).

    Raises :class:`ConfigError` listing the presets when ``name`` is neither.
    """
    path = Path(name).expanduser()
    if path.is_file():
        return path
    folder = presets_dir() if folder is None else folder
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    is_name = stem and "/" not in stem and os.sep not in stem and stem not in (".", "..")
    if is_name and (folder / f"{stem}.yaml").is_file():
        return folder / f"{stem}.yaml"
    if not is_name or stem != name:  # a path, or a file name: as a config file was read
        base = Path(stem).name
        hint = (
            f" (a preset is named without its folder: {base})"
            if base and (folder / f"{base}.yaml").is_file()
            else ""
        )
        raise ConfigError(f"config file not found: {name}{hint}")
    names = preset_names(folder)
    listed = f"presets in {folder}: {', '.join(names)}" if names else f"no presets in {folder}"
    raise ConfigError(f"unknown {what} {name!r} ({listed})")


def find_sweep(name: str, folder: Path | None = None) -> Path:
    """A sweep YAML file given as a path, or a sweep preset named in ``folder/sweeps``."""
    folder = presets_dir() if folder is None else folder
    return find_preset(name, folder / SWEEPS, what="sweep file or preset")
