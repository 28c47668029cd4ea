"""`autotune list` and `delete`: the studies of a folder, and removing one study's records and files.

A delete removes exactly what the study made: its Optuna studies (the study and its NCCL stage) from the
storage, its MLflow experiments with their runs and artifacts from the tracking store, and its work dir
(`.autotune/<study>/`: node logs, the stage's files, reports). Other studies sharing a storage or a tracking
store keep theirs, a database file that still holds another study stays, and the study file stays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.config import Study, load_study
from autotune.errors import AutotuneError

# How deep `list` looks below its folder: a study file there, or one in a folder of its own.
LIST_DEPTH = 2
STAGE_SUFFIX = ".nccl-stage"  # autotune.study.stages.STAGE_SUFFIX, without importing Optuna for --help


def study_files(folder: Path) -> list[Path]:
    """The YAML files under `folder` (LIST_DEPTH deep, hidden folders left out) with a `study:` key."""
    found = []
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*/*.yaml"), *folder.glob("*.yml")]):
        if any(part.startswith(".") for part in path.relative_to(folder).parts[:-1]):
            continue
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and "study" in data and "search_space" in data:
            found.append(path)
    return found


def _trial_counts(study: Study) -> dict[str, int] | None:
    """The study's trials by state, None when its storage holds no such study yet (nothing is created)."""
    import optuna

    if not _storage_exists(study.storage):
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if study.name not in optuna.get_all_study_names(study.storage):
        return None
    trials = optuna.load_study(study_name=study.name, storage=study.storage).get_trials(deepcopy=False)
    return dict(Counter(t.state.name.lower() for t in trials))


def cmd_list(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    if not folder.is_dir():
        raise AutotuneError(f"{folder}: not a folder. Name the folder that holds your study files.")
    rows: list[dict[str, Any]] = []
    for path in study_files(folder):
        try:
            study = load_study(path, for_launch=False)
        except AutotuneError as exc:
            rows.append({"file": str(path), "study": None, "trials": None, "error": str(exc)})
            continue
        rows.append({"file": str(path), "study": study.name, "trials": _trial_counts(study), "error": None})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no study files in {folder} (a study file is a YAML file with `study:` and `search_space:`)")
        return 0
    width = max(len(row["file"]) for row in rows)
    for row in rows:
        if row["error"] is not None:
            what = f"does not load: {row['error']}"
        elif row["trials"] is None:
            what = f"{row['study']}: not run yet"
        else:
            counts = row["trials"]
            states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            total = sum(counts.values())
            what = f"{row['study']}: {total} trial{'' if total == 1 else 's'} ({states})"
        print(f"{row['file']:<{width}}  {what}")
    return 0


def _storage_exists(url: str) -> bool:
    """False for a SQLite file that is not there (opening it would create it)."""
    return not url.startswith("sqlite:///") or Path(url[len("sqlite:///") :]).is_file()


@dataclass
class Doomed:
    """What deleting a study removes."""

    optuna_studies: dict[str, int] = field(default_factory=dict)  # name -> its trials
    experiments: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (id, its runs)
    workdir: Path | None = None

    def lines(self, study: Study) -> list[str]:
        lines = []
        for name, n in self.optuna_studies.items():
            lines.append(f"  Optuna study {name} ({n} trials) in {study.storage}")
        for name, (_id, n) in self.experiments.items():
            lines.append(f"  MLflow experiment {name} ({n} runs, their artifacts) in {study.tracking_uri}")
        if self.workdir is not None:
            lines.append(f"  the folder {self.workdir} (node logs, the NCCL stage's files, reports)")
        return lines


def _doomed(study: Study) -> Doomed:
    import optuna

    doomed = Doomed()
    names = (study.name, study.name + STAGE_SUFFIX)
    if _storage_exists(study.storage):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        existing = set(optuna.get_all_study_names(study.storage))
        for name in names:
            if name in existing:
                trials = optuna.load_study(study_name=name, storage=study.storage).get_trials(deepcopy=False)
                doomed.optuna_studies[name] = len(trials)
    if _storage_exists(study.tracking_uri):
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=study.tracking_uri)
        for name in names:
            experiment = client.get_experiment_by_name(name)
            if experiment is not None:
                runs = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)
                doomed.experiments[name] = (str(experiment.experiment_id), len(runs))
    if study.workdir.is_dir():
        doomed.workdir = study.workdir
    return doomed


