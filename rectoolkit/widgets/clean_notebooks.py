"""Keep the repository's notebooks clean while a learner runs them in JupyterLab (`make lab`).

JupyterLab autosaves an open notebook every few minutes, outputs and widget state included (5-6 MB for the
explorer), so after Run All git shows every tutorial as modified. `make lab` starts the server with this
pre-save hook:

    jupyter lab --FileContentsManager.pre_save_hook=rectoolkit.widgets.clean_notebooks.keep_notebooks_clean

- a notebook whose cells (types and sources) are unchanged is saved exactly as it is on disk, so running
  it changes nothing that git sees;
- a notebook the learner edited is saved with their edits, without outputs, execution counts or widget
  state (what the repository keeps; nbstripout does the same for commits).

No git filter or per-clone setup is needed: the hook is part of the `make lab` command line.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, List, Tuple

OUTPUT_METADATA = ("widgets", "execution")


def _cells(content: Dict[str, Any]) -> List[Tuple[str, str]]:
    def text(source: Any) -> str:
        return "".join(source) if isinstance(source, list) else str(source)

    return [(cell.get("cell_type", ""), text(cell.get("source", ""))) for cell in content.get("cells", [])]


def strip_outputs(content: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of a notebook (nbformat 4 dict) without outputs, execution counts and widget state."""
    clean = copy.deepcopy(content)
    for key in OUTPUT_METADATA:
        clean.get("metadata", {}).pop(key, None)
    for cell in clean.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
        for key in OUTPUT_METADATA:
            cell.get("metadata", {}).pop(key, None)
    return clean


def keep_notebooks_clean(model: Dict[str, Any], path: str, contents_manager: Any = None, **_: Any) -> None:
    """Jupyter's pre-save hook: rewrite `model["content"]` in place as described in the module docstring."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    import nbformat

    on_disk = Path(contents_manager.root_dir if contents_manager is not None else ".") / path.lstrip("/")
    if on_disk.is_file():
        saved = nbformat.read(on_disk, as_version=4)
        if _cells(saved) == _cells(model["content"]):
            model["content"] = saved  # unchanged cells: write back the file as it is
            return
    model["content"] = nbformat.from_dict(strip_outputs(model["content"]))
