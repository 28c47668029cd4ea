"""`autotune status` and `best`: what a study has found, read from its storage without changing it;
also the summary that `run` and `remeasure` print when they end.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.cli.common import existing_study, no_such_trial
from autotune.cli.console import with_unit
from autotune.config import Study, load_study
from autotune.config.objective import METRICS
from autotune.errors import AutotuneError
from autotune.study.records import TrialRecord, prefix_cache_text
from autotune.study.rules import is_feasible, trial_config
from autotune.trial.launch import ServerLaunch, TrialConfig, is_set, launch_script, redact_argv, to_arg
from autotune.trial.redaction import REDACTED, is_secret_name

if TYPE_CHECKING:  # the study's answer loads Optuna: only the commands that read a study import it
    from autotune.study.remeasure import RemeasuredAnswer
    from autotune.study.summary import StudySummary
    from autotune.study.trust.answer import StudyAnswer


def summary_text(summary: StudySummary, study: Study) -> str:
    """What `run`, `remeasure`, `best` and `status` say of a study: its trials by state, then its answer
    (autotune.study.trust.answer): the baseline, the verdict with its gain, interval and noise, and the value
    of the config to use, each with its unit; or the Pareto front of a multi-objective study."""
    states = ", ".join(f"{v} {k.lower()}" for k, v in sorted(summary.states.items()))
    lines = [f"study {study.name}: {states}"]
    if summary.pareto is not None:
        return "\n".join([*lines, *_pareto_lines(summary.pareto, study)])
    return "\n".join([*lines, *answer_lines(summary.answer, study)])


def answer_lines(answer: StudyAnswer | None, study: Study) -> list[str]:
    """The study's answer for people: the baseline, `answer: <its sentence>`, the value of the config to
    use (and how it was measured), the re-measured ranking behind it, the NCCL stage's values."""
    metric = study.objective.metric
    if answer is None:
        return ["baseline: did not complete"]  # no feasible trial: not even the baseline's
    remeasured = answer.remeasured
    if remeasured is not None and remeasured.baseline is not None and remeasured.baseline.n:
        lines = [_remeasured_lines(remeasured, study)[0]]  # the baseline's mean and interval
    elif answer.baseline_value is not None:
        how = f", {answer.value_how}" if answer.in_rounds or answer.measured is not None else ""
        at_most = "at most " if answer.baseline_at_most else ""
        value = with_unit(answer.baseline_value, metric)
        lines = [f"baseline {metric}: {at_most}{value} (SGLang's defaults{how})"]
    else:
        lines = ["baseline: did not complete"]
    lines.append(f"answer: {answer.text}")
    if answer.value is not None:
        config = "SGLang's defaults" if answer.trial == answer.baseline else f"trial {answer.trial}'s config"
        lines.append(f"        {metric} {with_unit(answer.value, metric)} with {config} ({answer.value_how})")
    if remeasured is not None:
        lines += _remeasured_lines(remeasured, study)[1:]
    if answer.nccl is not None:
        lines.append(f"        {answer.nccl.text()} in every server trial")
    return lines


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


def _ci(interval: tuple[float, float] | None, pct: bool = False) -> str:
    if interval is None:
        return "no interval (measured once)"
    low, high = interval
    return f"{low:+.1f}% to {high:+.1f}%" if pct else f"{low:.2f} to {high:.2f}"


def _remeasured_lines(answer: RemeasuredAnswer, study: Study) -> list[str]:
    """The re-measured ranking behind the answer: the baseline's and the best's means with their intervals,
    the gain between them, and the configs not ranked."""
    metric = study.objective.metric
    best, base, gain = answer.best, answer.baseline, answer.gain
    level = f"{best.confidence:.0%}"
    lines = []
    if base is not None and base.n:
        lines.append(
            f"baseline {metric}: {base.mean:.2f} (mean of {base.n}, {level} CI {_ci(base.interval)})"
        )
    else:
        lines.append("baseline: did not complete")
    label = "the baseline" if best.of == 0 and base and best.of == base.of else f"trial {best.of}"
    lines.append(
        f"best {metric}: {best.mean:.2f} (mean of {best.n}, {level} CI {_ci(best.interval)}; {label}, "
        f"re-measured on trials {', '.join(map(str, best.trials))})"
    )
    if gain is not None:
        interval = None if gain.low_pct is None or gain.high_pct is None else (gain.low_pct, gain.high_pct)
        said = f"gain over the baseline: {gain.pct:+.1f}% ({level} CI {_ci(interval, pct=True)})"
        if gain.within_noise:
            said += (
                ": within noise, the interval reaches 0%, so these measurements cannot tell the best "
                "config from SGLang's defaults"
            )
        lines.append(said)
    for group in answer.unreliable:
        lines.append(
            f"not ranked: trial {group.of}'s config failed or broke a limit when measured again "
            f"(trials {', '.join(map(str, group.failed))})"
        )
    return lines


