"""The view `autotune ui` opens on, as the MLflow UI reads it: an experiment tag (a real MLflow store), for
the study's experiment and its NCCL stage's, each sorted by `study_rank` with its own objective a column."""

from __future__ import annotations

import json

from autotune.config import load_study
from autotune.tracking.tracker import StudyTracker
from autotune.views.ui import VIEW_KEY, VIEW_STATE_TAG, UIServer, experiment_id
from tests.builders import StudyFiles, e2e_study


def test_the_study_and_its_nccl_stage_each_open_on_their_trials(study_file: StudyFiles) -> None:
    from mlflow.tracking import MlflowClient

    study = load_study(study_file(e2e_study()))
    StudyTracker.of(study)
    assert experiment_id(study, study.name + ".nccl-stage") is None  # no stage: no second link
    StudyTracker(study.tracking_uri, study.name + ".nccl-stage", study.workdir / "artifacts", "allreduce_us")

    client = MlflowClient(tracking_uri=study.tracking_uri)
    for name, metric in ((study.name, "output_throughput"), (study.name + ".nccl-stage", "allreduce_us")):
        found = experiment_id(study, name)
        assert found is not None
        view = json.loads(client.get_experiment(found).tags[VIEW_STATE_TAG + VIEW_KEY])
        assert view["orderByKey"] == "metrics.`study_rank`" and view["orderByAsc"] is True
        assert f"metrics.`{metric}`" in view["selectedColumns"]
        assert "tags.`autotune.failure_kind`" in view["selectedColumns"]
        # MLflow 3.17 sizes only the columns columnOrder lists: the run name's width needs it there.
        assert set(view["columnWidths"]) <= set(view["columnOrder"]) == set(view["selectedColumns"])
        assert view["columnWidths"]["attributes.`Run Name`"] >= 300

    stage = experiment_id(study, study.name + ".nccl-stage")
    server = UIServer(None, "127.0.0.1", 5000, "1", study.workdir / "ui.log", stage)  # type: ignore[arg-type]
    assert server.stage_url is not None and f"#/experiments/{stage}/runs?" in server.stage_url
    assert f"viewStateShareKey={VIEW_KEY}" in server.experiment_url
