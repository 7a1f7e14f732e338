"""The wheels an offline GPU machine needs beside ``../shared/gpu/prepare.sh``'s: this venv's
versions of everything ``transformers``, ``sentence-transformers``, ``peft`` and ``datasets``
import, so the carried ``transformers`` does not meet an older ``huggingface_hub`` (or a missing
``kernels``) in the GPU image and fail before the check's first section.

The heavy scientific stack (torch and its CUDA libraries, numpy, scipy, pandas, pyarrow, ...)
stays the image's: it is large, the carry is 64 MiB, and torch's own needs are met there.

Usage (``make gpu-pack`` runs both)::

    bash ../shared/gpu/prepare.sh
    python bench/gpu_wheels.py .gpu/whl
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

#: what the check imports, whose dependencies are carried
ROOTS = ("transformers", "sentence-transformers", "peft", "datasets")
#: kept from the GPU image: large, and what torch there was built against
IMAGE = re.compile(
    r"^(torch|triton|nvidia-.*|numpy|scipy|scikit-learn|pandas|pyarrow|sympy|mpmath|networkx"
    r"|setuptools|jinja2|markupsafe|pip)$"
)
#: the GPU image's Python and platforms (as prepare.sh downloads)
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform",
            "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform",
            "manylinux2014_x86_64"]  # fmt: skip


def normal(name: str) -> str:
    """A distribution's name as pip compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...] = ROOTS) -> dict[str, str]:
    """``{name: installed version}`` of ``roots`` and every distribution they require (no
    extras), as installed in this environment, less :data:`IMAGE`'s."""
    seen: dict[str, str] = {}

    def walk(name: str) -> None:
        key = normal(name)
        if key in seen or IMAGE.match(key):
            return
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return
        seen[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                walk(req.name)

    for root in roots:
        walk(root)
    return seen


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python bench/gpu_wheels.py FOLDER (e.g. .gpu/whl)")
    folder = Path(args[0])
    folder.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version}" for name, version in sorted(closure().items())]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         *PLATFORM, "-d", str(folder), *pins],
        check=True,
    )  # fmt: skip
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"{folder}: {len(pins)} pinned distributions; {size / 2**20:.1f} MiB of wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
