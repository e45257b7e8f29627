"""Notebook 06 (train on local workers, measure, reshard a checkpoint) runs top to bottom with CUDA visible, its
workers training on the GPU: with one GPU the 2 workers share it over gloo; with 2 or more, NCCL (its
`worker_device`)."""

from __future__ import annotations

import pytest

from gpu_helpers import REPO, dry_run

pytestmark = pytest.mark.gpu

NOTEBOOK = REPO / "notebooks" / "06_train_on_local_workers.ipynb"


@pytest.mark.timeout(900)
def test_notebook_06_runs_with_cuda_visible():
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as error:  # not a skip: on the GPU machine every gpu test must run
        raise AssertionError(f"{error}: notebook execution needs nbclient and ipykernel; on a machine without a "
                             "registry fetch their wheels with `bash .ci/gpu-wheels` and bring .whl/ along "
                             "(docs/gpu.md)") from error
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for output in cell.get("outputs", []))
    assert "2 workers, backend" in outputs and "tensors bit-identical" in outputs, outputs[-2000:]
    if not dry_run():
        assert "device cuda" in outputs, outputs[:2000]
        memory_table = [output for cell in notebook.cells if "cuda_max_allocated" in cell.source
                        for output in cell.get("outputs", [])]
        assert memory_table and "cuda peak" in str(memory_table), "the workers' CUDA peak memory is not shown"
