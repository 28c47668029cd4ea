"""`autotune`: run, resume and inspect studies from the command line.

Usage errors and bad files print one line and exit 2; a traceback appears only under --debug.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from autotune.config import Study, load_study
from autotune.errors import AutotuneError, ConfigError
from autotune.launch import describe_launch, launch_script, to_arg

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = argparse.ArgumentParser(prog="autotune", description=__doc__.splitlines()[0], parents=[common])
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
            "--accept-changes",
            action="store_true",
            help="continue even though the search space or objective changed since the study began",
        )

    status = add("status", "a table of the study's trials")
    status.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    best = add("best", "the best config, its gain over the baseline, how to launch it")
    best.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    best.add_argument("--export", type=Path, metavar="FILE", help="write the best config's launch script")

    diagnose = add("diagnose", "classify an SGLang server log: what killed it, and what to do")
    diagnose.add_argument("log_file", type=Path, metavar="LOGFILE")
    diagnose.add_argument("--json", action="store_true", help="print JSON instead of text")
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
    ablate.add_argument("--dry-run", action="store_true", help="print the ablation trials; run nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.debug = getattr(args, "debug", False)
    try:
        return int(COMMANDS[args.command](args))
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"autotune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AutotuneError as exc:
        if args.debug:
            raise
        print(f"autotune: {exc}", file=sys.stderr)
        from autotune.driver import StudyInterrupted

        return EXIT_INTERRUPTED if isinstance(exc, StudyInterrupted) else EXIT_FAILED


# -- run ----------------------------------------------------------------------------------------------
class ConsoleReporter:
    """Live progress on a terminal: a status line that rewrites itself, and one line per finished trial."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.live = stream.isatty()

    def __call__(self, event: str, progress: Any, info: dict[str, Any]) -> None:
        best = f"{progress.best:.1f}" if progress.best is not None else "-"
        base = f"{progress.baseline:.1f}" if progress.baseline is not None else "-"
        tail = f"best {best} · baseline {base}"
        if event == "finished":
            value = f"{info['value']:.1f}" if info.get("value") is not None else "-"
            label = "baseline" if info.get("baseline") else f"trial {info['number']}"
            why = f" ({info['failure']})" if info.get("failure") else ""
            self._line(
                f"[{progress.done:>3}/{progress.total}] {label:<9} {info['state']:<8} "
                f"{value:>8}{why:<22} {tail}"
            )
        elif event in ("phase", "started") and self.live:
            running = ", ".join(f"trial {n} {phase}" for n, phase in sorted(progress.running.items()))
            self._status(f"[{progress.done + 1:>3}/{progress.total}] {running} · {tail}")
        elif event == "recovered":
            self._line(f"recovered interrupted trials {info['trials']}: marked FAIL and queued again")
        elif event == "learned":
            pairs = ", ".join(f"{name}={value}" for name, value in info["incompatible"])
            self._line(f"known incompatible on this hardware, not tried again: {pairs}")
        elif event == "interrupting":
            self._line(f"stopping trials {info['trials']} (Ctrl-C again to stop at once)")

    def _status(self, text: str) -> None:
        self.stream.write("\r\033[K" + text)
        self.stream.flush()

    def _line(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.live else "") + text + "\n")
        self.stream.flush()


def cmd_run(args: argparse.Namespace) -> int:
    from autotune.driver import StudyDriver, study_summary

    study = load_study(args.study_file)
    if args.n_trials is not None and args.n_trials < 1:
        raise ConfigError(
            args.study_file,
            "--n-trials",
            args.n_trials,
            "the budget must be positive",
            "Pass --n-trials 1 or more.",
        )
    print(f"autotune: study {study.name!r}: storage {study.storage}", file=sys.stderr)
    print(f"autotune: MLflow tracking {study.tracking_uri}", file=sys.stderr)
    ostudy = StudyDriver(study, ConsoleReporter()).run(args.n_trials, accept_changes=args.accept_changes)
    summary = study_summary(ostudy)
    print(_summary_text(summary, study))
    return 0


