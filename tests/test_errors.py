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
