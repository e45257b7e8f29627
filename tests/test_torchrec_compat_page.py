"""docs/torchrec_compat.md stays true: every name it lists as same or differs imports at its TorchRec path under
rectoolkit (and exists in TorchRec 1.8 at that path, when installed); every name listed as missing does not."""

import importlib
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "torchrec_compat.md"
ROW = re.compile(r"^\| `torchrec\.([\w.]+)\.(\w+)` \| (same|differs|missing) \|")


def _rows():
    rows = [ROW.match(line).groups() for line in PAGE.read_text().splitlines() if ROW.match(line)]
    assert len(rows) > 50, "the page lists fewer names than expected: has its table format changed?"
    return rows


def _resolves(prefix: str, path: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(f"{prefix}.{path}"), name)
    except ImportError:
        return False


@pytest.mark.parametrize("path,name,status", _rows(), ids=lambda value: str(value))
def test_the_page_says_what_imports(path, name, status):
    assert _resolves("rectoolkit", path, name) == (status != "missing"), (
        f"docs/torchrec_compat.md says torchrec.{path}.{name} is {status}")


@pytest.mark.torchrec
def test_every_name_on_the_page_is_torchrecs():
    pytest.importorskip("torchrec")
    not_torchrecs = [f"{path}.{name}" for path, name, _ in _rows() if not _resolves("torchrec", path, name)]
    assert not not_torchrecs
