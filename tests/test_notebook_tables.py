"""Issue 14: every table the notebooks and widgets show has humanized numbers, no raw floats.

The cheap cells of the notebooks run here in-process (cells that start workers or subprocesses are skipped).
Every DataFrame a cell shows (its last expression, `display(...)`, or `print(frame.to_string())`) is rendered
as Jupyter would (text/html and text/plain) and searched for raw numbers: a float with more than 4 significant
digits (`488.281250`, `206209024.0`), a timing with more than 3 decimals (`15.8232 ms`), a unit with a long
tail (`15.823211669921875 MiB`), a bare integer of 5+ digits (a byte count such as `1824000` not in KiB/MiB),
or a big number in scientific notation (`2.062e+08`). The widgets' tables (explorer tabs, plan diff, Measure)
are checked the same way.
"""

from __future__ import annotations

import ast
import contextlib
import html
import io
import re
import warnings
from pathlib import Path

import pandas as pd
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# cells with these start workers or subprocesses: test_notebooks.py runs them, this fast check skips them
HEAVY = ("rtk.launch(", "subprocess.run(", "monitor")
# notebooks whose cells after a skipped one do not depend on it (07: the torchrun and DMP cells stand alone)
CONTINUE_AFTER_SKIP = {"07_to_production.ipynb"}
CHEAP = ["01_embeddings.ipynb", "03_embedding_collections.ipynb", "04_sharding_types.ipynb",
         "07_to_production.ipynb", "08_inference.ipynb"]

_NUMBER = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)(?![\w.])(\s*(?:B|KiB|MiB|GiB|TiB|ms)\b)?")


def raw_numbers(text: str) -> list:
    """The numbers in `text` a person should not have to read (see the module docstring).

        >>> raw_numbers("206209024.0 | 15.823211669921875 MiB | 0.0123456 ms | 1824000 | 488.281 | 2.062e+08")
        ['206209024.0', '15.823211669921875 MiB', '0.0123456 ms', '1824000', '488.281', '2.062e+08']
        >>> raw_numbers("196.66 MiB | 15.82 ms | 0.012 ms | 1,824,000 | 0.6881 | 8.816e-06 | 1234 | (5000, 10000)")
        []
    """
    found = []
    text = re.sub(r"\([^()]*\)|\[[^\[\]]*\]", "", text)  # (0, 10000), [3, 17]: row ranges and ids, not amounts
    for match in _NUMBER.finditer(text):
        number, unit = match.group(1), (match.group(2) or "").strip()
        digits = number.replace(",", "").lstrip("-")
        mantissa, _, _ = digits.partition("e")
        whole, _, decimals = mantissa.partition(".")
        significant = len((whole + decimals).lstrip("0"))
        if "e+" in number:  # 2.062e+08: a big number (a byte count?) in scientific notation
            bad = True
        elif unit == "ms":
            bad = len(decimals) > 3
        elif unit:
            bad = len(decimals) >= 5
        elif "." in mantissa:
            bad = significant > 4
        else:
            bad = "," not in number and len(whole) >= 5
        if bad:
            found.append(f"{number} {unit}".strip())
    return found


def table_cells(page: str) -> list:
    """The text of every <td>/<th> of an HTML table."""
    return [html.unescape(re.sub(r"<[^>]+>", "", cell))
            for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", page, flags=re.S)]


def raw_in_frame(frame) -> list:
    """Raw numbers in what Jupyter shows for a DataFrame: its text/html table cells and its text/plain repr."""
    shown = frame._repr_html_() if hasattr(frame, "_repr_html_") else frame.to_html()
    return [n for cell in table_cells(shown) for n in raw_numbers(cell)] + raw_numbers(repr(frame))


def _shown_tables(notebook_name: str, monkeypatch):
    """Run the notebook's cheap code cells in one namespace; yield (cell index, raw numbers) for each table shown:
    a DataFrame displayed, or a table printed with `DataFrame.to_string()`."""
    import IPython.display
    import nbformat

    notebook = nbformat.read(NOTEBOOKS / notebook_name, as_version=4)
    shown = []

    def display(*objects, **_):
        shown.extend(objects)

    monkeypatch.setattr(IPython.display, "display", display)  # also what `from IPython.display import display` gets
    namespace = {"__name__": "__main__", "display": display}
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if any(marker in cell.source for marker in HEAVY):
            if notebook_name in CONTINUE_AFTER_SKIP:
                continue
            break
        tree = ast.parse(cell.source)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(tree, f"{notebook_name} cell {index}", "exec"), namespace)
            if last is not None:
                shown.append(eval(compile(ast.Expression(last.value), f"{notebook_name} cell {index}", "eval"),
                                  namespace))
        for value in shown:
            if isinstance(value, (pd.DataFrame, pd.Series)):
                yield index, raw_in_frame(value)
        if ".to_string(" in cell.source:
            yield index, raw_numbers(printed.getvalue())
        shown.clear()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("notebook_name", CHEAP)
