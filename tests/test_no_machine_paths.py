"""No absolute path of a development machine anywhere in the repository: code, docs, committed logs and
the committed stores (SQLite databases, also those inside .tar.gz/.tgz archives, read here since git grep
cannot see into them); and a committed store opens from wherever the repository is cloned."""

from __future__ import annotations

import io
import re
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import REPO

# A home or workspace folder, a pytest temporary folder, or an absolute path into a checkout of this
# repository or a study's work folder (`<anywhere>/examples/...`, `<anywhere>/.autotune/...`); and the
# scratch folders that held this project's files on the machines it was developed on. Paths a setup
# chooses on purpose (the device kit's /tmp/site and /tmp/model-8b, /usr/bin/env) are none of these, nor
# is a placeholder (`<repo>/examples`, `$W/examples`, `{study_dir}/.autotune`) or a URL's path.
_STARTS = rb"(?:^|(?<=[\s\"'`=(\[,:;|])|(?<=file://)|(?<=sqlite:///))"
_FOLDER = rb"[^\s\"'/:<>${}]+"
MACHINE_PATH = re.compile(
    _STARTS
    + rb"(?:/(?:work|root|home|Users)/"
    + rb"|\x2ftmp/pytest"
    + rb"|/tmp/(?:h200\w*|dialect_wheels)\b"
    + rb"|(?:/"
    + _FOLDER
    + rb")+/(?:examples|benchmarks|search_spaces|objectives|\.autotune|mlruns)/)",
    re.MULTILINE,
)
SQLITE_MAGIC = b"SQLite format 3\x00"


def _tracked() -> list[str]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.decode(errors='replace').strip()}")
    return [name for name in done.stdout.decode().split("\0") if name]


