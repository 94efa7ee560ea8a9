"""examples/notebook.ipynb, executed end to end in a real Jupyter kernel (nbclient, ipykernel's python3 of this
interpreter), as a user runs it beside examples/gpt.py: no cell may fail, and the displays it promises are
there (a stop's source, a value's heatmap and histogram, the forensics report with its chart)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import EXAMPLES, ROOT

NOTEBOOK = EXAMPLES / "notebook.ipynb"


@pytest.fixture(scope="module")
def executed() -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(EXAMPLES)}})
    # this checkout's rewind, whatever the environment has installed
    client.execute(env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                  os.environ.get("PYTHONPATH")]))})
    return notebook


def outputs(notebook: nbformat.NotebookNode, code: str) -> list[dict]:
    """The outputs of the cell whose source contains `code`."""
    return next(c.outputs for c in notebook.cells if c.cell_type == "code" and code in c.source)


def html(notebook: nbformat.NotebookNode, code: str) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in outputs(notebook, code))


def test_the_notebook_runs_end_to_end_without_an_error_or_a_warning(executed):
    cells = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in cells), "a cell did not run"
    for cell in cells:
        for out in cell.outputs:
            assert out.output_type != "error", f"{cell.source[:60]}: {out.get('ename')}: {out.get('evalue')}"
            assert not (out.output_type == "stream" and out.name == "stderr"), out.text[:500]


def test_the_notebook_shows_the_source_a_heatmap_a_histogram_and_the_forensics_report(executed):
    assert "weights = torch.softmax(scores, dim=-1)" in html(executed, "s.run()")
    scores = html(executed, 's.value("scores")')
    assert scores.count("data:image/png;base64,") == 2 and "<td>480</td>" in scores  # the mask's -inf, counted
    report = html(executed, "buggy.forensics()")
    assert 'id="growth-chart"' in report and "exp/softmax overflow" in report and "Problem found" in report
    assert html(executed, "buggy.measure()").count("data:image/png;base64,") == 1
    sent = Path(re.search(r"'([^']+\.html)'", outputs(executed, "save_html")[0]["data"]["text/plain"])[1])
    page = sent.read_text()
    shutil.rmtree(sent.parent)  # the notebook's own temporary folder
    assert page.startswith("<!DOCTYPE html>") and "https://" not in page and 'id="node-table"' in page
