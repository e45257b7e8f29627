"""Front-end files of the custom widgets: ES modules and CSS.

The sources live in one copy, the repository's top-level `widgets/` folder. A source checkout (and an editable
install) loads them from there; a wheel carries them in `rectoolkit/widgets/static/`, where setup.py's build
step copies them (the folder is not in the repository).

    >>> "export default" in read_asset("placement_board.js")
    True
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "widgets"
ASSET_NAMES = ("placement_board.js", "placement_board.css", "paint_probe.js", "plotly_view.js")


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