def _texts(name: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    """(where, text) for a file: itself, each member of an archive, each value of a database (the raw
    bytes too: a rewritten database can keep old text in its free pages)."""
    yield name, data
    if name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    yield from _texts(f"{name}!{member.name}", extracted.read())
    elif data.startswith(SQLITE_MAGIC):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "store.db"
            path.write_bytes(data)
            con = sqlite3.connect(path)
            try:
                tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
                for table in tables:
                    for row in con.execute(f'SELECT * FROM "{table}"'):
                        for value in row:
                            if isinstance(value, str):
                                yield f"{name}:{table}", value.encode()
            finally:
                con.close()


def machine_paths(name: str, data: bytes) -> list[str]:
    """Each development-machine path in a file, as `where: path`."""
    found = []
    for where, text in _texts(name, data):
        for match in MACHINE_PATH.finditer(text):
            line = text[match.start() : match.start() + 80].split(b"\n")[0]
            found.append(f"{where}: {line.decode(errors='replace')}")
    return found


def test_the_pattern_finds_what_it_must() -> None:
    # `\x2f` is `/`: so written, the examples do not show up in a `git grep` for such paths.
    found = [
        b"storage sqlite:///\x2fwork/main/examples/.autotune/s/optuna.db",
        b'"artifact_uri": "file://\x2ftmp/h200b/examples/.autotune/s/artifacts/1/artifacts"',
        b"written to \x2froot/out/compare.json",
        b"--basetemp \x2ftmp/pytest-of-dev/pytest-3",
        b"\x2fsrv/clone/benchmarks/gpu-run/run.log",
        b"--sglang-path \x2ftmp/dialect_wheels/src0.5.17",
        b"\x2fhome/dev/.cache",
        b"names its artifacts at `\x2ftmp/h200/...` (run 1)",
    ]
    kept = [
        b"#!/usr/bin/env bash",
        b"model_path: /tmp/model-8b",
        b"PYTHONPATH=/tmp/site",
        b'File "/usr/local/lib/python3.12/dist-packages/sglang/srt/server_args.py"',
        b"sqlite:///<repo>/examples/.autotune/nccl-h200x2/optuna.db",
        b"artifacts/068f04731f66410080e7e01d7ae56112/artifacts",
        b"https://github.com/sgl-project/sglang/blob/main/python/sglang/bench_serving.py",
        b"see examples/sglang-h200.yaml and benchmarks/gpu-run/",
        b"storage sqlite:///$W/examples/.autotune/sglang-h200/optuna.db",
        b'f"sqlite:///{study_dir}/.autotune/quickstart/optuna.db"',
        b"https://github.com/sgl-project/sglang/tree/main/examples/runtime",
    ]
    assert [line for line in found if not MACHINE_PATH.search(line)] == []
    assert [line for line in kept if MACHINE_PATH.search(line)] == []


def test_a_store_inside_an_archive_is_read(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE runs (artifact_uri TEXT)")
        con.execute("INSERT INTO runs VALUES ('file://\x2fwork/main/x/artifacts/1/artifacts')")
    con.close()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(db, arcname=".autotune/s/mlflow.db")
    found = machine_paths("study.tar.gz", buffer.getvalue())
    assert any(f.startswith("study.tar.gz!.autotune/s/mlflow.db:runs: \x2fwork/main/") for f in found), found


@pytest.mark.integration  # git ls-files
def test_no_development_machine_path_is_committed() -> None:
    found = []
    for name in _tracked():
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            found += machine_paths(name, path.read_bytes())
    assert found == [], "absolute paths of a development machine:\n" + "\n".join(found[:40])


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_committed_nccl_store_opens_from_anywhere(tmp_path: Path) -> None:
    """benchmarks/gpu-run's MLflow store, in a copy of the study's folders elsewhere: `autotune ui` serves
    each run's artifacts (their locations are relative to the store, see scripts/portable_store.py)."""
    from mlflow.tracking import MlflowClient

    from autotune.config import load_study
    from autotune.views.ui import experiment_id, start_ui

    for folder in ("examples", "search_spaces", "objectives"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns(".autotune"))
    study = load_study(tmp_path / "examples" / "nccl-h200x2.yaml")
    study.workdir.mkdir(parents=True)
    shutil.copy(REPO / "benchmarks" / "gpu-run" / "mlflow.db", study.workdir)
    with tarfile.open(REPO / "benchmarks" / "gpu-run" / "artifacts.tgz") as tar:
        tar.extractall(study.workdir, filter="data")
    experiment = experiment_id(study)
    assert experiment is not None
    runs = MlflowClient(study.tracking_uri).search_runs([experiment])
    assert len(runs) == 35 and all(not r.info.artifact_uri.startswith(("/", "file:")) for r in runs)
    run = next(r for r in runs if "autotune.trial" in r.data.tags)  # a trial's run: it has launch.sh
    server = start_ui(study)
    try:
        url = f"{server.url}get-artifact?path=launch.sh&run_uuid={run.info.run_id}"
        with urllib.request.urlopen(url, timeout=30) as response:
            launch = response.read().decode()
    finally:
        server.stop()
    assert launch.startswith("#!/usr/bin/env bash") and "--graph-iters" in launch


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_portable_store_makes_a_moved_store_open_from_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written where a study ran, then moved: scripts/portable_store.py rewrites its paths, and
    MLflow and Optuna read it from its new folder."""
    import sys

    import optuna
    from mlflow.tracking import MlflowClient

    ran, moved = tmp_path / "ran" / ".autotune" / "s", tmp_path / "elsewhere"
    ran.mkdir(parents=True)
    client = MlflowClient(f"sqlite:///{ran / 'mlflow.db'}")
    experiment = client.create_experiment("s", artifact_location=(ran / "artifacts").as_uri())
    run = client.create_run(experiment).info.run_id
    (tmp_path / "launch.sh").write_text("#!/usr/bin/env bash\n")
    client.log_artifact(run, str(tmp_path / "launch.sh"))
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{ran / 'optuna.db'}")
    study.set_user_attr("config", {"study_file": str(tmp_path / "ran" / "s.yaml"), "objective": "o"})
    del client, study
    shutil.move(ran, moved)

    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "portable_store.py"), str(moved)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "mlflow.db: 3 locations" in done.stdout and "optuna.db: 1 study files" in done.stdout
    found = [
        f for name in ("mlflow.db", "optuna.db") for f in machine_paths(name, (moved / name).read_bytes())
    ]
    assert found == [] and str(tmp_path).encode() not in (moved / "mlflow.db").read_bytes()
    monkeypatch.chdir(moved)
    client = MlflowClient("sqlite:///mlflow.db")
    assert client.get_run(run).info.artifact_uri == f"artifacts/{run}/artifacts"
    assert [a.path for a in client.list_artifacts(run)] == ["launch.sh"]
    attrs = optuna.load_study(study_name="s", storage="sqlite:///optuna.db").user_attrs["config"]
    assert attrs == {"study_file": "../../s.yaml", "objective": "o"}
    # Again, as for an archive whose other study was carried and not touched: nothing left to rewrite.
    again = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "portable_store.py"), str(moved)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 0 and "mlflow.db: already portable" in again.stdout, again.stderr
    assert client.get_run(run).info.artifact_uri == f"artifacts/{run}/artifacts"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_study_resumed_from_a_portable_store_keeps_its_new_artifacts_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A portable store carried elsewhere and resumed from another directory: new runs' artifacts land in
    the store. (The real H200 study's second and third sessions, resumed from carried stores, wrote theirs
    into the directory autotune ran in, outside the store that came back.)"""
    import sys

    from autotune.config import load_study
    from autotune.tracking.tracker import StudyTracker
    from tests.builders import StudyFiles, study_data

    study = load_study(StudyFiles(tmp_path / "ran")(study_data()))
    first = StudyTracker.of(study)
    old = first.client.create_run(first.experiment_id).info.run_id
    (tmp_path / "launch.sh").write_text("#!/usr/bin/env bash\n")
    first.client.log_artifact(old, str(tmp_path / "launch.sh"))
    del first
    shutil.move(tmp_path / "ran", tmp_path / "carried")
    portable = [sys.executable, str(REPO / "scripts" / "portable_store.py"), str(tmp_path / "carried")]
    assert subprocess.run(portable, capture_output=True, check=False).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    study = load_study(tmp_path / "carried" / "study.yaml")
    tracker = StudyTracker.of(study)
    new = tracker.client.create_run(tracker.experiment_id).info.run_id
    tracker.client.log_artifact(new, str(tmp_path / "launch.sh"))
    assert (study.workdir / "artifacts" / new / "artifacts" / "launch.sh").is_file()
    assert list(elsewhere.iterdir()) == []
    assert [a.path for a in tracker.client.list_artifacts(old)] == ["launch.sh"]


def test_results_say_how_to_open_the_stores() -> None:
    for results in ("RESULTS-gpu.md", "RESULTS-sglang-h200.md"):
        text = (REPO / "benchmarks" / results).read_text()
        assert "scripts/portable_store.py" in text and "mlflow ui --backend-store-uri" in text, results
