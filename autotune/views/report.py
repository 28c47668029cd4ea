"""What a study found, for a person: the summary, the best config and how to launch it, the plots, the
failures with their advice, and the best config's gain split by parameter (after `autotune ablate`).

`study_findings` reads it all from the Optuna study once. `summary_markdown` is the parent run's
description in MLflow; `render_html` is `autotune report`'s self-contained page (plots embedded as PNG).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.study.ablation import Ablation, ablation_results
from autotune.study.records import TrialRecord, prefix_cache_text
from autotune.study.rules import trial_config
from autotune.study.summary import StudySummary, study_summary
from autotune.study.trust.answer import StudyAnswer
from autotune.study.trust.node_budget import node_hours
from autotune.tracking.tracker import metric_unit
from autotune.trial.failures import FailureKind
from autotune.trial.launch import TrialConfig, is_set, launch_script, to_arg
from autotune.views.startup import startup_summary

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class FailureGroup:
    """The trials that failed one way, and what to try."""

    kind: str
    trials: tuple[int, ...]
    states: tuple[str, ...]
    advice: str
    example: str  # the failure line of the first such trial


@dataclass(frozen=True)
class StudyFindings:
    """Everything the report and the parent run's description show, read from the study once."""

    study: str
    metric: str
    unit: str
    direction: str
    summary: StudySummary  # its `answer` is what every view leads with (autotune.study.trust.answer)
    best: FrozenTrial | None  # the answer's config: the one to use
    best_config: TrialConfig | None
    best_script: str | None
    failures: tuple[FailureGroup, ...]
    ablation: Ablation | None
    trials: tuple[FrozenTrial, ...]
    node_hours: str = ""  # spent, and left of the budget (study.node_budget.NodeHours.text)

    @property
    def answer(self) -> StudyAnswer | None:
        return self.summary.answer

    def value_text(self, value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} {self.unit}".strip()

    def answer_rows(self) -> list[tuple[str, str]]:
        """The answer, as the report's summary and the parent run's description show it, first: its
        sentence, the config to use and its value, the gain and its interval, the baseline, the noise, the
        NCCL stage's values and the trials it rests on."""
        a = self.answer
        if a is None:
            return [("answer", "no feasible trial has completed yet")]
        how = a.value_how
        config = "SGLang's defaults" if a.trial == a.baseline else f"trial {a.trial}'s config"
        interval = ""
        if a.gain_interval_pct is not None and a.confidence is not None:
            low, high = a.gain_interval_pct
            interval = f" ({a.confidence:.1%} CI {low:+.1f}% to {high:+.1f}%)"
        gain = f"{a.gain_pct:+.1f}%{interval}" if a.gain_pct is not None else "-"
        if a.trial != a.leader:
            gain += f" (trial {a.leader}'s config, the best candidate)"
        rows = [
            ("answer", a.text),
            ("use", f"{config}: {self.value_text(a.value)} ({how})"),
            ("gain over SGLang's defaults", gain),
            (
                "baseline (SGLang defaults)",
                ("at most " if a.baseline_at_most else "") + self.value_text(a.baseline_value),
            ),
            (
                "noise",
                a.noise.describe() if a.noise is not None else "unknown: no config measured twice yet",
            ),
        ]
        if a.nccl is not None:
            rows.append(("NCCL stage", f"{a.nccl.text()} in every server trial"))
        rows.append(("rests on trials", ", ".join(map(str, a.trials))))
        if self.node_hours:
            rows.append(("node hours", self.node_hours.removeprefix("node hours: ")))
        return rows


def study_findings(study: Study, optuna_study: optuna.Study) -> StudyFindings:
    """Read a study's summary and answer, the answer's config, failures and ablation from its Optuna
    storage."""
    summary = study_summary(optuna_study)
    answer = summary.answer
    trials = tuple(optuna_study.get_trials(deepcopy=False))
    best = next((t for t in trials if answer and t.number == answer.trial), None)
    config = script = None
    if best is not None:
        config = trial_config(study, best)
        script = launch_script(study.server_launch(config))
    return StudyFindings(
        study=study.name,
        metric=study.objective.metric,
        unit=metric_unit(study.objective.metric),
        direction=study.objective.goal,
        summary=summary,
        best=best,
        best_config=config,
        best_script=script,
        failures=failure_groups(trials),
        ablation=ablation_results(optuna_study),
        trials=trials,
        node_hours=node_hours(study, optuna_study).text(),
    )


