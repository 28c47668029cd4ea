"""What a running study prints on the terminal: the observer that `run`, `remeasure` and `ablate`
register, a status line that rewrites itself and one line per finished trial.
"""

from __future__ import annotations

import sys
from typing import TextIO

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
