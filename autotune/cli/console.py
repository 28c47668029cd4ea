"""What a running study prints on the terminal: the observer that `run`, `remeasure` and `ablate`
register. Each stage (the NCCL stage, the search, the confirmation rounds) is announced before its first
trial with its metric, unit and direction; then one line per finished trial, its value with its unit. On
a terminal a progress bar (tqdm) shows the running trials and an estimate of the time left; piped
output stays plain lines.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from autotune.measure.metrics import CATALOGUE
from autotune.study.callbacks import (
    IncompatibilityLearned,
    KnobHeld,
    PhaseChanged,
    Progress,
    StudyCallback,
    StudyEnded,
    StudyInterrupting,
    StudyStarted,
    SummaryUpdated,
    TrialFinished,
    TrialStarted,
)
from autotune.study.records import TrialRecord

if TYPE_CHECKING:
    from tqdm import tqdm

    from autotune.config import Study

BETTER = {"maximize": "higher is better", "minimize": "lower is better"}


def unit(metric: str) -> str:
    """The metric's unit as the console prints it after a value ("" for a count or a share)."""
    known = CATALOGUE.get(metric)
    return known.unit if known is not None else ""


def with_unit(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    # Three significant digits below 10: a max_load of 0.099 and one of 0.125 req/s are not both "0.1".
    number = f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    shown = unit(metric)
    return f"{number} {shown}" if shown else number


def describe_metric(study: Study) -> str:
    """ "output_throughput in tok/s, higher is better": what a stage's rows measure."""
    objective = study.objective
    parts = []
    for metric, direction in zip(objective.metrics, objective.directions, strict=True):
        shown = f" in {unit(metric)}" if unit(metric) else ""
        parts.append(f"{metric}{shown}, {BETTER[direction]}")
    return "; ".join(parts)


def announcement(study: Study, total: int, confirming: bool, again: bool = False) -> str:
    """The heading printed before a stage's first trial; `again` before the rows that follow another
    stage's: the search after the NCCL stage, which runs after the baseline."""
    if again:
        return (
            f"== study {study.name}, continued: the search, the NCCL stage's best held in every server "
            f"trial, {describe_metric(study)}"
        )
    if confirming:
        confirm = study.file.trust.confirm
        return (
            f"== confirmation of {study.name}: the best {confirm.top} config(s) and SGLang's defaults "
            f"launched again in interleaved rounds ({confirm.min_rounds} to {confirm.max_rounds}) until the "
            f"gain's interval is clear, {describe_metric(study)}"
        )
    if study.objective.kind == "nccl_allreduce":
        return (
            f"== NCCL stage {study.name}: {total} all-reduce trials of the NCCL knobs alone (seconds each, "
            f"no server), {describe_metric(study)}; its best is held in every server trial"
        )
    return (
        f"== study {study.name}: {total} trials of the server (trial 0 is SGLang's defaults, the "
        f"baseline), {describe_metric(study)}"
    )


class ConsoleReporter(StudyCallback):
    """Live progress on a terminal: each stage announced, one line per finished trial, a progress bar."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.announced: set[tuple[str, bool]] = set()
        self.heading: tuple[str, bool] | None = None  # the stage whose rows are printed now
        self.confirm_labels: dict[int, str] = {}  # trial number -> "confirm r1 · trial 9's config"
        self.bar: tqdm[Any] | None = None
        self.spent_at_start: float | None = None  # node seconds before this run's first trial

    def study_started(self, event: StudyStarted) -> None:
        if event.study.objective.kind != "nccl_allreduce":  # the stage runs inside its study's run
            self.started = time.monotonic()
            self.spent_at_start = None
        if event.recovered:
            self._line(f"recovered interrupted trials {list(event.recovered)}: marked FAIL and queued again")

    def trial_started(self, event: TrialStarted) -> None:
        record = TrialRecord.of(event.trial)
        if (confirm := record.confirm) is not None:
            config = "SGLang's defaults" if event.baseline else f"trial {record.remeasure_of}'s config"
            round_ = confirm["round"] + 1
            self.confirm_labels[event.trial.number] = f"confirm r{round_} · {config}"
        self._announce(event.study, event.progress, event.trial.number in self.confirm_labels)
        self._running(event.progress)

    def trial_phase_changed(self, event: PhaseChanged) -> None:
        self._running(event.progress)

    def trial_finished(self, event: TrialFinished) -> None:
        progress, outcome = event.progress, event.outcome
        confirming = event.number in self.confirm_labels
        self._announce(event.study, progress, confirming)
        metric = event.study.objective.metric
        value = with_unit(outcome.value, metric)
        # A launched trial's failure kind; a refused one's reason, which names the setting refused.
        reason = outcome.refusal or (outcome.failure_kind.value if outcome.failure_kind else None)
        why = f" ({reason})" if reason else ""
        if confirming:
            label = f"trial {event.number} ({self.confirm_labels.pop(event.number)})"
            self._line(f"  {label:<44} {outcome.state.name:<8} {value:>14}{why}")
            return
        label = f"trial {event.number}"
        if event.baseline and event.number == 0:  # the stage's first trial runs NCCL's defaults
            label = "defaults" if event.study.objective.kind == "nccl_allreduce" else "baseline"
        elif event.baseline and not why:  # the defaults measured again during the search: the noise
            why = " (defaults again)"
        self._line(
            f"[{progress.done:>3}/{progress.total}] {label:<9} {outcome.state.name:<8} "
            f"{value:>14}{why:<22} {self._tail(progress, metric)}"
        )

    def incompatibility_learned(self, event: IncompatibilityLearned) -> None:
        pairs = ", ".join(f"{name}={value}" for name, value, _hardware in event.known)
        self._line(f"known incompatible on this hardware, not tried again: {pairs}")

    def knob_held(self, event: KnobHeld) -> None:
        self._line(event.text)

    def study_interrupting(self, event: StudyInterrupting) -> None:
        numbers = ", ".join(map(str, event.trials))
        if not event.trials:  # between two trials (an all-reduce job of the NCCL stage takes seconds)
            self._line("stopping: no trial was running; a resume continues where the study stopped")
        else:
            trials = f"trial {numbers}" if len(event.trials) == 1 else f"trials {numbers}"
            again = "Ctrl-C" if event.signal == "SIGINT" else event.signal  # a second one stops at once too
            self._line(f"stopping {trials} ({again} again to stop at once)")

    def summary_updated(self, event: SummaryUpdated) -> None:
        """The node hours spent and left after each server trial, with an ETA at this run's pace."""
        if event.study.objective.kind == "nccl_allreduce":  # the stage's jobs: counted in the study's
            return
        from autotune.study.trust.node_budget import node_hours

        hours = node_hours(event.study, event.optuna_study)
        if hours.budget_h is None:
            return
        started = getattr(self, "started", None)
        if self.spent_at_start is None:  # the pace from this run's trials on, not an earlier run's
            self.spent_at_start = hours.spent_s - float(hours.launch_s or 0.0)
        spent = hours.spent_s - self.spent_at_start
        pace = (time.monotonic() - started) / spent if started is not None and spent > 0 else None
        self._line(f"      {hours.text(pace)}")

    def study_ended(self, event: StudyEnded) -> None:
        self._close_bar()

    def _announce(self, study: Study, progress: Progress, confirming: bool) -> None:
        key = (study.name, confirming)
        if key != self.heading:
            again = key in self.announced
            self.announced.add(key)
            self.heading = key
            self._close_bar()
            self._line(announcement(study, progress.total, confirming, again))

    def _running(self, progress: Progress) -> None:
        if not self.live:
            return
        running = ", ".join(f"trial {n} {phase}" for n, phase in sorted(progress.running.items()))
        if self.bar is None:  # one bar a stage: its rate gives the time left
            from tqdm import tqdm

            self.bar = tqdm(
                total=progress.total,
                file=self.stream,
                leave=False,
                dynamic_ncols=True,
                unit="trial",
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} trials [{elapsed}, {remaining} left]{postfix}",
            )
        self.bar.total = progress.total
        self.bar.n = progress.done
        self.bar.set_postfix_str(running, refresh=False)
        self.bar.refresh()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    @staticmethod
    def _tail(progress: Progress, metric: str) -> str:
        return f"best {with_unit(progress.best, metric)} · baseline {with_unit(progress.baseline, metric)}"

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
            return
        self.stream.write(text + "\n")
        self.stream.flush()
