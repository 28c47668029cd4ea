"""`autotune`: run, resume and inspect studies from the command line.

Usage errors and bad files print one line and exit 2; a traceback appears only under --debug.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from autotune.config import Study, load_study
from autotune.config.init import DEFAULT_SERVER_COMMAND
from autotune.config.objective import METRICS
from autotune.errors import AutotuneError, ConfigError
from autotune.study.callbacks import (
    IncompatibilityLearned,
    KnobHeld,
    PhaseChanged,
    Progress,
    StudyCallback,
    StudyInterrupting,
    StudyStarted,
    TrialFinished,
    TrialStarted,
)
from autotune.study.records import (
    BASELINE_ATTR,
    CONFIRM_ATTR,
    FAILURE_ATTR,
    FAILURE_DESCRIPTION_ATTR,
    FAILURE_KIND_ATTR,
    LOAD_WARNING_ATTR,
    MLFLOW_RUN_ATTR,
    OVER_LIMITS_ATTR,
    PROPOSED_ATTR,
    PRUNED_BY_ATTR,
    QUEUED_ATTR,
    REMEASURE_OF_ATTR,
    SAME_AS_ATTR,
    SHORT_VALUE_ATTR,
)
from autotune.study.rules import best_trial, is_feasible, trial_config
from autotune.trial.launch import ServerLaunch, TrialConfig, describe_launch, is_set, launch_script, to_arg
from autotune.trial.redaction import REDACTED, Secrets, argv_secrets, is_secret_name, redacted_output

# Each command imports what it runs inside its function, on purpose: `--help`, `validate` and `diagnose`
# load no Optuna, Ray, MLflow or matplotlib (seconds each), and a command loads only its own.
if TYPE_CHECKING:  # the driver loads Optuna, Ray and MLflow: only the commands that run trials import it
    from autotune.study.loop import StudyDriver

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
# The reader of stdout went away (`autotune status | head`): the status a Unix tool killed by SIGPIPE has.
EXIT_BROKEN_PIPE = 141


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
            help="continue even though the search space or objective changed since the study began (not "
            "other choices or another type for a knob the study has tried: Optuna keeps those per study)",
        )
        _add_driver_options(command)

    status = add("status", "a table of the study's trials")
    status.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

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
    compare.add_argument("--json", type=Path, metavar="FILE", help="where to write the runs and summary")

    diagnose = add("diagnose", "classify an SGLang server log: what killed it, and what to do")
    diagnose.add_argument("log_file", type=Path, metavar="LOGFILE")
    diagnose.add_argument("--json", action="store_true", help="print JSON instead of text")
    init = add("init", "write a study for the node in front of you: inspects its GPUs, SGLang and the model")
    init.add_argument("--model", required=True, metavar="PATH", help="the model's folder on the node")
    init.add_argument("--draft", metavar="PATH", help="an EAGLE-3 draft head's folder: speculative knobs too")
    init.add_argument("--node", default="local", metavar="ADDRESS", help="local (default) or ssh://user@host:port")
    init.add_argument("--key-file", metavar="FILE", help="the private key that logs in to an ssh:// node")
    init.add_argument("--known-hosts", metavar="FILE", help="the ssh:// node's host key (~/.ssh/known_hosts)")
    init.add_argument("--out", type=Path, default=Path("study.yaml"), metavar="STUDY.yaml", help="study.yaml")
    init.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    init.add_argument("--port", default="30000", help="the server's port on the node, or auto")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.debug = getattr(args, "debug", False)
    with redacted_output(_secrets(args)):
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
            from autotune.study.loop import StudyInterrupted

            return EXIT_INTERRUPTED if isinstance(exc, StudyInterrupted) else EXIT_FAILED
        except KeyboardInterrupt:  # Ctrl-C outside a study's own handling (loading files, reading a study)
            print("autotune: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
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


# -- run ----------------------------------------------------------------------------------------------
class ConsoleReporter(StudyCallback):
    """Live progress on a terminal: a status line that rewrites itself, and one line per finished trial."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.live = stream.isatty()

    def study_started(self, event: StudyStarted) -> None:
        if event.recovered:
            self._line(f"recovered interrupted trials {list(event.recovered)}: marked FAIL and queued again")

    def trial_started(self, event: TrialStarted) -> None:
        self._running(event.progress)

    def trial_phase_changed(self, event: PhaseChanged) -> None:
        self._running(event.progress)

    def trial_finished(self, event: TrialFinished) -> None:
        progress, outcome = event.progress, event.outcome
        value = f"{outcome.value:.1f}" if outcome.value is not None else "-"
        label = "baseline" if event.baseline else f"trial {event.number}"
        # A launched trial's failure kind; a refused one's reason, which names the setting refused.
        reason = outcome.refusal or (outcome.failure_kind.value if outcome.failure_kind else None)
        why = f" ({reason})" if reason else ""
        self._line(
            f"[{progress.done:>3}/{progress.total}] {label:<9} {outcome.state.name:<8} "
            f"{value:>8}{why:<22} {self._tail(progress)}"
        )

    def incompatibility_learned(self, event: IncompatibilityLearned) -> None:
        pairs = ", ".join(f"{name}={value}" for name, value, _hardware in event.known)
        self._line(f"known incompatible on this hardware, not tried again: {pairs}")

    def knob_held(self, event: KnobHeld) -> None:
        self._line(event.text)

    def study_interrupting(self, event: StudyInterrupting) -> None:
        self._line(f"stopping trials {list(event.trials)} (Ctrl-C again to stop at once)")

    def _running(self, progress: Progress) -> None:
        if self.live:
            running = ", ".join(f"trial {n} {phase}" for n, phase in sorted(progress.running.items()))
            self._status(f"[{progress.done + 1:>3}/{progress.total}] {running} · {self._tail(progress)}")

    @staticmethod
    def _tail(progress: Progress) -> str:
        best = f"{progress.best:.1f}" if progress.best is not None else "-"
        base = f"{progress.baseline:.1f}" if progress.baseline is not None else "-"
        return f"best {best} · baseline {base}"

    def _status(self, text: str) -> None:
        self.stream.write("\r\033[K" + text)
        self.stream.flush()

    def _line(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.live else "") + text + "\n")
        self.stream.flush()