def failure_groups(trials: Sequence[FrozenTrial]) -> tuple[FailureGroup, ...]:
    """Failed and pruned trials grouped by failure kind, most frequent first, each with its advice."""
    groups: dict[str, list[FrozenTrial]] = {}
    for trial in trials:
        kind = TrialRecord.of(trial).failure_kind_text
        if kind and trial.state in (TrialState.FAIL, TrialState.PRUNED):
            groups.setdefault(kind, []).append(trial)
    out = []
    for kind, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        out.append(
            FailureGroup(
                kind=kind,
                trials=tuple(t.number for t in members),
                states=tuple(sorted({t.state.name for t in members})),
                advice=_advice(kind, members[0]),
                example=TrialRecord.of(members[0]).failure or "",
            )
        )
    return tuple(out)


def _advice(kind: str, trial: FrozenTrial) -> str:
    if advice := TrialRecord.of(trial).advice:
        return str(advice)
    try:
        return FailureKind(kind).advice
    except ValueError:  # a kind no longer known
        return ""


def changed_settings(config: TrialConfig) -> list[tuple[str, str]]:
    """(name, value) of what a config sets beyond SGLang's defaults, derived values marked."""
    rows = [(name, to_arg(value)) for name, value in config.params.items() if is_set(value)]
    rows += [(name, f"{to_arg(value)} (set by SGLang's rules)") for name, value in config.derived.items()]
    return rows


# -- markdown: the parent run's description --------------------------------------------------------------
def summary_markdown(findings: StudyFindings) -> str:
    """The study summary as markdown: baseline, best, gain, trials by state and failure, how to launch."""
    s = findings.summary
    states = ", ".join(f"{count} {state.lower()}" for state, count in sorted(s.states.items()))
    lines = [f"### Study {findings.study}: {findings.direction} {findings.metric}", ""]
    rows = findings.answer_rows()
    lines += [f"**{rows[0][1]}**", ""]  # the answer's sentence leads
    lines += [f"- {name}: {value}" for name, value in rows[1:]]
    lines += ["", f"Trials: {states}."]
    if findings.failures:
        kinds = ", ".join(f"{g.kind} ({len(g.trials)})" for g in findings.failures)
        lines.append(f"- failures: {kinds}")
    if (startup := startup_summary(findings.trials)) is not None:
        lines.append(f"- {startup}")
    if findings.best_config is not None:
        settings = changed_settings(findings.best_config)
        if settings:
            lines += ["", "**Best config** (what it changes from SGLang's defaults):"]
            lines += [f"- `{name}` = `{value}`" for name, value in settings]
        else:
            lines += ["", "**Best config**: SGLang's defaults (the baseline)."]
    if findings.ablation is not None and findings.ablation.rows:
        lines += [
            "",
            f"**What each setting of trial {findings.ablation.of} is worth** (reverted one at a time):",
        ]
        for row in findings.ablation.rows:
            lines.append(f"- `{row.param}`: {_ablation_effect(findings, row)}")
    if findings.best_script is not None:
        lines += [
            "",
            "**Launch it** (also the artifact `best/launch.sh`):",
            "",
            "```bash",
            findings.best_script,
            "```",
        ]
    lines += ["", "Plots: the `plots/` artifacts of this run."]
    return "\n".join(lines)


def _ablation_effect(findings: StudyFindings, row: Any) -> str:
    if row.loss is None:
        return f"without it the trial {row.state.lower()}s ({row.failure_kind or 'no value'}): it is needed"
    share = f", {row.share_of_gain:.0%} of the gain" if row.share_of_gain is not None else ""
    return f"{findings.value_text(row.loss)} lost ({row.loss_pct:+.1f}%{share})"