def _trial_record(trial: Any) -> dict[str, Any]:
    values = trial.values
    record = TrialRecord.of(trial)
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": values[0] if values else None,
        "values": list(values) if values else None,
        "feasible": is_feasible(trial),
        "over_limits": dict(record.over_limits) or None,
        "pruned_by": record.pruned_by,
        "load_warning": record.load_warning,
        "load_decided": record.load_decided,
        "load_missed": dict(record.load_missed) if record.load_missed is not None else None,
        "prefix_cache": record.prefix_cache,
        "short_value": record.short_value,
        "remeasure_of": record.remeasure_of,
        "same_as": record.same_as,
        "confirm": record.confirm,
        "compare": record.compare,
        "proposed": record.proposed,
        "queued": record.queued,
        "params": dict(trial.params),
        "baseline": record.baseline,
        "failure_kind": record.failure_kind_text,
        "failure": record.failure,
        "failure_description": record.failure_description,
        "mlflow_run_id": record.mlflow_run_id,
        "startup_phases": dict(record.startup_phases) or None,
        "startup_notes": record.startup_notes,
        "node_s": record.node_s,  # in the node's own clock (study.node_budget)
    }


def cmd_status(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

    study = load_study(args.study_file, for_launch=False)
    optuna_study = existing_study(study)
    trials = [_trial_record(t) for t in optuna_study.get_trials(deepcopy=False)]
    if args.trial is not None:
        if args.trial not in {t["number"] for t in trials}:
            raise no_such_trial(study.name, args.trial, [t["number"] for t in trials])
        trials = [t for t in trials if t["number"] == args.trial]
    summary = study_summary(optuna_study)
    from autotune.views.status import fitted, nccl_stage, terminal_width, too_narrow

    stage_lines, stage_held = nccl_stage(study, study.storage, optuna_study)
    from autotune.study.trust.node_budget import node_hours, node_hours_record

    if args.json:
        print(
            json.dumps(
                {
                    "study": study.name,
                    "storage": study.storage,
                    "tracking_uri": study.tracking_uri,
                    "trials": trials,
                    "pareto": summary.pareto,
                    "remeasured": summary.remeasured,
                    "nccl_stage": {"text": stage_lines, "held": stage_held},
                    **_trust_record(summary.answer),
                    "node_hours": node_hours_record(study, optuna_study),
                },
                indent=2,
                default=str,
            )
        )
        return 0
    metrics, width = study.objective.metrics, terminal_width()
    for line in stage_lines:  # once, above the table: the rows leave out the values the stage held
        print("\n".join(fitted("", line, width)))
    heads = "  ".join(f"{m:>18}" for m in metrics)
    kind = max([len("failure"), *(len(t["failure_kind"] or "") for t in trials)])  # room for the settings
    head = f"{'#':>4}  {'state':<10} {heads}  {'failure':<{kind}}  "
    print("\n".join(fitted(head, "changed from the baseline", width)))
    changes = {
        t["number"]: "baseline"
        if t["baseline"]
        else " ".join(
            f"{k}={to_arg(v)}"
            for k, v in t["params"].items()
            if is_set(v) and (k not in stage_held or stage_held[k] != v)
        )
        for t in trials
    }
    under = any(too_narrow(head, text, width) for text in changes.values())  # every row, or none
    for t in trials:
        values = t["values"] or [None] * len(metrics)
        shown = "  ".join(f"{v:>18.2f}" if v is not None else f"{'-':>18}" for v in values)
        state = "INFEASIBLE" if t["state"] == "COMPLETE" and not t["feasible"] else t["state"]
        row = f"{t['number']:>4}  {state:<10} {shown}  {t['failure_kind'] or '':<{kind}}  "
        print("\n".join(fitted(row, changes[t["number"]], width, under)))  # full text in --json
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
    from autotune.views.startup import startup_summary

    startup = startup_summary(optuna_study.get_trials(deepcopy=False))
    if startup is not None:
        print("\n".join(fitted("", startup, width)))
    print(node_hours(study, optuna_study).text())
    answer = summary.answer
    said = [*answer.screened, answer.stopped] if answer is not None else []
    for text in filter(None, said):
        print("\n".join(fitted("", text, width)))
    for line in summary_text(summary, study).splitlines():
        print("\n".join(fitted("", line, width)))
    return 0


def _trust_record(answer: StudyAnswer | None) -> dict[str, Any]:
    """`status --json`'s view of the study's trust: its noise estimate, the knobs screening held, why its
    search stopped early, and its answer (autotune.study.trust.answer)."""
    if answer is None:
        return {"noise": None, "screened": [], "stopped": None, "answer": None}
    record = answer.record()
    return {
        "noise": record["noise"],
        "screened": list(answer.screened),
        "stopped": answer.stopped,
        "answer": record,
    }


def _missed_text(missed: Mapping[str, Any] | None) -> str | None:
    """Which SLO limits the requests broke at the load a load search missed at just above its max_load."""
    over = (missed or {}).get("over")
    if not missed or not over:
        return None
    counts = ", ".join(f"{count} over {limit}" for limit, count in over.items())
    running = f"; {missed['in_flight']:g} running at once on average" if missed.get("in_flight") else ""
    return f"the SLO missed at {missed['load']:g}: {counts}{running}"


def _status_notes(t: dict[str, Any]) -> list[str]:
    """What a trial's row alone does not say: a broken limit and by how much, a pruning, a re-measurement,
    how the node started its server."""
    notes = [f"over the limit: {v['text']}" for v in (t["over_limits"] or {}).values()]
    if t["pruned_by"]:
        notes.append(f"pruned after the {t['pruned_by']}")
    if t.get("load_warning"):
        notes.append(f"warning: {t['load_warning']}")
    if t.get("load_decided"):
        notes.append(t["load_decided"])
    if missed := _missed_text(t.get("load_missed")):
        notes.append(missed)
    if cache := prefix_cache_text(t.get("prefix_cache")):
        notes.append(cache)
    if t["confirm"] is not None:
        round_ = t["confirm"]["round"] + 1  # counted from 1, as the console counts them
        notes.append(f"confirmation round {round_}: trial {t['remeasure_of']}'s config again")
    elif t["remeasure_of"] is not None:
        again = f"compare round {t['compare']['round'] + 1}" if t.get("compare") else "re-measurement"
        notes.append(f"{again}: trial {t['remeasure_of']}'s config again")
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
    return notes + list(t.get("startup_notes") or [])  # how it was started, after what it is


def cmd_best(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

    study = load_study(args.study_file, for_launch=False)
    optuna_study = existing_study(study)
    summary = study_summary(optuna_study)
    answer = summary.answer
    trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
    if args.trial is not None:
        best = trials.get(args.trial)
        if best is None:
            raise no_such_trial(study.name, args.trial, list(trials))
    elif summary.pareto is not None:
        if args.json:
            print(json.dumps({"study": study.name, "pareto": summary.pareto}, indent=2))
            return 0
        print(summary_text(summary, study))
        print("a multi-objective study has no single best: pick a trial of the front with --trial N")
        return 0
    elif answer is not None:  # confirmed or not: maybe SGLang's defaults
        best = trials[answer.trial]
    else:
        complete = summary.states.get("COMPLETE", 0)
        if complete:
            raise AutotuneError(
                f"study {study.name!r} has no feasible trial: its {complete} complete trial(s) broke a limit "
                f"of the objective (`autotune status {study.path}` says by how much)"
            )
        raise AutotuneError(f"study {study.name!r} has no completed trial yet")
    config = trial_config(study, best)
    launch = study.server_launch(config)
    if args.json:
        the_answer = answer if args.trial is None else None
        print(json.dumps(_best_record(study, answer, best, config, launch, the_answer), indent=2))
        return 0
    script = launch_script(launch)
    print(summary_text(summary, study))
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


# The answer's keys `best --json` adds to the config's record when it is the study's answer (not --trial).
ANSWER_KEYS = (
    "verdict",
    "confirmed",
    "beats_defaults",
    "leader",
    "rounds",
    "noise",
    "within_noise",
    "baseline_value",
    "baseline_at_most",
    "trials",
    "nccl_stage",
    "text",
)


def _best_record(
    study: Study,
    answer: StudyAnswer | None,
    best: Any,
    config: TrialConfig,
    launch: ServerLaunch,
    the_answer: StudyAnswer | None = None,
) -> dict[str, Any]:
    """`autotune best --json`: the config, its value, its gain over the baseline with their intervals (the
    answer's, autotune.study.trust.answer, when the config is the answer's), and the launch with every secret
    redacted; with `the_answer` (the study's answer, not a trial asked for), its verdict, sentence, noise
    estimate, the trials it rests on and the NCCL stage's values as well."""
    mine = answer is not None and answer.trial == best.number
    record = {
        "study": study.name,
        "metric": study.objective.metric,
        "trial": best.number,
        "baseline": TrialRecord.of(best).baseline,
        "value": answer.value if mine and answer is not None else best.value,
        "interval": list(answer.value_interval) if mine and answer and answer.value_interval else None,
        "confidence": answer.confidence if mine and answer is not None else None,
        "gain_pct": answer.gain_pct if mine and answer is not None else None,
        "gain_interval_pct": (
            list(answer.gain_interval_pct) if mine and answer and answer.gain_interval_pct else None
        ),
        "params": {name: value for name, value in config.params.items() if is_set(value)},
        "derived": dict(config.derived),
        "launch": {
            "argv": redact_argv(launch),
            "env": {
                k: REDACTED if is_secret_name(k) else study.secrets.redact(v) for k, v in launch.env.items()
            },
        },
    }
    if the_answer is not None:
        full = the_answer.record()
        record.update({key: full[key] for key in ANSWER_KEYS})
    return record
