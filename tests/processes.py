"""Starting processes in tests and looking at them (through /proc): the commands, waits and the process
tree the runner tests share."""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from autotune.node.runner import ServerProcess


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an orphan may linger unreaped in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def python(code: str) -> list[str]:
    """The command that runs `code` (dedented) in this interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def wait_for(predicate: Callable[[], object], timeout_s: float = 15.0) -> None:
    """Poll `predicate` until it is true; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


T = TypeVar("T")


def ended_side_by_side(calls: dict[str, Callable[[], T]]) -> dict[str, Future[T]]:
    """Runs each call in a thread of its own, all at once (studies that mostly wait on their servers and
    clocks), and returns their futures once all have ended: each test reads its own call's result, or
    meets its own call's error (a failed assertion or pytest.fail included)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return {name: pool.submit(call) for name, call in calls.items()}


def side_by_side(*calls: Callable[[], T]) -> list[T]:
    """The results of `calls` run side by side (ended_side_by_side), in order; the first one's error."""
    futures = ended_side_by_side({str(n): call for n, call in enumerate(calls)})
    return [future.result() for future in futures.values()]


def own_node_locks() -> dict[str, str]:
    """An environment whose node locks (autotune.node.lock, under TMPDIR) are its own: studies run side by
    side on the simulated `local` node instead of each trial waiting for the other study's."""
    return {"TMPDIR": tempfile.mkdtemp(prefix="n-")}  # in the session's own temporary folder


def study_servers(workdir: Path, study: str) -> tuple[set[int], set[int]]:
    """The process groups and ports the servers of study `study`'s launched trials ran in, from its stores
    in `workdir` (optuna.db, mlflow.db): each trial's recorded server process group, and the port in its
    MLflow run's result.json (the one the node picked, for `port: auto`)."""
    import json

    import optuna
    from mlflow.tracking import MlflowClient

    from autotune.study.records import MLFLOW_RUN_ATTR, SERVER_PGID_ATTR

    trials = optuna.load_study(study_name=study, storage=f"sqlite:///{workdir / 'optuna.db'}").get_trials()
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    pgids, ports = set(), set()
    for trial in trials:
        if trial.user_attrs.get(SERVER_PGID_ATTR) is not None:
            pgids.add(int(trial.user_attrs[SERVER_PGID_ATTR]))
        run_id = trial.user_attrs.get(MLFLOW_RUN_ATTR)
        if run_id is not None and "result.json" in {a.path for a in client.list_artifacts(run_id)}:
            port = json.loads(Path(client.download_artifacts(run_id, "result.json")).read_text()).get("port")
            if port:
                ports.add(int(port))
    return pgids, ports


def left_behind(pgids: Iterable[int], ports: Iterable[int]) -> list[str]:
    """The live processes ('PID: COMMAND') in one of the process groups `pgids`, or with `--port P` for
    one of `ports` on their command line (a server that left its group): what stopped servers that ran
    there left running."""
    groups, flags = set(pgids), {str(port) for port in ports}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError):
            continue  # ended while we looked
        if fields[0] in ("Z", "X"):
            continue
        on_port = any(a == "--port" and b in flags for a, b in itertools.pairwise(argv))
        on_port = on_port or any(a.startswith("--port=") and a[len("--port=") :] in flags for a in argv)
        if int(fields[3]) in groups or on_port:
            found.append(f"{entry.name}: {' '.join(argv).strip()}")
    return found


def line_of(server: ServerProcess, prefix: str, timeout_s: float = 15.0) -> str:
    """The first line of `server`'s log that starts with `prefix`, once it is there."""

    def found() -> str | None:
        return next((line for line in server.read_log().splitlines() if line.startswith(prefix)), None)

    wait_for(found, timeout_s)
    return str(found())


# A server that starts a helper in its group (as SGLang starts its scheduler), both ignoring SIGTERM when
# told to (argv[1] "ignore"); each prints its pid and process group.
TREE = """
import os, signal, subprocess, sys
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
helper = subprocess.Popen([sys.executable, "-c",
    "import os, signal, sys, time\\n"
    "if sys.argv[1] == 'ignore': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "print('helper', os.getpid(), os.getpgid(0), flush=True)\\n"
    "time.sleep(60)", sys.argv[1]])
print("server", os.getpid(), os.getpgid(0), flush=True)
helper.wait()
"""