def _summary_text(summary: dict[str, Any], study: Study) -> str:
    metric = study.objective.metric
    states = ", ".join(f"{v} {k.lower()}" for k, v in sorted(summary["states"].items()))
    lines = [f"study {study.name}: {states}"]
    base, best = summary["baseline_value"], summary["best_value"]
    lines.append(f"baseline {metric}: {base:.2f}" if base is not None else "baseline: did not complete")
    if best is not None:
        gain = f" ({summary['gain_pct']:+.1f}% over the baseline)" if summary["gain_pct"] is not None else ""
        lines.append(f"best {metric}: {best:.2f} (trial {summary['best_trial']}){gain}")
    return "\n".join(lines)


# -- status / best --------------------------------------------------------------------------------------
def _existing_study(study: Study) -> Any:
    """Load the study from its storage without creating anything when it does not exist."""
    import optuna

    if study.storage.startswith("sqlite:///") and not Path(study.storage[len("sqlite:///") :]).exists():
        raise AutotuneError(
            f"no study {study.name!r} yet in {study.storage}: start it with `autotune run {study.path}`"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=study.name, storage=study.storage)
    except KeyError:
        raise AutotuneError(
            f"no study {study.name!r} in {study.storage}: start it with `autotune run {study.path}`"
        ) from None


def _trial_record(trial: Any) -> dict[str, Any]:
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "params": dict(trial.params),
        "baseline": bool(trial.user_attrs.get("baseline")),
        "failure_kind": trial.user_attrs.get("failure_kind"),
        "failure": trial.user_attrs.get("failure"),
        "mlflow_run_id": trial.user_attrs.get("mlflow_run_id"),
    }


