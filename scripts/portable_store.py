#!/usr/bin/env python3
"""Make a study's SQLite stores portable before they are committed: every path in them relative to them.

MLflow keeps each run's artifact location as an absolute `file://` URI, and autotune records the study
file's absolute path in the Optuna study; committed as they are, they name the folder the study ran in on
some machine. For each `mlflow.db` and `optuna.db` found in FOLDER (or inside the archive FILE.tar.gz /
FILE.tgz, rewritten in place), this

- writes MLflow's artifact locations under the store's folder as paths relative to it
  (`artifacts/<run>/artifacts`) and the Default experiment's `<anywhere>/mlruns/0` as `mlruns/0`;
- writes the Optuna study's `study_file` relative to the store's folder;
- merges Optuna's write-ahead log into the database (and drops the log) and compacts both (VACUUM),
  so that no old text is left in free pages.

The folder the store was in when the study ran is read from the experiment autotune created (artifacts at
`<folder>/artifacts`); `--was` gives it where that does not hold. MLflow reads relative locations against
the current folder: open a portable store from its own folder, `cd FOLDER && mlflow ui
--backend-store-uri sqlite:///mlflow.db` (what `autotune ui` does for a study's store).

    python scripts/portable_store.py benchmarks/gpu-run
    python scripts/portable_store.py benchmarks/sglang-h200/run2/study.tar.gz
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sqlite3
import sys
import tarfile
import tempfile
from contextlib import closing
from pathlib import Path, PurePosixPath

SQLITE_SIDE_FILES = ("-wal", "-shm")


def _folder_was(mlflow_db: Path) -> str | None:
    """The folder the store was in when it was written: autotune's experiment keeps artifacts in
    `<folder>/artifacts`."""
    with closing(sqlite3.connect(mlflow_db)) as con:
        for (location,) in con.execute("SELECT artifact_location FROM experiments"):
            path = location.removeprefix("file://")
            if path.startswith("/") and PurePosixPath(path).name == "artifacts":
                return str(PurePosixPath(path).parent)
    return None


def _absolute_locations(mlflow_db: Path) -> int:
    """How many experiments and runs keep their artifacts at an absolute location."""
    with closing(sqlite3.connect(mlflow_db)) as con:
        (count,) = con.execute(
            "SELECT (SELECT count(*) FROM experiments WHERE artifact_location LIKE '/%' OR artifact_location "
            "LIKE 'file:///%') + (SELECT count(*) FROM runs WHERE artifact_uri LIKE '/%' OR artifact_uri "
            "LIKE 'file:///%')"
        ).fetchone()
    return int(count)


def _relative(path: str, was: str) -> str:
    """`path` (a file:// URI or a path) relative to `was`; a Default experiment's mlruns as `mlruns/N`."""
    plain = path.removeprefix("file://")
    if not plain.startswith("/"):
        return path
    if plain == was or plain.startswith(was + "/"):
        return os.path.relpath(plain, was)
    parts = PurePosixPath(plain).parts
    if "mlruns" in parts:
        return str(PurePosixPath(*parts[parts.index("mlruns") :]))
    return os.path.relpath(plain, was)


def rewrite_mlflow(db: Path, was: str) -> int:
    """Relative artifact locations in an MLflow store; returns how many values changed."""
    changed = 0
    with closing(sqlite3.connect(db)) as con, con:
        for table, key, column in (
            ("experiments", "experiment_id", "artifact_location"),
            ("runs", "run_uuid", "artifact_uri"),
        ):
            for ident, value in con.execute(f"SELECT {key}, {column} FROM {table}").fetchall():
                new = _relative(value, was) if value else value
                if new != value:
                    con.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (new, ident))
                    changed += 1
    _compact(db)
    return changed


def rewrite_optuna(db: Path, was: str) -> int:
    """The study file's path relative to the store in an Optuna store; returns how many values changed."""
    changed = 0
    with closing(sqlite3.connect(db)) as con, con:
        rows = con.execute("SELECT study_id, key, value_json FROM study_user_attributes").fetchall()
        for study_id, key, value_json in rows:
            value = json.loads(value_json)
            if not (isinstance(value, dict) and str(value.get("study_file", "")).startswith("/")):
                continue
            value["study_file"] = _relative(value["study_file"], was)
            con.execute(
                "UPDATE study_user_attributes SET value_json = ? WHERE study_id = ? AND key = ?",
                (json.dumps(value), study_id, key),
            )
            changed += 1
    _compact(db)
    return changed


def _compact(db: Path) -> None:
    con = sqlite3.connect(db, isolation_level=None)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")  # the log merged: the database file holds everything
        con.execute("VACUUM")
    finally:
        con.close()
    for suffix in SQLITE_SIDE_FILES:
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def rewrite_folder(folder: Path, was: str | None = None) -> list[str]:
    """Rewrite every store under `folder`; returns a line per store saying what changed."""
    said = []
    for mlflow_db in sorted(folder.rglob("mlflow.db")):
        origin = was or _folder_was(mlflow_db)
        if origin is None and not _absolute_locations(mlflow_db):
            said.append(f"{mlflow_db.relative_to(folder)}: already portable")  # a store carried, not written
            continue
        if origin is None:
            raise SystemExit(
                f"{mlflow_db}: no experiment keeps its artifacts in <folder>/artifacts: give --was"
            )
        said.append(f"{mlflow_db.relative_to(folder)}: {rewrite_mlflow(mlflow_db, origin)} locations")
        optuna_db = mlflow_db.with_name("optuna.db")
        if optuna_db.exists():
            said.append(f"{optuna_db.relative_to(folder)}: {rewrite_optuna(optuna_db, origin)} study files")
    return said


def rewrite_archive(archive: Path, was: str | None = None) -> list[str]:
    """Rewrite the stores inside a .tar.gz in place: same members in the same order, the stores replaced
    and their SQLite side files (write-ahead log, shared memory) left out."""
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
        members = tar.getmembers()
        tar.extractall(tmp, filter="data")
        said = rewrite_folder(Path(tmp), was)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as out:
            for member in members:
                path = Path(tmp) / member.name
                if not path.exists() and member.isfile():
                    continue  # a side file the rewrite merged away
                if member.isfile():
                    member.size = path.stat().st_size
                    with open(path, "rb") as data:
                        out.addfile(member, data)
                else:
                    out.addfile(member)
    archive.write_bytes(buffer.getvalue())
    return said


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    cli.add_argument("stores", nargs="+", type=Path, help="a folder holding the stores, or a .tar.gz of one")
    cli.add_argument("--was", help="the folder the stores were in when written (default: from MLflow)")
    args = cli.parse_args(argv)
    for target in args.stores:
        archive = target.name.endswith((".tar.gz", ".tgz"))
        said = rewrite_archive(target, args.was) if archive else rewrite_folder(target, args.was)
        if not said:
            print(f"{target}: no mlflow.db found", file=sys.stderr)
            return 1
        for line in said:
            print(f"{target}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
