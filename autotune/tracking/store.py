"""Is the study's MLflow tracking store usable? A check of a few seconds, before anything slow starts.

MLflow itself finds out on its first write, after its HTTP retries (about four minutes against a port where
nothing listens), and then says so in a long traceback. `check_store` asks first: an MLflow server's
`/health` endpoint with a short time-out, or, for a store on this machine (sqlite:///, file:, a path),
whether its folder can be written. It imports no MLflow.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from autotune.errors import ConfigError

PROBE_TIMEOUT_S = 3.0
_FIX = "Start that server or fix tracking_uri in the study file, or pass --no-tracking to run without MLflow."


def store_problem(tracking_uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the store at `tracking_uri` cannot be written, in a few words; None when it can (or when it is a
    kind of store this check does not know, e.g. databricks: MLflow then says)."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme in ("http", "https"):
        return _server_problem(tracking_uri, timeout_s)
    if tracking_uri.startswith("sqlite:///"):
        return _folder_problem(Path(tracking_uri[len("sqlite:///") :]).parent)
    if parsed.scheme == "file":
        return _folder_problem(Path(parsed.path))
    if parsed.scheme == "" and tracking_uri:
        return _folder_problem(Path(tracking_uri))
    return None


def check_store(tracking_uri: str, study_file: Path) -> None:
    """Raise ConfigError naming the study file's `tracking_uri`, the problem and the way out, when the store
    cannot be written."""
    problem = store_problem(tracking_uri)
    if problem is not None:
        raise ConfigError(study_file, "tracking_uri", tracking_uri, problem, _FIX)


def _server_problem(uri: str, timeout_s: float) -> str | None:
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None  # something answers: a proxy or an older server without /health; MLflow's writes tell
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return f"no MLflow server answered within {timeout_s:g} s"
        return f"no MLflow server answers there ({getattr(reason, 'strerror', None) or reason})"


def _folder_problem(folder: Path) -> str | None:
    """The store's folder, or the nearest one above it that exists (the study creates the rest), must be a
    folder this process can write."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"the folder {existing} cannot be written"
    return None