def cmd_status(args: argparse.Namespace) -> int:
    study = load_study(args.study_file)
    ostudy = _existing_study(study)
    trials = [_trial_record(t) for t in ostudy.get_trials(deepcopy=False)]
    if args.json:
        print(
            json.dumps(
                {
                    "study": study.name,
                    "storage": study.storage,
                    "tracking_uri": study.tracking_uri,
                    "trials": trials,
                },
                indent=2,
                default=str,
            )
        )
        return 0
    print(f"{'#':>4}  {'state':<8} {study.objective.metric:>18}  {'failure':<18}  changed from the baseline")
    for t in trials:
        value = f"{t['value']:.2f}" if t["value"] is not None else "-"
        changed = (
            "baseline"
            if t["baseline"]
            else " ".join(f"{k}={to_arg(v)}" for k, v in t["params"].items() if v not in (None, False))
        )
        print(f"{t['number']:>4}  {t['state']:<8} {value:>18}  {t['failure_kind'] or '':<18}  {changed}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from optuna.trial import FixedTrial

    from autotune.driver import best_trial, study_summary

    study = load_study(args.study_file)
    ostudy = _existing_study(study)
    best = best_trial(ostudy)
    if best is None:
        raise AutotuneError(f"study {study.name!r} has no completed trial yet")
    summary = study_summary(ostudy)
    is_baseline = bool(best.user_attrs.get("baseline"))
    config = (
        study.search_space.baseline() if is_baseline else study.search_space.suggest(FixedTrial(best.params))
    )
    script = launch_script(study.server_launch(config))
    print(_summary_text(summary, study))
    print("settings:" if config.params else "settings: SGLang's defaults (the baseline)")
    for name, value in config.params.items():
        if value not in (None, False):
            print(f"  {name} = {value}")
    for name, value in config.derived.items():
        print(f"  {name} = {value}  (set by SGLang's rules)")
    if args.export:
        args.export.write_text(script)
        args.export.chmod(0o755)
        print(f"launch script written to {args.export}")
    else:
        print("\n" + script)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    study = load_study(args.study_file)
    space = study.search_space
    print(f"study {study.name}: OK")
    print(
        f"  search space: {len(space.parameters)} parameters "
        f"({', '.join(sorted({p.kind for p in space.parameters.values()}))})"
    )
    print(f"  objective: {study.objective.goal} {study.objective.metric}")
    print(f"  storage: {study.storage}")
    print(f"  tracking: {study.tracking_uri}")
    print("baseline launch:")
    print("  " + describe_launch(study.server_launch(space.baseline())))
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from autotune.failures import Phase, classify
    from autotune.logwatch import READY_LINE

    try:
        text = args.log_file.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError(args.log_file, "", str(args.log_file), "cannot read the log", str(exc)) from None
    # After the ready line, a CUDA out-of-memory error happened under load, not at start.
    phase: Phase = "benchmarking" if READY_LINE in text else "starting"
    failure = classify(text, phase)
    if args.json:
        found = (
            None
            if failure is None
            else {
                "kind": failure.kind.value,
                "line": failure.line,
                "description": failure.description,
                "advice": failure.advice,
                "culprits": list(failure.culprits),
            }
        )
        print(json.dumps({"log": str(args.log_file), "phase": phase, "failure": found}, indent=2))
    elif failure is None:
        state = "it had served requests" if phase == "benchmarking" else "it never became ready"
        print(f"{args.log_file}: no known failure pattern ({state})")
    else:
        print(f"{args.log_file}: {failure.kind.value}: {failure.description}")
        print(f"  line:   {failure.line}")
        print(f"  advice: {failure.advice}")
    return 0 if failure is None else EXIT_FAILED


# -- ui / report / ablate -------------------------------------------------------------------------------
def cmd_ui(args: argparse.Namespace) -> int:
    from autotune.ui import REMOTE_WARNING, is_loopback, serve

    study = load_study(args.study_file)
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
    from autotune.report import write_report

    study = load_study(args.study_file)
    path = write_report(study, _existing_study(study), args.out)
    print(f"report written to {path}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from optuna.trial import TrialState

    from autotune.ablation import ablation_results, enqueue_ablation, mark_ablation_runs, plan_ablation
    from autotune.driver import StudyDriver
    from autotune.study_storage import budget_used

    study = load_study(args.study_file)
    ostudy = _existing_study(study)
    plan = plan_ablation(ostudy)
    print(f"ablation of trial {plan.of}: revert one setting at a time to the baseline's value")
    for name, value in plan.reverts.items():
        done = " (already run)" if name in plan.done else ""
        print(f"  {name} -> {'default' if value is None else to_arg(value)}{done}")
    for name, why in plan.not_ablated.items():
        print(f"  {name}: not reverted alone: {why}")
    if args.dry_run:
        return 0
    queued = enqueue_ablation(ostudy, plan)
    waiting = len(ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if waiting:
        print(
            f"autotune: running {waiting} queued trial(s) ({len(queued)} new ablation trial(s))",
            file=sys.stderr,
        )
        ostudy = StudyDriver(study, ConsoleReporter()).run(budget_used(ostudy) + waiting)
    mark_ablation_runs(study.tracking_uri, ostudy)
    result = ablation_results(ostudy)
    if result is not None:
        metric = study.objective.metric
        print(f"trial {result.of}: {metric} {result.best_value:.2f}; without each setting:")
        for row in result.rows:
            if row.loss is None:
                print(f"  {row.param:<36} {row.state.lower()} ({row.failure_kind}): needed to run")
            else:
                share = f", {row.share_of_gain:.0%} of the gain" if row.share_of_gain is not None else ""
                print(f"  {row.param:<36} {row.value:.2f} ({-(row.loss_pct or 0.0):+.1f}%{share})")
    return 0


COMMANDS = {
    "diagnose": cmd_diagnose,
    "run": cmd_run,
    "resume": cmd_run,
    "status": cmd_status,
    "best": cmd_best,
    "validate": cmd_validate,
    "ui": cmd_ui,
    "report": cmd_report,
    "ablate": cmd_ablate,
}
