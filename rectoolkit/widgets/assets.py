"""Front-end files of the custom widgets: ES modules and CSS.

The sources live in the repository's top-level `widgets/` folder; a copy ships inside the wheel in
`rectoolkit/widgets/static/`. In a source checkout the top-level file wins (so editing it needs no copy
step); `python -m rectoolkit.widgets.assets` copies the sources into `static/` before a release, and a test
checks the two copies are identical.

    >>> "export default" in read_asset("placement_board.js")
    True
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import List

STATIC_DIR = Path(__file__).resolve().parent / "static"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "widgets"
ASSET_NAMES = ("placement_board.js", "placement_board.css")


def asset_path(name: str) -> Path:
    """The file to load: widgets/<name> in a source checkout, else the copy shipped in the package."""
    source = SOURCE_DIR / name
    if source.is_file():
        return source
    shipped = STATIC_DIR / name
    if shipped.is_file():
        return shipped
    raise FileNotFoundError(f"widget asset {name!r} is in neither {SOURCE_DIR} nor {STATIC_DIR}; reinstall rectoolkit")


def read_asset(name: str) -> str:
    return asset_path(name).read_text(encoding="utf-8")


def sync_static() -> List[str]:
    """Copy every front-end source into the package's static folder; returns the names copied."""
    STATIC_DIR.mkdir(exist_ok=True)
    copied = []
    for source in sorted(SOURCE_DIR.glob("*")):
        if source.suffix in (".js", ".css"):
            shutil.copyfile(source, STATIC_DIR / source.name)
            copied.append(source.name)
    return copied


if __name__ == "__main__":
    names = sync_static()
    sys.stdout.write(f"copied {', '.join(names)} into {STATIC_DIR}\n")
