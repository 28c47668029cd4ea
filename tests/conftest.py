"""Shared fixtures: the study-file builder, and one small study run through the real CLI, reused by the
tests that read it; and the rule that only a test marked `integration` starts a process."""

from __future__ import annotations

import _posixsubprocess
import functools
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune.node.runner import ServerProcess
from tests.builders import REPO, StudyFiles, e2e_study

N_TRIALS = 6
STARTUP = Path(__file__).resolve().parent / "startup"  # run by the Python processes the tests start
# The temporary folder of this host's other processes (another test run, a benchmark), before this session
# takes one of its own (`_a_temporary_folder_of_this_session`).
HOST_TMP = Path(tempfile.gettempdir())


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m autotune ARGS` in `cwd`, with this environment plus `env`."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


class _ProcessStarts:
    """Counts every process this Python process starts (subprocess, multiprocessing, os.fork), and keeps
    the commands started while `watching`."""

    def __init__(self) -> None:
        self.count = 0
        self.watching = False
        self.started: list[str] = []
        execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

        def popen(popen_self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> Any:
            self._note(args if isinstance(args, str) else " ".join(map(str, args)))
            return execute_child(popen_self, args, *rest, **kw)

        subprocess.Popen._execute_child = popen  # type: ignore[attr-defined]
        _posixsubprocess.fork_exec = self._noting("a multiprocessing child", _posixsubprocess.fork_exec)
        os.fork = self._noting("os.fork()", os.fork)

    def _noting(self, what: str, start: Callable[..., Any]) -> Callable[..., Any]:
        def noted(*args: Any, **kwargs: Any) -> Any:
            self._note(what)
            return start(*args, **kwargs)

        return noted

    def _note(self, what: str) -> None:
        self.count += 1
        if self.watching:
            self.started.append(what[:200])


# platform runs `uname -p` once and caches it; MLflow asks on import. Asked here, it is no test's process.
platform.processor()
_PROCESS_STARTS = _ProcessStarts()
_FIXTURES_THAT_START_PROCESSES: set[str] = set()  # a server shared by the tests that use it, say


# Under pytest-xdist (scripts/test runs `-n 2 --dist loadfile`), the costliest groups go out first, so the
# workers end together (benchmarks/test-durations.txt has the figures); the rest keep the collection order.
FIRST_GROUPS = (
    "tests/study/test_crash_resume.py",
    "tests/sim/test_landscape.py",
    "finished_study",
    "tests/test_benchmarks.py",
    "tests/node/test_ssh.py",
    "tests/test_objectives.py",  # the fast tier's costliest file, collected near its end
)


@functools.cache
def xdist_group(file: str) -> str:
    """The group of tests one worker runs: a test file (its module fixtures are built once), and the files
    that read the `finished_study` fixture together (one worker runs that study)."""
    return "finished_study" if "finished_study" in (REPO / file).read_text() else file


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the files of one `xdist_group` in one unit, in the collection's order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False  # by number of tests otherwise: the costliest are not the largest
    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the costliest groups first (the order is sent)
        rank = {group: n for n, group in enumerate(FIRST_GROUPS)}
        items.sort(key=lambda item: rank.get(xdist_group(item.nodeid.split("::", 1)[0]), len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Iterator[None]:
    before = _PROCESS_STARTS.count
    yield
    if _PROCESS_STARTS.count > before:
        _FIXTURES_THAT_START_PROCESSES.add(fixturedef.argname)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    # From the start of setup: a module fixture that a test is first to use starts its processes here.
    _PROCESS_STARTS.watching = item.get_closest_marker("integration") is None
    _PROCESS_STARTS.started = []
    yield


@pytest.fixture(autouse=True)
def _no_process_unless_integration(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that starts a process, or uses a fixture that did, must say so (`pytest.mark.integration`):
    `scripts/test --fast` runs the others, which must stay fast and need nothing but Python."""
    yield
    started, watching = _PROCESS_STARTS.started, _PROCESS_STARTS.watching
    _PROCESS_STARTS.watching, _PROCESS_STARTS.started = False, []
    if not watching:
        return
    uses = sorted(set(request.fixturenames) & _FIXTURES_THAT_START_PROCESSES)
    if started or uses:
        what = f"started {len(started)} process(es) ({started[0]!r} first)" if started else f"uses {uses}"
        pytest.fail(
            f"this test {what}, which start processes, but is not marked integration: add "
            "@pytest.mark.integration (or the module's pytestmark)",
            pytrace=False,
        )


@pytest.fixture(scope="session", autouse=True)
def _a_temporary_folder_of_this_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This session's own temporary folder (TMPDIR, here and in every process it starts): the node locks
    (autotune.node.lock) live there, so a simulated trial never waits for one of another test run or
    benchmark on this host, nor (under pytest-xdist) of another worker; Ray's session files go there too."""
    tmp_path_factory.getbasetemp()  # pytest's own folders stay where they were
    folder = Path(tempfile.mkdtemp(prefix="at-"))  # short: Ray's socket paths under it have a length limit
    folder.chmod(0o755)  # PostgreSQL's server runs as its own user below it (the postgres_url fixture)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _new_stores_from_a_copy(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A new MLflow store or Optuna storage, in this process and in every Python process a test starts,
    is a copy of an empty one built once this session (tests/startup/sitecustomize.py says why); under
    pytest-xdist, once for all the workers (their temporary folders share a parent; a store is built under
    a name of its own and renamed, so two workers never copy one half built)."""
    spec = importlib.util.spec_from_file_location("autotune_test_stores", STARTUP / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    stores = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stores)
    if hasattr(request.config, "workerinput"):
        folder = tmp_path_factory.getbasetemp().parent / "empty-stores"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("empty-stores")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(stores.STORES, str(folder))
        path = [str(STARTUP), *filter(None, [os.environ.get("PYTHONPATH")])]
        patch.setenv("PYTHONPATH", os.pathsep.join(path))
        stores.install()
        yield


@pytest.fixture
def study_file(tmp_path: Path) -> StudyFiles:
    """Writes study files into the test's tmp_path (tests/builders.py says how)."""
    return StudyFiles(tmp_path)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real OpenSSH server on loopback for the module's tests (tests/sshd.py); skipped without sshd."""
    from tests.sshd import SSHServer, sshd_unavailable  # loads Fabric: only for the tests that use it

    if sshd_unavailable():
        pytest.skip(str(sshd_unavailable()))
    server = SSHServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def finished_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    from autotune.config import load_study
    from autotune.study.storage import open_study

    tmp_path = tmp_path_factory.mktemp("study")
    # The product's trust on (a repeat of the baseline, the winner confirmed), the confirmation kept short.
    path = StudyFiles(tmp_path)(e2e_study(N_TRIALS, trust={"confirm": {"top": 1, "max_rounds": 2}}))
    # A trial that fails on the simulated SM120 node every time (expert parallelism's assertion; a flag the
    # GPU cannot run by its architecture is refused before a launch), so the finished study has a failure to
    # explain whatever the sampler proposes.
    open_study(load_study(path)).enqueue_trial({"--ep-size": 8})
    return path, run_cli("run", str(path), cwd=tmp_path)


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory):
    """A real PostgreSQL server started for the test session."""
    import shutil
    import tempfile

    from tests.postgres import postgres_server

    # Not under pytest's temporary folder: that one is private to this user, and PostgreSQL runs as another.
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    try:
        with postgres_server(root) as url:
            yield url
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    """Servers a test starts through a runner; any it leaves running are stopped after it."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.stop(grace_s=1)
