"""What autotune/errors.py promises: every exception class autotune defines derives from AutotuneError
(private ones that never leave their module aside)."""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
import pickle
import pkgutil

import pytest

import autotune
from autotune.errors import AutotuneError, ConfigError


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


def _all_subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_all_subclasses(sub))]


def _import_every_module() -> None:
    for module_info in pkgutil.walk_packages(autotune.__path__, "autotune."):
        if module_info.name != "autotune.__main__":
            importlib.import_module(module_info.name)


def test_every_autotune_error_survives_a_pickle_round_trip() -> None:
    """A worker process or a Ray actor sends its exception back pickled: each class (a new one too) must
    come back whole, whatever its __init__ takes."""
    _import_every_module()
    classes = _all_subclasses(AutotuneError)
    assert len(classes) >= 15
    for cls in [AutotuneError, *classes]:
        error = cls.__new__(cls, "what went wrong")
        error.args = ("what went wrong",)
        error.__dict__["detail"] = {"field": 1}
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls, cls
        assert (back.args, str(back), back.__dict__) == (error.args, str(error), error.__dict__), cls


@pytest.mark.integration  # a worker process
def test_a_config_error_raised_in_a_worker_process_reaches_the_parent() -> None:
    error = ConfigError("profile.yaml", "gpu.memory_gb", None, "missing", "Add it.")
    back = pickle.loads(pickle.dumps(error))
    assert (back.path, back.field, back.fix, str(back)) == (error.path, error.field, error.fix, str(error))
    with multiprocessing.get_context("fork").Pool(1) as pool:
        with pytest.raises(ConfigError, match=r"gpu\.memory_gb: missing"):
            pool.apply_async(_raise, (error,)).get(timeout=20)


def _raise(error: Exception) -> None:
    raise error


def test_problem_and_fix_errors_read_as_one_line_and_keep_their_parts() -> None:
    from autotune.config.hosts import AddressError, parse_ssh_address
    from autotune.node.runner import NodeUnreachableError

    try:
        parse_ssh_address("ssh://me@gpu-1:x")
    except AddressError as exc:
        assert str(exc) == f"{exc.problem}. {exc.fix}" and "port" in exc.problem and exc.fix
    else:
        raise AssertionError("a port that is not a number is an AddressError")
    lost = NodeUnreachableError("gpu-1", "connection refused", transient=False)
    default_fix = "Check the network and that sshd runs on the node."
    assert str(lost) == f"node gpu-1 unreachable: connection refused. {default_fix}"
    assert lost.fix == default_fix
    assert (lost.node, lost.reason, lost.transient) == ("gpu-1", "connection refused", False)
    refused = NodeUnreachableError("n", "host key refused", "Check known_hosts.")
    assert str(refused) == "node n unreachable: host key refused. Check known_hosts."
