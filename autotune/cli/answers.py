"""`autotune status` and `best`: what a study has found, read from its storage without changing it;
also the summary that `run` and `remeasure` print when they end.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from autotune.cli.common import existing_study
from autotune.config import Study, load_study
from autotune.config.objective import METRICS
from autotune.errors import AutotuneError
from autotune.study.records import (
    BASELINE_ATTR,
    COMPARE_ATTR,
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
    STARTUP_NOTES_ATTR,
    STARTUP_PHASES_ATTR,
)
from autotune.study.rules import best_trial, is_feasible, trial_config
from autotune.trial.launch import ServerLaunch, TrialConfig, is_set, launch_script, to_arg
from autotune.trial.redaction import REDACTED, argv_secrets, is_secret_name


def summary_text(summary: dict[str, Any], study: Study) -> str:
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
        "compare": trial.user_attrs.get(COMPARE_ATTR),
        "proposed": trial.system_attrs.get(PROPOSED_ATTR),
        "queued": trial.user_attrs.get(QUEUED_ATTR),
        "params": dict(trial.params),
        "baseline": bool(trial.user_attrs.get(BASELINE_ATTR)),
        "failure_kind": trial.user_attrs.get(FAILURE_KIND_ATTR),
        "failure": trial.user_attrs.get(FAILURE_ATTR),
        "failure_description": trial.user_attrs.get(FAILURE_DESCRIPTION_ATTR),
        "mlflow_run_id": trial.user_attrs.get(MLFLOW_RUN_ATTR),
        "startup_phases": trial.user_attrs.get(STARTUP_PHASES_ATTR),
        "startup_notes": trial.user_attrs.get(STARTUP_NOTES_ATTR) or [],
    }


def cmd_status(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

    study = load_study(args.study_file, for_launch=False)
    ostudy = existing_study(study)
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
                    **trust_record(ostudy),
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
    from autotune.views.startup import startup_summary

    startup = startup_summary(ostudy.get_trials(deepcopy=False))
    if startup is not None:
        print("\n".join(fitted("", startup, width)))
    trust = trust_record(ostudy)
    for line in (*trust["screened"], trust["stopped"], trust["answer"]["text"] if trust["answer"] else None):
        if line:
            print("\n".join(fitted("", line, width)))
    return 0


def trust_record(ostudy: Any) -> dict[str, Any]:
    """What status and best show of the study's trust: its noise estimate, the knobs screening held, why
    its search stopped early, and its answer (confirmed or not: study.confirm.study_answer)."""
    from autotune.study.confirm import study_answer
    from autotune.study.noise import noise_estimate
    from autotune.study.screening import screened_lines
    from autotune.study.stopping import stopped_early

    noise = noise_estimate(ostudy)
    return {
        "noise": noise.record() if noise is not None else None,
        "screened": screened_lines(ostudy),
        "stopped": stopped_early(ostudy),
        "answer": study_answer(ostudy),
    }


def _status_notes(t: dict[str, Any]) -> list[str]:
    """What a trial's row alone does not say: a broken limit and by how much, a pruning, a re-measurement."""
    notes = [f"over the limit: {v['text']}" for v in (t["over_limits"] or {}).values()]
    notes += list(t.get("startup_notes") or [])
    if t["pruned_by"]:
        notes.append(f"pruned after the {t['pruned_by']}")
    if t.get("load_warning"):
        notes.append(f"warning: {t['load_warning']}")
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
    return notes


def cmd_best(args: argparse.Namespace) -> int:

    from autotune.study.summary import study_summary

    study = load_study(args.study_file, for_launch=False)
    ostudy = existing_study(study)
    summary = study_summary(ostudy)
    if args.trial is not None:
        best = next((t for t in ostudy.get_trials(deepcopy=False) if t.number == args.trial), None)
        if best is None:
            raise AutotuneError(f"study {study.name!r} has no trial {args.trial}")
    elif summary["pareto"] is not None:
        if args.json:
            print(json.dumps({"study": study.name, "pareto": summary["pareto"]}, indent=2))
            return 0
        print(summary_text(summary, study))
        print("a multi-objective study has no single best: pick a trial of the front with --trial N")
        return 0
    else:
        best = best_trial(ostudy)
        if (answer := trust_record(ostudy)["answer"]) is not None:  # confirmed: maybe SGLang's defaults
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
    trust = trust_record(ostudy) if args.trial is None else None
    if args.json:
        print(json.dumps(_best_record(study, summary, best, config, launch, trust), indent=2))
        return 0
    script = launch_script(launch)
    print(summary_text(summary, study))
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
