"""The analysis notebook runs top to bottom against a finished study and shows its tables and plots."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "analyze_study.ipynb"

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
    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    ]
    text = "\n".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", "")) for output in outputs
    )
    assert "study e2e:" in text
    assert "baseline (SGLang defaults):" in text and "gain over SGLang's defaults:" in text
    assert "answer: confirmed: " in text or "answer: no config beat SGLang's defaults" in text
    assert "#!/usr/bin/env bash" in text  # how to launch the best config
    assert "trial runs in MLflow experiment 'e2e'" in text
    assert "#000 baseline" in text  # the MLflow run names, joined to the trials
    assert "what to try:" in text  # failures with their advice
    assert "no ablation yet: run `autotune ablate" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4, "the plots are shown inline"
