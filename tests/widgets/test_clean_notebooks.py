"""`make lab`'s pre-save hook: running a tutorial leaves its file byte-identical; edits save without outputs."""

import shutil
from pathlib import Path

import nbformat
import pytest

from rectoolkit.widgets.clean_notebooks import keep_notebooks_clean

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def contents_manager(tmp_path):
    from jupyter_server.services.contents.filemanager import FileContentsManager

    shutil.copyfile(ROOT / "notebooks/01_embeddings.ipynb", tmp_path / "01_embeddings.ipynb")
    return FileContentsManager(root_dir=str(tmp_path), pre_save_hook=keep_notebooks_clean)


def _executed(model):
    """What Lab sends after Run All: outputs, counts and widget state added."""
    content = model["content"]
    for number, cell in enumerate(content.cells, 1):
        if cell.cell_type == "code":
            cell.execution_count = number
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 1000)]
    content.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"m": "x" * 5000}}}
    return model


def test_running_a_notebook_saves_it_unchanged(contents_manager, tmp_path):
    before = (tmp_path / "01_embeddings.ipynb").read_bytes()
    model = _executed(contents_manager.get("01_embeddings.ipynb"))
    contents_manager.save(dict(model, type="notebook", format="json"), "01_embeddings.ipynb")
    assert (tmp_path / "01_embeddings.ipynb").read_bytes() == before


def test_an_edited_notebook_keeps_the_edit_without_outputs(contents_manager, tmp_path):
    model = _executed(contents_manager.get("01_embeddings.ipynb"))
    code = next(c for c in model["content"].cells if c.cell_type == "code")
    code.source += "\nprint('my edit')"
    contents_manager.save(dict(model, type="notebook", format="json"), "01_embeddings.ipynb")
    saved = nbformat.read(tmp_path / "01_embeddings.ipynb", as_version=4)
    assert any("print('my edit')" in c.source for c in saved.cells)
    assert all(c.outputs == [] and c.execution_count is None for c in saved.cells if c.cell_type == "code")
    assert "widgets" not in saved.metadata
