"""`autotune`: run, resume and inspect studies from the command line.

Usage errors and bad files print one line and exit 2; a traceback appears only under --debug.

The parser, `main` and its error handling are here; each command's code is in the module of its group:
run.py (run, resume, remeasure, ablate, compare, enqueue: they change the study), answers.py (status,
best: they read it), files.py (validate, diagnose, init), views.py (ui, report), studies.py (list,
delete), console.py (the live progress), common.py (the exit statuses, opening an existing study).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from autotune.cli.answers import cmd_best, cmd_status
from autotune.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_STATUSES,
    EXIT_USAGE,
    exit_interrupted,
    stop_signals_interrupt,
)
from autotune.cli.files import cmd_diagnose, cmd_init, cmd_validate
from autotune.cli.run import cmd_ablate, cmd_compare, cmd_enqueue, cmd_remeasure, cmd_run
from autotune.cli.studies import cmd_delete, cmd_list
from autotune.cli.views import cmd_report, cmd_ui
from autotune.config import load_study
from autotune.config.init import DEFAULT_SERVER_COMMAND
from autotune.errors import AutotuneError, ConfigError, stop_signal
from autotune.trial.redaction import Secrets, redacted_output

# Each command imports what it runs inside its function, on purpose: `--help`, `validate` and `diagnose`
# load no Optuna, Ray, MLflow or matplotlib (seconds each), and a command loads only its own.


def _add_driver_options(command: argparse.ArgumentParser) -> None:
    """The options of the driver that runs trials: every command that runs trials takes them."""
    command.add_argument(
        "--no-ray",
        action="store_true",
        help="run the nodes' trials from this process instead of Ray actors (same runners and logs)",
    )
    command.add_argument("--no-tracking", action="store_true", help="write no MLflow runs")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = argparse.ArgumentParser(
        prog="autotune",
        description=__doc__.splitlines()[0],
        parents=[common],
        epilog="exit statuses:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_STATUSES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"autotune {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, parents=[common])

    for name, text in (
        ("run", "create or continue a study and run it to its budget"),
        ("resume", "continue an interrupted study (same as run)"),
    ):
        command = add(name, text)
        command.add_argument("study_file", type=Path, metavar="STUDY.yaml")
        command.add_argument(
            "--n-trials", type=int, help="the study's total trial budget (overrides the file)"
        )
        command.add_argument(
            "--hours",
            type=float,
            metavar="H",
            help="the study's total budget in node hours, spent ones included (overrides budget.node_hours)",
        )
        command.add_argument(
            "--accept-changes",
            action="store_true",
            help="continue even though the search space or objective changed since the study began (not "
            "other choices or another type for a knob the study has tried: Optuna keeps those per study)",
        )
        if name == "run":
            command.add_argument(
                "--from",
                type=Path,
                dest="from_study",
                metavar="OLD.yaml",
                help="start a new study from an earlier one (after an SGLang upgrade, a new model revision, "
                "a new node of the same kind): its answer and runner-up run first, after the baseline; what "
                "its nodes could not run is not proposed on the same GPUs; its noise stands in until this "
                "study measured its own",
            )
        _add_driver_options(command)

    status = add("status", "a table of the study's trials")
    status.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--trial", type=int, metavar="N", help="only trial N's row and notes")

    best = add("best", "the best config, its gain over the baseline, how to launch it")
    best.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    best.add_argument("--export", type=Path, metavar="FILE", help="write the best config's launch script")
    best.add_argument(
        "--trial", type=int, metavar="N", help="show trial N instead (e.g. one of a Pareto front)"
    )
    best.add_argument(
        "--json", action="store_true", help="print the config, its value, gain, interval and launch as JSON"
    )

    enqueue = add(
        "enqueue", "queue configs of your own: the next trials run them, then the sampler continues"
    )
    enqueue.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    enqueue.add_argument(
        "--set",
        action="append",
        default=[],
        dest="settings",
        metavar="NAME=VALUE",
        help="a knob of the search space and its value, e.g. --set mem-fraction-static=0.9 or "
        "--set=--mem-fraction-static=0.9 (a flag's dashes may be left out; null leaves it unset); "
        "repeat for more knobs; knobs not set take the baseline's values",
    )
    enqueue.add_argument(
        "--from-trial", type=int, metavar="N", help="knobs not set take trial N's values instead"
    )
    enqueue.add_argument(
        "--file",
        type=Path,
        metavar="CONFIGS.yaml",
        help="queue several configs: `configs:`, a list of mappings of knobs to values (`from_trial: N` "
        "in one takes the rest from trial N)",
    )
    enqueue.add_argument(
        "--accept-changes",
        action="store_true",
        help="queue even though the search space or objective changed since the study began",
    )

    remeasure = add("remeasure", "measure the top configs and the baseline again (objective.remeasure)")
    remeasure.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    _add_driver_options(remeasure)

    compare = add("compare", "measure the best config and the default again, interleaved: gain with a CI")
    compare.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    compare.add_argument("--rounds", type=int, default=8, help="runs of each config (default 8)")
    compare.add_argument("--trial", type=int, metavar="N", help="compare trial N instead of the best")
    compare.add_argument("--json", action="store_true", help="print the runs and summary as JSON")
    compare.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="where to write the runs and summary as JSON (default: compare.json in the study's work dir)",
    )
    _add_driver_options(compare)
    compare.add_argument("--ray", action="store_true", help=argparse.SUPPRESS)  # before 0.2: Ray is default

    diagnose = add("diagnose", "classify an SGLang server log: what killed it, and what to do")
    diagnose.add_argument("log_file", type=Path, metavar="LOGFILE")
    diagnose.add_argument("--json", action="store_true", help="print JSON instead of text")
    init = add("init", "write a study for the node in front of you: inspects its GPUs, SGLang and the model")
    init.add_argument("--model", required=True, metavar="PATH", help="the model's folder on the node")
    init.add_argument("--draft", metavar="PATH", help="an EAGLE-3 draft head's folder: speculative knobs too")
    init.add_argument(
        "--node", default="local", metavar="ADDRESS", help="local (default) or ssh://user@host:port"
    )
    init.add_argument("--key-file", metavar="FILE", help="the private key that logs in to an ssh:// node")
    init.add_argument("--known-hosts", metavar="FILE", help="the ssh:// node's host key (~/.ssh/known_hosts)")
    init.add_argument("--out", type=Path, default=Path("study.yaml"), metavar="STUDY.yaml", help="study.yaml")
    init.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    init.add_argument(
        "--port",
        help="the server's port on the node, or auto (default: auto for the simulated node, else 30000)",
    )
    init.add_argument("--name", help="the study's name (default: from the model folder and the GPUs)")
    init.add_argument(
        "--server-command",
        default=" ".join(DEFAULT_SERVER_COMMAND),
        metavar="CMD",
        help=f"how the node starts SGLang (default: {' '.join(DEFAULT_SERVER_COMMAND)})",
    )
    init.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the node's environment for SGLang, e.g. --env PYTHONPATH=/opt/sglang (repeatable; written to "
        "the study)",
    )
    listing = add("list", "the study files in a folder and how far each study has run")
    listing.add_argument(
        "folder", type=Path, nargs="?", default=Path("."), metavar="FOLDER", help="where to look (default: .)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of text")

    delete = add(
        "delete",
        "delete a study's trials, MLflow runs and work dir (other studies and the study file stay)",
    )
    delete.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    delete.add_argument("--yes", action="store_true", help="delete without asking")

    validate = add("validate", "check the study files; print the baseline launch")
    validate.add_argument("study_file", type=Path, metavar="STUDY.yaml")

    ui = add("ui", "open the MLflow UI on the study's runs (Ctrl-C stops it)")
    ui.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    ui.add_argument("--port", type=int, help="port to listen on (default: a free one)")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    ui.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host beyond loopback (the UI has no login: anyone who reaches it can edit runs)",
    )

    report = add("report", "write a self-contained HTML report of the study")
    report.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    report.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for report.html")

    ablate = add("ablate", "run the best config with each changed setting reverted, one trial each")
    ablate.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    _add_driver_options(ablate)
    ablate.add_argument("--dry-run", action="store_true", help="print the ablation trials; run nothing")
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autotune")
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return "(not installed)"


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one command, whose usage an error in that command's arguments shows."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would print the top-level usage: the command's says what it takes
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.debug = getattr(args, "debug", False)
    with redacted_output(_secrets(args)), stop_signals_interrupt():
        try:
            code = int(COMMANDS[args.command](args))
            sys.stdout.flush()  # here, so that a reader gone before the last line is caught below
            return code
        except BrokenPipeError:
            return _reader_gone()
        except ConfigError as exc:
            if args.debug:
                traceback.print_exc()  # here, where stderr redacts, not by Python after main returns
                return EXIT_FAILED
            print(f"autotune: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except AutotuneError as exc:
            if args.debug:
                traceback.print_exc()
                return EXIT_FAILED
            print(f"autotune: {exc}", file=sys.stderr)
            from autotune.study.interrupts import StudyInterrupted

            return exit_interrupted(exc.signum) if isinstance(exc, StudyInterrupted) else EXIT_FAILED
        except KeyboardInterrupt as exc:  # Ctrl-C outside a study's own handling (loading files, a study)
            signum = stop_signal(exc)
            how = "interrupted" if signum is signal.SIGINT else f"stopped by {signum.name}"
            print(f"autotune: {how}", file=sys.stderr)
            return exit_interrupted(signum)
        except Exception:
            traceback.print_exc()
            return EXIT_FAILED


def _reader_gone() -> int:
    """Stop quietly, as Unix tools do: no traceback, and what is still buffered goes nowhere."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno() if sys.__stdout__ else 1)
    return EXIT_BROKEN_PIPE


def _secrets(args: argparse.Namespace) -> Secrets:
    """What the command must not print: the environment's secrets and the study's (when it loads)."""
    secrets = Secrets.of(env=dict(os.environ))
    study_file = getattr(args, "study_file", None)
    if study_file is not None:
        with contextlib.suppress(Exception):  # the command itself reports a study file it cannot load
            secrets |= load_study(study_file, for_launch=False).secrets
    return secrets


COMMANDS = {
    "compare": cmd_compare,
    "diagnose": cmd_diagnose,
    "run": cmd_run,
    "resume": cmd_run,
    "status": cmd_status,
    "best": cmd_best,
    "remeasure": cmd_remeasure,
    "validate": cmd_validate,
    "init": cmd_init,
    "ui": cmd_ui,
    "report": cmd_report,
    "ablate": cmd_ablate,
    "enqueue": cmd_enqueue,
    "list": cmd_list,
    "delete": cmd_delete,
}
