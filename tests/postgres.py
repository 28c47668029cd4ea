"""A real PostgreSQL server for tests: initdb in a temporary folder, on a free loopback port."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autotune.node.runner import free_port


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: .ci/run installs Debian's postgresql")
    return found


def _as_postgres(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; as root, run it as Debian's postgres user.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def postgres_server(root: Path) -> Iterator[str]:
    """Start a server with one database `autotune`; yields its SQLAlchemy URL; stops it afterwards."""
    data = root / "pgdata"
    data.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(data, "postgres")
    subprocess.run(
        _as_postgres([_binary("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
    )
    port = free_port()
    server = subprocess.Popen(
        _as_postgres(
            [_binary("postgres"), "-D", str(data), "-p", str(port), "-k", str(root), "-h", "127.0.0.1"]
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            ready = subprocess.run(
                [_binary("pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True
            )
            if ready.returncode == 0:
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("PostgreSQL did not start")
            time.sleep(0.2)
        subprocess.run(
            [_binary("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "autotune"],
            check=True,
            capture_output=True,
        )
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/autotune"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
