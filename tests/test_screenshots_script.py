"""scripts/screenshots.py (docs/report.png and docs/mlflow-parent-run.png from a finished study) loads and
says what it takes, without a browser: its import pulls in neither Playwright nor MLflow."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.builders import REPO


def test_screenshots_script_help_names_the_study_file_and_the_folder(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = importlib.util.spec_from_file_location("screenshots", REPO / "scripts" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    heavy = {"playwright", "playwright.sync_api", "mlflow"} & set(sys.modules)
    spec.loader.exec_module(module)
    assert {"playwright", "playwright.sync_api", "mlflow"} & set(sys.modules) == heavy
    with pytest.raises(SystemExit) as done:
        module.parse_args(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "STUDY.yaml" in shown and "--out" in shown
    assert module.parse_args(["examples/quickstart.yaml"]).out.name == "docs"