def cmd_run(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

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
    ostudy = _driver(study, args).run(args.n_trials, accept_changes=args.accept_changes)
    ostudy = _remeasure(study, ostudy, args)
    summary = study_summary(ostudy)
    print(_summary_text(summary, study))
    if summary["pareto"] is None and (answer := _trust_record(ostudy)["answer"]) is not None:
        print(answer["text"])  # confirmed or not, with the noise
    from autotune.study.enqueue import waiting_line

    if waiting := waiting_line(ostudy, args.n_trials or study.file.budget.n_trials, args.study_file):
        print(waiting)  # configs queued by hand that the spent budget left waiting
    return 0


def _driver(study: Study, args: argparse.Namespace) -> StudyDriver:
    """The driver for every phase a command runs (trials, re-measurement, ablation), with its options."""
    from autotune.study.loop import StudyDriver
    from autotune.views.tracked import study_tracker

    driver = StudyDriver(study, [ConsoleReporter()], tracking=None if args.no_tracking else study_tracker)
    if args.no_ray:
        from autotune.node.pool import in_process_pool

        driver.make_pool = in_process_pool
    return driver


def _remeasure(study: Study, ostudy: Any, args: argparse.Namespace) -> Any:
    """Run the re-measurements the objective asks for (none without `remeasure`, none left to run)."""
    from autotune.study.remeasure import remeasure

    settings = study.objective.remeasure
    if settings is None:
        return ostudy

    def run(total: int) -> Any:
        print(
            f"autotune: re-measuring the top {settings.top} configs and the baseline until each has "
            f"{settings.repeats} measurements",
            file=sys.stderr,
        )
        return _driver(study, args).run(total)

    return remeasure(study, ostudy, run)


def cmd_remeasure(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

    study = load_study(args.study_file)
    if study.objective.remeasure is None:
        raise ConfigError(
            study.objective_path,
            "remeasure",
            None,
            "the objective does not ask for re-measurement",
            "Add e.g. `remeasure: {top: 3, repeats: 3}` to the objective file (then resume with "
            "--accept-changes).",
        )
    ostudy = _remeasure(study, _existing_study(study), args)
    print(_summary_text(study_summary(ostudy), study))
    return 0


def _summary_text(summary: dict[str, Any], study: Study) -> str:
    metric = study.objective.metric
    states = ", ".join(f"{v} {k.lower()}" for k, v in sorted(summary["states"].items()))
    lines = [f"study {study.name}: {states}"]
    if summary.get("pareto") is not None:
        return "\n".join([*lines, *_pareto_lines(summary["pareto"], study)])
    if summary.get("remeasured") is not None:
        return "\n".join([*lines, *_remeasured_lines(summary["remeasured"], study)])
    base, best = summary["baseline_value"], summary["best_value"]
    lines.append(f"baseline {metric}: {base:.2f}" if base is not None else "baseline: did not complete")
    if best is not None:
        gain = f" ({summary['gain_pct']:+.1f}% over the baseline)" if summary["gain_pct"] is not None else ""
        lines.append(f"best {metric}: {best:.2f} (trial {summary['best_trial']}){gain}")
    return "\n".join(lines)


def _pareto_lines(front: list[dict[str, Any]], study: Study) -> list[str]:
    """The Pareto front as a table: one trial a line, each optimized metric with its direction."""
    objective = study.objective
    arrows = {"maximize": "higher is better", "minimize": "lower is better"}
    if not front:
        return ["Pareto front: no feasible trial completed yet"]
    heads = "  ".join(f"{m:>18}" for m in objective.metrics)
    lines = [
        f"Pareto front: {len(front)} trial(s) no other feasible trial beats on every objective ("
        + "; ".join(f"{m}: {arrows[d]}" for m, d in zip(objective.metrics, objective.directions, strict=True))
        + ")",
        f"  {'trial':>5}  {heads}",
    ]
    for point in front:
        values = "  ".join(f"{v:>18.2f}" for v in point["values"])
        lines.append(f"  {point['number']:>5}  {values}")
    return lines


def _ci(low: float | None, high: float | None, pct: bool = False) -> str:
    if low is None or high is None:
        return "no interval (measured once)"
    unit = "%" if pct else ""
    sign = "+" if pct else ""
    return f"{low:{sign}.1f}{unit} to {high:{sign}.1f}{unit}" if pct else f"{low:.2f} to {high:.2f}"


def _remeasured_lines(answer: dict[str, Any], study: Study) -> list[str]:
    """The re-measured answer: the best mean with its interval, and the gain over the baseline's mean."""
    metric = study.objective.metric
    level = f"{answer['confidence']:.0%}"
    best, base = answer["best"], answer["baseline"]
    lines = []
    if base is not None and base["n"]:
        lines.append(
            f"baseline {metric}: {base['mean']:.2f} (mean of {base['n']}, {level} CI "
            f"{_ci(base['ci_low'], base['ci_high'])})"
        )
    else:
        lines.append("baseline: did not complete")
    label = (
        "the baseline"
        if best["trial"] == 0 and base and best["trial"] == base["trial"]
        else (f"trial {best['trial']}")
    )
    lines.append(
        f"best {metric}: {best['mean']:.2f} (mean of {best['n']}, {level} CI "
        f"{_ci(best['ci_low'], best['ci_high'])}; {label}, re-measured on trials "
        f"{', '.join(map(str, best['trials']))})"
    )
    if answer["gain_pct"] is not None:
        gain = (
            f"gain over the baseline: {answer['gain_pct']:+.1f}% ({level} CI "
            f"{_ci(answer['gain_ci_low_pct'], answer['gain_ci_high_pct'], pct=True)})"
        )
        if answer["within_noise"]:
            gain += (
                ": within noise, the interval reaches 0%, so these measurements cannot tell the best "
                "config from SGLang's defaults"
            )
        lines.append(gain)
    for group in answer["unreliable"]:
        lines.append(
            f"not ranked: trial {group['trial']}'s config failed or broke a limit when measured again "
            f"(trials {', '.join(map(str, group['failed']))})"
        )
    return lines


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
    values = trial.values
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": values[0] if values else None,
        "values": list(values) if values else None,
        "feasible": is_feasible(trial),
        "over_limits": trial.user_attrs.get(OVER_LIMITS_ATTR),
        "pruned_by": trial.user_attrs.get(PRUNED_BY_ATTR),
        "load_warning": trial.user_attrs.get(LOAD_WARNING_ATTR),
        "short_value": trial.user_attrs.get(SHORT_VALUE_ATTR),
        "remeasure_of": trial.user_attrs.get(REMEASURE_OF_ATTR),
        "same_as": trial.user_attrs.get(SAME_AS_ATTR),
        "confirm": trial.user_attrs.get(CONFIRM_ATTR),
        "proposed": trial.system_attrs.get(PROPOSED_ATTR),
        "queued": trial.user_attrs.get(QUEUED_ATTR),
        "params": dict(trial.params),
        "baseline": bool(trial.user_attrs.get(BASELINE_ATTR)),
        "failure_kind": trial.user_attrs.get(FAILURE_KIND_ATTR),
        "failure": trial.user_attrs.get(FAILURE_ATTR),
        "failure_description": trial.user_attrs.get(FAILURE_DESCRIPTION_ATTR),
        "mlflow_run_id": trial.user_attrs.get(MLFLOW_RUN_ATTR),
    }


def cmd_status(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

    study = load_study(args.study_file, for_launch=False)
    ostudy = _existing_study(study)
    trials = [_trial_record(t) for t in ostudy.get_trials(deepcopy=False)]
    summary = study_summary(ostudy)
    if args.json:
        print(
            json.dumps(
                {
                    "study": study.name,
                    "storage": study.storage,
                    "tracking_uri": study.tracking_uri,
                    "trials": trials,
                    "pareto": summary["pareto"],
                    "remeasured": summary["remeasured"],
                    **_trust_record(ostudy),
                },
                indent=2,
                default=str,
            )
        )
        return 0
    from autotune.views.status import fitted, terminal_width

    metrics, width = study.objective.metrics, terminal_width()
    heads = "  ".join(f"{m:>18}" for m in metrics)
    print(f"{'#':>4}  {'state':<10} {heads}  {'failure':<18}  changed from the baseline")
    for t in trials:
        values = t["values"] or [None] * len(metrics)
        shown = "  ".join(f"{v:>18.2f}" if v is not None else f"{'-':>18}" for v in values)
        changed = (
            "baseline"
            if t["baseline"]
            else " ".join(f"{k}={to_arg(v)}" for k, v in t["params"].items() if is_set(v))
        )
        state = "INFEASIBLE" if t["state"] == "COMPLETE" and not t["feasible"] else t["state"]
        row = f"{t['number']:>4}  {state:<10} {shown}  {t['failure_kind'] or '':<18}  "
        print("\n".join(fitted(row, changed, width)))  # full text in --json
        for note in _status_notes(t):
            print("\n".join(fitted(" " * 6, note, width)))
    over = [t for t in trials if t["over_limits"]]
    if over:
        print(
            f"{len(over)} trial(s) broke a limit (infeasible: never the answer); "
            + ", ".join(
                f"{m} <= {v:g}" if METRICS[m] == "minimize" else f"{m} >= {v:g}"
                for m, v in study.objective.limits.items()
            )
        )
    if summary["pareto"] is not None:
        print("\n".join(_pareto_lines(summary["pareto"], study)))
    elif summary["remeasured"] is not None:
        print("\n".join(_remeasured_lines(summary["remeasured"], study)))
    trust = _trust_record(ostudy)
    for line in (trust["stopped"], trust["answer"]["text"] if trust["answer"] else None):
        if line:
            print("\n".join(fitted("", line, width)))
    return 0


def _trust_record(ostudy: Any) -> dict[str, Any]:
    """What status and best show of the study's trust: its noise estimate, why its search stopped early,
    and its answer (confirmed or not: study.confirm.study_answer)."""
    from autotune.study.confirm import study_answer
    from autotune.study.noise import noise_estimate
    from autotune.study.stopping import stopped_early

    noise = noise_estimate(ostudy)
    return {
        "noise": noise.record() if noise is not None else None,
        "stopped": stopped_early(ostudy),
        "answer": study_answer(ostudy),
    }


def _status_notes(t: dict[str, Any]) -> list[str]:
    """What a trial's row alone does not say: a broken limit and by how much, a pruning, a re-measurement."""
    notes = [f"over the limit: {v['text']}" for v in (t["over_limits"] or {}).values()]
    if t["pruned_by"]:
        notes.append(f"pruned after the {t['pruned_by']}")
    if t.get("load_warning"):
        notes.append(f"warning: {t['load_warning']}")
    if t["confirm"] is not None:
        notes.append(f"confirmation round {t['confirm']['round']}: trial {t['remeasure_of']}'s config again")
    elif t["remeasure_of"] is not None:
        notes.append(f"re-measurement of trial {t['remeasure_of']}'s config")
    if t["same_as"] is not None:
        notes.append(f"same as trial {t['same_as']}: its launch again, not run (no node time, no budget)")
    if t["proposed"]:
        notes.append(t["proposed"])
    if t["queued"]:
        from autotune.study.enqueue import describe

        notes.append(describe(t["queued"]))
    from autotune.views.status import failure_sentence

    if sentence := failure_sentence(t):
        notes.append(sentence)
    return notes


def cmd_best(args: argparse.Namespace) -> int:

    from autotune.study.summary import study_summary

    study = load_study(args.study_file, for_launch=False)
    ostudy = _existing_study(study)
    summary = study_summary(ostudy)
    if args.trial is not None:
        best = next((t for t in ostudy.get_trials(deepcopy=False) if t.number == args.trial), None)
        if best is None:
            raise AutotuneError(f"study {study.name!r} has no trial {args.trial}")
    elif summary["pareto"] is not None:
        if args.json:
            print(json.dumps({"study": study.name, "pareto": summary["pareto"]}, indent=2))
            return 0
        print(_summary_text(summary, study))
        print("a multi-objective study has no single best: pick a trial of the front with --trial N")
        return 0
    else:
        best = best_trial(ostudy)
        if (answer := _trust_record(ostudy)["answer"]) is not None:  # confirmed: maybe SGLang's defaults
            best = next(t for t in ostudy.get_trials(deepcopy=False) if t.number == answer["trial"])
    if best is None:
        complete = summary["states"].get("COMPLETE", 0)
        if complete:
            raise AutotuneError(
                f"study {study.name!r} has no feasible trial: its {complete} complete trial(s) broke a limit "
                f"of the objective (`autotune status {study.path}` says by how much)"
            )
        raise AutotuneError(f"study {study.name!r} has no completed trial yet")
    config = trial_config(study, best)
    launch = study.server_launch(config)
    trust = _trust_record(ostudy) if args.trial is None else None
    if args.json:
        print(json.dumps(_best_record(study, summary, best, config, launch, trust), indent=2))
        return 0
    script = launch_script(launch)
    print(_summary_text(summary, study))
    if trust is not None and trust["answer"] is not None:
        print(trust["answer"]["text"])
    if args.trial is not None:
        print(f"trial {best.number}:")
    print("settings:" if config.params else "settings: SGLang's defaults (the baseline)")
    for name, value in config.params.items():
        if is_set(value):
            print(f"  {name} = {value}")
    for name, value in config.derived.items():
        print(f"  {name} = {value}  (set by SGLang's rules)")
    if args.export:
        args.export.write_text(study.secrets.redact(script))
        args.export.chmod(0o755)
        print(f"launch script written to {args.export}")
    else:
        print("\n" + script)
    return 0


def _best_record(
    study: Study,
    summary: dict[str, Any],
    best: Any,
    config: TrialConfig,
    launch: ServerLaunch,
    trust: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`autotune best --json`: the config, its value (the re-measured mean once there is one), the gain
    over the baseline and its interval, and the launch with every secret redacted; with `trust` (the
    study's answer, not a trial asked for), whether it is confirmed, its gain and interval from the
    confirmation rounds, and the noise estimate (study.confirm.study_answer)."""
    answer = summary["remeasured"]
    chosen = answer is not None and answer["best"]["trial"] == best.number
    measured = answer["best"] if chosen else None
    confirmed = trust["answer"] if trust is not None and trust["answer"] is not None else None
    verdict = (
        {}
        if confirmed is None
        else {
            key: confirmed[key]
            for key in ("confirmed", "beats_defaults", "rounds", "noise", "text")
            + (("value", "gain_pct", "gain_interval_pct") if confirmed["confirmed"] else ())
        }
    )
    return {
        "study": study.name,
        "metric": study.objective.metric,
        "trial": best.number,
        "baseline": bool(best.user_attrs.get(BASELINE_ATTR)),
        "value": measured["mean"] if measured else best.value,
        "interval": [measured["ci_low"], measured["ci_high"]]
        if measured and measured["ci_low"] is not None
        else None,
        "confidence": answer["confidence"] if chosen else None,
        "gain_pct": answer["gain_pct"]
        if chosen
        else summary["gain_pct"]
        if best.number == summary["best_trial"]
        else None,
        "gain_interval_pct": (
            [answer["gain_ci_low_pct"], answer["gain_ci_high_pct"]]
            if chosen and answer["gain_ci_low_pct"] is not None
            else None
        ),
        "params": {name: value for name, value in config.params.items() if is_set(value)},
        "derived": dict(config.derived),
        "launch": {
            "argv": [REDACTED if flag else token for token, flag in argv_secrets(launch.argv)],
            "env": {
                k: REDACTED if is_secret_name(k) else study.secrets.redact(v) for k, v in launch.env.items()
            },
        },
        **verdict,
    }


def cmd_validate(args: argparse.Namespace) -> int:
    study = load_study(args.study_file, for_launch=False)
    study.check_flags()  # `run` checks again with the node's own flags, before any trial
    space = study.search_space
    print(f"study {study.name}: OK")
    for unset in study.unset_env:  # status, best, report need none of them; run does
        print(f"  {unset.path}: {unset.field}: {unset.problem}: the commands that launch servers need it")
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


def cmd_init(args: argparse.Namespace) -> int:
    import shlex
    from datetime import date

    from autotune.config import init
    from autotune.node.executor import runner_for
    from autotune.node.inspect import inspect_node

    if args.out.exists() and not args.force:
        raise ConfigError(args.out, "--out", str(args.out), "the file exists", "Pass --force to replace it.")
    command, env = shlex.split(args.server_command), init.parse_env(args.env, args.out)
    node = init.node_spec(args.node, args.out, key_file=args.key_file, known_hosts=args.known_hosts)
    local = node.address == "local"
    found, model, draft = inspect_node(
        runner_for(node),
        name=node.name,
        address=node.address,
        command=command,
        env=env,
        nvidia_smi=init.simulated_nvidia_smi(command) if init.is_simulated(command) else ["nvidia-smi"],
        model_path=init.node_path(args.model, local),
        draft_path=None if args.draft is None else init.node_path(args.draft, local),
    )
    text = init.study_text(
        out=args.out,
        name=args.name or init.study_name(model, found),
        node=found,
        model=model,
        draft=draft,
        command=command,
        env=env,
        spec=node,
        port=init.parse_port(args.port, args.out),
        written_on=f" on {date.today().isoformat()}",
    )
    choice = init.choose(found, model, draft)
    print(f"node {found.name}: {found.describe()}\n  {found.describe_sglang()}")
    print(f"model {model.describe()}" + (f"\ndraft {draft.describe()}" if draft else ""))
    print(f"search space: {choice.search_space.relative_to(init.SHIPPED_DIR)} ({choice.why})")
    print(f"objective: {choice.objective.relative_to(init.SHIPPED_DIR)}")
    for warning in found.warnings:
        print(f"warning: {warning}")
    args.out.write_text(text)
    secrets = [name for name in env if is_secret_name(name)]
    for name in secrets:  # written as ${NAME}: the check below reads it as `run` will, from the environment
        os.environ.setdefault(name, env[name])
        print(f"note: {name} is written as ${{{name}}}: export it where you run autotune")
    try:
        study = load_study(args.out)  # what `autotune validate` reads: a file it refuses is not left behind
    except AutotuneError:
        args.out.unlink()
        raise
    for held in init.held_knobs(study.search_space, found.flags) if found.flags is not None else []:
        print(f"note: {held.notice()}")
    print(f"wrote {args.out}: `autotune validate` accepts it. Next:")
    print(f"  autotune validate {args.out}    # the baseline launch; launches nothing")
    print(f"  autotune run {args.out}         # the study")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from autotune.node.logwatch import READY_LINE
    from autotune.trial.failures import Phase, classify

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
        if failure.culprits:
            print(f"  culprits: {' '.join(failure.culprits)}")
        print(f"  advice: {failure.advice}")
    return 0 if failure is None else EXIT_FAILED


# -- ui / report / ablate -------------------------------------------------------------------------------
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
    path = write_report(study, _existing_study(study), args.out)
    print(f"report written to {path}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from optuna.trial import TrialState

    from autotune.study.ablation import ablation_results, enqueue_ablation, plan_ablation
    from autotune.study.enqueue import BASELINE_CHOICE
    from autotune.study.storage import budget_used

    study = load_study(args.study_file, for_launch=not args.dry_run)
    ostudy = _existing_study(study)
    plan = plan_ablation(ostudy)
    print(f"ablation of trial {plan.of}: revert one setting at a time to the baseline's value")
    for name, value in plan.reverts.items():
        done = " (already run)" if name in plan.done else ""
        chosen = f" ({BASELINE_CHOICE})" if name in plan.server_chosen else ""
        print(f"  {name} -> {'default' if value is None else to_arg(value)}{chosen}{done}")
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
        ostudy = _driver(study, args).run(budget_used(ostudy) + waiting)  # its tracker marks ablation runs
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


def cmd_enqueue(args: argparse.Namespace) -> int:
    from autotune.study import enqueue
    from autotune.study.storage import open_study

    study = load_study(args.study_file, for_launch=False)
    space = study.search_space
    if args.file is not None and (args.settings or args.from_trial is not None):
        raise ConfigError(
            args.file,
            "",
            str(args.file),
            "--file holds whole configs: --set and --from-trial do not add to them",
            "Write those knobs (and `from_trial: N`) in the file's configs, or queue them separately.",
        )
    if args.file is not None:
        requests = enqueue.requests_from_file(args.file, space)
    elif args.settings or args.from_trial is not None:
        requests = [enqueue.request_from_cli(args.settings, args.from_trial, space, args.study_file)]
    else:
        raise ConfigError(
            args.study_file,
            "--set",
            None,
            "no config to queue",
            "Pass --set NAME=VALUE (repeatable), --from-trial N, or --file CONFIGS.yaml.",
        )
    stored = enqueue.stored_study(study)
    queued = enqueue.plan_all(study, requests, stored)  # every config checked before any is queued
    # A new study is created as `autotune run` creates it: its baseline is queued first.
    ostudy = open_study(study, accept_changes=args.accept_changes)
    numbers = enqueue.enqueue(ostudy, queued)
    if stored is None:
        print(f"created study {study.name!r} in {study.storage}; its baseline runs first")
    for number, entry in zip(numbers, queued, strict=True):
        settings = " ".join(f"{k}={to_arg(v)}" for k, v in entry.request.settings.items()) or "nothing set"
        rest = (
            f"the rest from trial {entry.request.from_trial}"
            if entry.request.from_trial is not None
            else "the rest at the baseline's values"
        )
        print(f"queued trial {number}: {settings}; {rest}")
        for name, value in entry.server_chosen.items():
            print(f"  {name} = {to_arg(value)}  ({enqueue.BASELINE_CHOICE})")
    print(enqueue.waiting_line(ostudy, study.file.budget.n_trials, args.study_file))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from autotune.study.compare import compare, describe_run, write

    study = load_study(args.study_file)
    if args.rounds < 2:
        raise ConfigError(
            args.study_file,
            "--rounds",
            args.rounds,
            "an interval needs two rounds",
            "Pass --rounds 2 or more.",
        )
    ostudy = _existing_study(study)
    metric = study.objective.metric
    comparison = compare(
        study,
        ostudy,
        args.rounds,
        trial=args.trial,
        on_run=lambda run: print(describe_run(run, metric), file=sys.stderr, flush=True),
    )
    path = write(comparison, args.json or study.workdir / "compare.json")
    settings = [f"{k}={v}" for k, v in comparison.best_env.items()]
    settings += [flag if v is None else f"{flag} {v}" for flag, v in comparison.best_flags.items()]
    print(f"best: trial {comparison.best_trial}: {' '.join(settings) or 'nothing set (the default)'}")
    print(comparison.table())
    print(f"runs and summary written to {path}")
    return 0


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
}