def test_notebook_tables_show_humanized_numbers(notebook_name, tmp_path, monkeypatch):
    import plotly.io as pio

    monkeypatch.chdir(tmp_path)  # files the notebooks save land here
    renderer = pio.renderers.default
    tables = 0
    try:
        # the notebooks' own pandas options and warning filters stay inside this test
        with pd.option_context("display.float_format", None), warnings.catch_warnings():
            for index, raw in _shown_tables(notebook_name, monkeypatch):
                tables += 1
                assert not raw, (f"{notebook_name} cell {index} shows raw numbers {raw[:6]}: show the table "
                                 f"through rectoolkit.viz.humanized (the numeric frame stays for computing)")
    finally:
        pio.renderers.default = renderer
    assert tables, f"{notebook_name}: no table shown by its cheap cells; is this test still looking at anything?"


def test_the_check_catches_the_raw_tables_of_issue_14():
    frame = pd.DataFrame({"max_time_ms": [0.441341], "total_bytes": [206209024.0], "weights_MiB": [488.28125]})
    assert raw_in_frame(frame), "the unformatted frame should be caught"
    from rectoolkit.viz import humanized

    assert raw_in_frame(humanized(frame)) == []
    transposed = frame.T.rename(columns={0: "TorchRec's planner"})
    assert raw_in_frame(transposed) and raw_in_frame(humanized(transposed)) == []
    # a transposed summary takes each row's unit from its name: 206209024 / 2**20 = 196.656 MiB
    assert humanized(transposed)["TorchRec's planner"].tolist() == ["0.441 ms", "196.66 MiB", "488.3"]


def test_explorer_tables_show_humanized_numbers(tmp_path):
    """Every tab of the explorer, the plan diff table and the Measure table, with the planner's real frames."""
    import ipywidgets as w

    from rectoolkit import EmbeddingBagConfig
    from rectoolkit.viz.diff import plan_diff_traces
    from rectoolkit.widgets import PlanExplorer
    from rectoolkit.widgets.explorer import html_table

    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"])
              for i, (rows, dim) in enumerate([(1_000_003, 64), (77_777, 128), (12_345, 24), (999, 8)])]
    explorer = PlanExplorer(tables, world_size=4, workdir=tmp_path)
    explorer.compare_with()
    explorer.set(world_size=2)
    for name in explorer.TAB_NAMES:
        if name != "Measure":  # Measure runs workers; its table is checked below with html_table
            explorer.show_tab(name)

    def html_values(widget):
        if isinstance(widget, w.HTML):
            yield widget.value
        for child in getattr(widget, "children", ()):
            yield from html_values(child)

    pages = [page for page in html_values(explorer.tabs) if "<table" in page] + [explorer.status.value]
    assert any("rtk-choices" in page for page in pages), "the Tables tab should show the choices table"
    raw = [n for page in pages for cell in table_cells(page) for n in raw_numbers(cell)]
    raw += raw_numbers(re.sub(r"<[^>]+>", " ", explorer.status.value)) + raw_numbers(explorer.last_diff.summary())
    assert not raw, f"the explorer shows raw numbers {raw[:6]}"

    traces, _ = plan_diff_traces(explorer.last_diff)
    cells = [str(value) for trace in traces if trace["type"] == "table" for column in trace["cells"]["values"]
             for value in column]
    assert cells and not [n for cell in cells for n in raw_numbers(cell)]

    measured = pd.DataFrame({"plan": ["current", "pinned"], "est_step_ms": [1.23456789, 15.823211669921875],
                             "step_ms": [2.000001, 120.5], "cpu_ms": [0.00012345, 3.0]})
    assert not [n for cell in table_cells(html_table(measured, list(measured.columns))) for n in raw_numbers(cell)]