def cmd_delete(args: argparse.Namespace) -> int:
    study = load_study(args.study_file, for_launch=False)
    doomed = _doomed(study)
    if not (doomed.optuna_studies or doomed.experiments or doomed.workdir):
        print(f"nothing to delete: study {study.name} has no trials, runs or folder")
        return 0
    print(f"delete study {study.name}:")
    print("\n".join(doomed.lines(study)))
    print(f"  (the study file {study.path} stays)")
    if not args.yes:
        if not sys.stdin.isatty():
            raise AutotuneError("not deleted: stdin is not a terminal, nothing can confirm it. Pass --yes.")
        if input("delete these? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not deleted")
            return 0
    _delete(study, doomed)
    print(f"deleted study {study.name}")
    return 0


def _delete(study: Study, doomed: Doomed) -> None:
    import optuna

    for name in doomed.optuna_studies:
        optuna.delete_study(study_name=name, storage=study.storage)
    if doomed.experiments:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=study.tracking_uri)
        ids = [experiment_id for experiment_id, _runs in doomed.experiments.values()]
        for experiment_id in ids:
            client.delete_experiment(experiment_id)
        _purge(study.tracking_uri, ids)
    if doomed.workdir is not None:
        _remove_workdir(study, doomed.workdir)


def _purge(tracking_uri: str, ids: list[str]) -> None:
    """Remove deleted experiments for good (MLflow only marks them deleted, and a deleted experiment's name
    cannot be used again: a new run of the study would fail). A tracking server purges with its own gc."""
    if tracking_uri.startswith(("http://", "https://", "databricks")):
        print(
            f"note: the tracking server marks the experiments deleted; its `mlflow gc` removes them for good "
            f"(experiment ids {', '.join(ids)})"
        )
        return
    gc = ["gc", "--backend-store-uri", tracking_uri, "--experiment-ids", ",".join(ids)]
    done = subprocess.run(
        [sys.executable, "-m", "mlflow", *gc],
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri},  # gc resolves the artifacts through it
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise AutotuneError(
            f"the MLflow experiments {', '.join(ids)} are marked deleted but `mlflow gc` failed: "
            f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}. Run "
            f"`mlflow gc --backend-store-uri {tracking_uri}` to remove them for good."
        )


def _remove_workdir(study: Study, workdir: Path) -> None:
    """Remove the work dir, but keep a database file in it that still holds another study or experiment."""
    kept = {path for path in (_db_in(study.storage, workdir), _db_in(study.tracking_uri, workdir)) if path}
    kept = {path for path in kept if _holds_others(study, path)}
    if not kept:
        shutil.rmtree(workdir)
        return
    keep = {*kept, *(path.with_name(path.name + ".lock") for path in kept)}
    for entry in workdir.iterdir():
        if entry in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    print(f"kept {', '.join(map(str, sorted(kept)))}: it holds other studies' records")


def _db_in(url: str, workdir: Path) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url[len("sqlite:///") :])
    return path if path.parent.resolve() == workdir.resolve() and path.is_file() else None


def _holds_others(study: Study, path: Path) -> bool:
    """Whether the database at `path` (the study's storage or tracking store) still holds anything else."""
    url = f"sqlite:///{path}"
    if url == study.storage:
        import optuna

        if optuna.get_all_study_names(url):
            return True
    if url == study.tracking_uri:
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        experiments: list[Any] = MlflowClient(tracking_uri=url).search_experiments(view_type=ViewType.ALL)
        if any(e.name != "Default" for e in experiments):
            return True
    return False