# -- HTML: autotune report ---------------------------------------------------------------------------------
_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #222; }
body { padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2.2rem; }
table { border-collapse: collapse; margin: .6rem 0; }
td, th { border: 1px solid #ddd; padding: .25rem .6rem; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f8fa; padding: .8rem; white-space: pre-wrap; border-radius: 4px; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.muted { color: #666; } .bad { color: #b00020; } .good { color: #1b7e2a; }
"""

PLOT_CAPTIONS = {
    "optimization_history.png": "Each trial's value, the best so far, and the baseline (SGLang's defaults).",
    "param_importances.png": "Which parameters mattered: shares of the variance over the trials (fANOVA).",
    "objective_vs_params.png": "The objective against the most important parameters.",
    "memory_region.png": "Where the server starts: mem-fraction-static against cuda-graph-max-bs-decode.",
    "pareto_front.png": "The Pareto front of the first two objectives.",
}


def render_html(
    findings: StudyFindings, plots: Mapping[str, bytes], generated: datetime | None = None
) -> str:
    """The report as one HTML page with no outside references: plots are embedded as base64 PNG."""
    when = (generated or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>autotune report: {e(findings.study)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>autotune report: study {e(findings.study)}</h1>",
        f'<p class="muted">{e(findings.direction)} {e(findings.metric)} · generated {e(when)}</p>',
        _summary_html(findings),
        _best_html(findings),
        _plots_html(plots),
        _failures_html(findings),
        _ablation_html(findings),
        _trials_html(findings),
        "</body></html>",
    ]
    return "\n".join(parts)


def _summary_html(f: StudyFindings) -> str:
    s = f.summary
    rows = f.answer_rows()
    rows += [(f"trials {state.lower()}", str(count)) for state, count in sorted(s.states.items())]
    rows += [(f"failures: {kind}", str(count)) for kind, count in sorted(s.failure_kinds.items())]
    if (startup := startup_summary(f.trials)) is not None:
        head, _, text = startup.partition(": ")
        rows.append((head, text))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<section id="summary"><h2>Summary</h2><table>{body}</table></section>'


def _best_html(f: StudyFindings) -> str:
    if f.best is None or f.best_config is None or f.best_script is None:
        return '<section id="best-config"><h2>Best config</h2><p>No trial has completed yet.</p></section>'
    settings = changed_settings(f.best_config)
    if settings:
        body = "".join(
            f"<tr><td><code>{html.escape(n)}</code></td><td><code>{html.escape(v)}</code></td></tr>"
            for n, v in settings
        )
        table = f"<table><tr><th>setting</th><th>value</th></tr>{body}</table>"
    else:
        table = "<p>The baseline: SGLang's and NCCL's own defaults won.</p>"
    return (
        '<section id="best-config"><h2>Best config</h2>'
        f"<p>Trial {f.best.number}: {html.escape(f.value_text(f.answer.value if f.answer else f.best.value))}"
        ".</p>"
        + (
            f"<p>{html.escape(cache)}.</p>"
            if (cache := prefix_cache_text(TrialRecord.of(f.best).prefix_cache))
            else ""
        )
        + f"{table}"
        "<h3>Launch it</h3><p>Save as <code>launch.sh</code> (or run <code>autotune best STUDY.yaml --export "
        "launch.sh</code>); secrets come from your environment.</p>"
        f"<pre><code>{html.escape(f.best_script)}</code></pre></section>"
    )


def _plots_html(plots: Mapping[str, bytes]) -> str:
    figures = []
    for name, png in plots.items():
        data = base64.b64encode(png).decode("ascii")
        caption = html.escape(PLOT_CAPTIONS.get(name, name))
        figures.append(
            f'<figure id="plot-{html.escape(name.removesuffix(".png"))}">'
            f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    return '<section id="plots"><h2>Plots</h2>' + "".join(figures) + "</section>"


def _failures_html(f: StudyFindings) -> str:
    if not f.failures:
        return '<section id="failures"><h2>Failures</h2><p>No trial failed.</p></section>'
    rows = "".join(
        f"<tr><td><code>{html.escape(g.kind)}</code></td><td class='num'>{len(g.trials)}</td>"
        f"<td>{html.escape(', '.join(str(n) for n in g.trials))}</td><td>{html.escape(g.advice)}"
        + (f"<br><code class='muted'>{html.escape(g.example[:300])}</code>" if g.example else "")
        + "</td></tr>"
        for g in f.failures
    )
    return (
        '<section id="failures"><h2>Failures</h2>'
        "<table><tr><th>kind</th><th>trials</th><th>which</th><th>what to try</th></tr>"
        f"{rows}</table></section>"
    )


def _ablation_html(f: StudyFindings) -> str:
    head = '<section id="ablation"><h2>What each setting is worth</h2>'
    a = f.ablation
    if a is None:
        return (
            head + "<p>Not measured yet: <code>autotune ablate STUDY.yaml</code> reverts each setting of the "
            "best config to the baseline's value, one trial each, and this section shows what each was "
            "worth.</p></section>"
        )
    rows = []
    for r in a.rows:
        if r.loss is None:
            why = f"{r.state.lower()}: {r.failure_kind or ''}"
            effect = f"<span class='bad'>{html.escape(why)}</span>"
            loss = pct = share = "needed to run"
        else:
            effect = html.escape(f.value_text(r.value))
            loss = html.escape(f.value_text(r.loss))
            pct = f"{r.loss_pct:+.1f}%" if r.loss_pct is not None else "-"
            share = f"{r.share_of_gain:.0%}" if r.share_of_gain is not None else "-"
        rows.append(
            f"<tr><td><code>{html.escape(r.param)}</code></td>"
            f"<td><code>{html.escape(to_arg(r.best_setting))}</code> → "
            f"<code>{'default' if r.reverted_to is None else html.escape(to_arg(r.reverted_to))}</code></td>"
            f"<td class='num'>{r.trial}</td><td class='num'>{effect}</td><td class='num'>{loss}</td>"
            f"<td class='num'>{pct}</td><td class='num'>{share}</td></tr>"
        )
    notes = "".join(
        f"<li><code>{html.escape(n)}</code>: not reverted alone ({html.escape(why)})</li>"
        for n, why in a.not_ablated.items()
    )
    pending = ", ".join(a.pending)
    return (
        head
        + f"<p>Trial {a.of} ({html.escape(f.value_text(a.best_value))}) with one setting reverted to the "
        "baseline's value at a time; the baseline measured "
        f"{html.escape(f.value_text(a.baseline_value))}.</p>"
        "<table><tr><th>setting</th><th>best → reverted</th><th>trial</th><th>without it</th><th>lost</th>"
        f"<th>of best</th><th>share of the gain</th></tr>{''.join(rows)}</table>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + (f"<p class='muted'>Still running or queued: {html.escape(pending)}.</p>" if pending else "")
        + "</section>"
    )


def _trials_html(f: StudyFindings) -> str:
    rows = []
    # A workload that shares prefixes: each trial's cache hit rate beside the workload's designed sharing.
    caching = any(TrialRecord.of(t).prefix_cache for t in f.trials)
    for t in f.trials:
        record = TrialRecord.of(t)
        value = f"{t.value:.2f}" if t.value is not None and t.state == TrialState.COMPLETE else "-"
        cache = record.prefix_cache or {}
        hit = (
            f"{cache['hit_rate']:.0%} of {cache['designed']:.0%}"
            if cache.get("hit_rate") is not None
            else "-"
        )
        changed = (
            "baseline"
            if record.baseline
            else " ".join(f"{k}={to_arg(v)}" for k, v in t.params.items() if is_set(v))
        )
        rows.append(
            f"<tr><td class='num'>{t.number}</td><td>{t.state.name}</td><td class='num'>{value}</td>"
            f"<td class='num'>{_node_h(t)}</td>"
            f"<td>{html.escape(record.failure_kind_text or '')}</td>"
            + (f"<td class='num'>{hit}</td>" if caching else "")
            + f"<td><code>{html.escape(changed)}</code></td></tr>"
        )
    return (
        '<section id="trials"><h2>Every trial</h2><table><tr><th>#</th><th>state</th>'
        f"<th>{html.escape(f.metric)}</th><th>node h</th><th>failure</th>"
        + ("<th>prefix cache hit (of designed)</th>" if caching else "")
        + "<th>changed from the baseline</th></tr>"
        f"{''.join(rows)}</table></section>"
    )


def _node_h(trial: FrozenTrial) -> str:
    """The node hours a trial spent (TrialRecord.node_s), "-" for one never launched."""
    seconds = TrialRecord.of(trial).node_s
    return f"{seconds / 3600:.2f}" if seconds else "-"


def write_report(study: Study, optuna_study: optuna.Study, out: Path) -> Path:
    """Write `out/report.html` for the study; returns its path."""
    from autotune.views.plots import draw_plots, plot_data, png_bytes  # matplotlib: only for a report

    findings = study_findings(study, optuna_study)
    data = plot_data(optuna_study, findings.metric, findings.unit, title=study.name)
    plots = {name: png_bytes(figure) for name, figure in draw_plots(data).items()}
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_FILE
    path.write_text(study.secrets.redact(render_html(findings, plots)))
    return path
