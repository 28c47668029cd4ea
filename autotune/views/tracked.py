"""The MLflow tracker with the views' page of a study: what its parent run shows (the summary, the best
config's launch script, the plots). The CLI registers it; tracking itself draws nothing."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.config import Study
from autotune.tracking.tracker import StudyPage, StudyTracker
from autotune.views.report import study_findings, summary_markdown

__all__ = ["ParentRunPage", "study_tracker"]


class ParentRunPage(StudyPage):
    """The study summary (views.report) and plots (views.plots) a study's parent run shows."""

    def summary(self, study: Study, optuna_study: optuna.Study) -> tuple[str, str | None]:
        findings = study_findings(study, optuna_study)
        return summary_markdown(findings), findings.best_script

    def plots(
        self, optuna_study: optuna.Study, metric: str, unit: str, title: str, folder: Path
    ) -> list[Path]:
        from autotune.views.plots import plot_data, save_plots  # matplotlib: only when a plot is drawn

        return save_plots(plot_data(optuna_study, metric, unit, title=title), folder)


def study_tracker(study: Study) -> StudyTracker:
    """The tracker of `study`'s MLflow store, its parent run showing the study's page."""
    return StudyTracker.of(study, ParentRunPage())
