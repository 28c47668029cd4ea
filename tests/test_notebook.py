"""The analysis notebook runs top to bottom against a finished study."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "study_analysis.ipynb"

pytestmark = pytest.mark.integration


def test_analysis_notebook_runs_on_a_finished_study(finished_study, monkeypatch) -> None:
    path, proc = finished_study
    assert proc.returncode == 0, proc.stderr[-2000:]
    monkeypatch.setenv("AUTOTUNE_STUDY", str(path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute()
    text = "\n".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    assert "study e2e:" in text
    assert "baseline output_throughput:" in text
    assert "best output_throughput:" in text
