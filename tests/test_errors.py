"""What autotune/errors.py promises: every exception class autotune defines derives from AutotuneError
(private ones that never leave their module aside)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import autotune
from autotune.errors import AutotuneError


def test_every_exception_class_derives_from_autotune_error() -> None:
    found, stray = [], []
    for module_info in pkgutil.walk_packages(autotune.__path__, "autotune."):
        if module_info.name == "autotune.__main__":  # importing it runs the CLI
            continue
        module = importlib.import_module(module_info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not issubclass(cls, BaseException):
                continue
            found.append(name)
            if not name.startswith("_") and not issubclass(cls, AutotuneError):
                stray.append(f"{module.__name__}.{name}")
    assert stray == []
    assert {"ConfigError", "BenchmarkError", "NodeBusy", "ResultLineError"} <= set(found)
