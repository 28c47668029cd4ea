"""`autotune ui` and `report`: the study shown through autotune.views (the MLflow UI, the HTML report)."""

from __future__ import annotations

import argparse
import sys

from autotune.cli.common import existing_study
from autotune.config import load_study
from autotune.errors import ConfigError


def cmd_ui(args: argparse.Namespace) -> int:
    from autotune.config.hosts import is_loopback
    from autotune.views.ui import REMOTE_WARNING, serve

    study = load_study(args.study_file, for_launch=False)
    if args.port is not None and not 1 <= args.port <= 65535:
        raise ConfigError(
            args.study_file, "--port", args.port, "not a TCP port", "Use 1..65535, or leave it out."
        )
    if not is_loopback(args.host):
        if not args.allow_remote:
            raise ConfigError(
                args.study_file,
                "--host",
                args.host,
                "listening beyond loopback exposes the UI, which has no login",
                "Add --allow-remote if you mean it, or use an SSH tunnel to 127.0.0.1.",
            )
        print(REMOTE_WARNING.format(host=args.host, port=args.port or "PORT"), file=sys.stderr)
    return serve(study, args.host, args.port)


def cmd_report(args: argparse.Namespace) -> int:
    from autotune.views.report import write_report

    study = load_study(args.study_file, for_launch=False)
    path = write_report(study, existing_study(study), args.out)
    print(f"report written to {path}")
    return 0
