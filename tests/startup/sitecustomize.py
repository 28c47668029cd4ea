"""Empty stores built once a test session, for the test process and every Python process it starts.

MLflow runs some fifty migrations (seconds) to create a new SQLite store, and Optuna reads its migration
scripts for their head version on every storage it opens; the tests create a study, and so both stores, a
few hundred times, many of them in `autotune run` processes. tests/conftest.py calls `install()` and puts
this folder first on PYTHONPATH, so that Python runs this file at the start of the processes the tests start:
a new SQLite store (MLflow's or Optuna's) then starts as a copy of an empty one that MLflow or Optuna built
in this session's folder (AUTOTUNE_TEST_STORES), and each process reads Optuna's head version once.
Without AUTOTUNE_TEST_STORES (any process not started by a test) it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

STORES = "AUTOTUNE_TEST_STORES"  # the session's folder of empty stores


def _sqlite_file(url: str, make_parent: bool = False) -> Path | None:
    """The file of a new store at a `sqlite:///` URL (None for another store, a file that exists, or
    outside a test session); `make_parent`: its folder made first, as MLflow's store makes it."""
    if not url.startswith("sqlite:///") or "?" in url or not os.environ.get(STORES):
        return None
    path = Path(url.removeprefix("sqlite:///"))
    if make_parent and path.name != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    return path if path.name != ":memory:" and path.parent.is_dir() and not path.exists() else None


def _copy_of_empty(name: str, build: Callable[[Path], None], to: Path) -> None:
    """Copies the session's empty store `name` to `to`, building it first if no process has yet (built
    under a name of its own and renamed, so that two processes never copy a store half built)."""
    empty = Path(os.environ[STORES]) / name
    if not empty.exists():
        building = empty.with_name(f".{name}.{os.getpid()}")
        build(building)
        os.replace(building, empty)
    shutil.copy(empty, to)


def _mlflow(module: ModuleType) -> None:
    store = module.SqlAlchemyStore
    init = store.__init__
    if getattr(init, "copies_an_empty_store", False):
        return  # a pytest that a test starts installs this twice

    def build(path: Path) -> None:
        built = store.__new__(store)
        init(built, f"sqlite:///{path}", (path.parent / "artifacts").as_uri())
        built.engine.dispose()

    def from_a_copy(self: Any, db_uri: str, *args: Any, **kwargs: Any) -> None:
        new = _sqlite_file(db_uri, make_parent=True)
        if new is not None:  # by version: a test may start a process of another virtualenv
            _copy_of_empty(f"mlflow-{sys.modules['mlflow'].__version__}.db", build, new)
        init(self, db_uri, *args, **kwargs)

    from_a_copy.copies_an_empty_store = True  # type: ignore[attr-defined]
    store.__init__ = from_a_copy


def _optuna(module: ModuleType) -> None:
    storage, versions = module.RDBStorage, module._VersionManager
    init, read_head = storage.__init__, versions.get_head_version
    if getattr(init, "copies_an_empty_store", False):
        return
    heads: list[str] = []

    def head_version(self: Any) -> str:
        if not heads:
            heads.append(read_head(self))
        return heads[0]

    def build(path: Path) -> None:
        built = storage.__new__(storage)
        init(built, f"sqlite:///{path}")
        built.engine.dispose()

    def from_a_copy(self: Any, url: str, *args: Any, **kwargs: Any) -> None:
        new = _sqlite_file(url)
        if new is not None:
            _copy_of_empty(f"optuna-{sys.modules['optuna'].__version__}.db", build, new)
        init(self, url, *args, **kwargs)

    from_a_copy.copies_an_empty_store = True  # type: ignore[attr-defined]
    versions.get_head_version = head_version
    storage.__init__ = from_a_copy


PATCHES = {
    "mlflow.store.tracking.sqlalchemy_store": _mlflow,
    "optuna.storages._rdb.storage": _optuna,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a module of PATCHES once it is imported."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patches the modules of PATCHES, now if imported already, else once they are."""
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _PatchOnImport())


if os.environ.get(STORES):
    install()
