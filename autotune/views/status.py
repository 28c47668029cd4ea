"""`autotune status` for a person: each failure said in a sentence, and rows that fit the terminal.

The full text of every field stays in `autotune status --json`; here long rows wrap at the terminal's
width (`shutil.get_terminal_size`: the COLUMNS variable, then the terminal, else 80 columns).
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import Study

if TYPE_CHECKING:
    import optuna

# Failures whose fix is in SGLang's own message (a rejected flag, an unsupported feature): status quotes it.
SHOWN_WITH_MESSAGE = frozenset({"invalid_arguments", "unsupported"})
# Trials never launched: autotune's own reason is the sentence (it names the setting refused).
NEVER_LAUNCHED = frozenset({"forbidden", "predicted_oom", "known_incompatible"})
# The narrowest a wrapped column gets, however wide the columns before it are.
MIN_TEXT_WIDTH = 24
# Where a row's text goes on when its own column is too narrow for its longest word (a flag and its value).
UNDER_ROW_INDENT = 6


def failure_sentence(record: Mapping[str, Any]) -> str | None:
    """What went wrong, as a sentence: the failure's description (a bare `AssertionError` says nothing
    alone), with SGLang's own message where its fix is there; None for a trial that did not fail."""
    kind, line, description = record["failure_kind"], record["failure"], record.get("failure_description")
    if not line:
        return None
    if kind in NEVER_LAUNCHED:
        return line
    if kind in SHOWN_WITH_MESSAGE:
        return f"{description}: SGLang says: {line}" if description else f"SGLang says: {line}"
    return description


def terminal_width() -> int:
    return shutil.get_terminal_size().columns


def too_narrow(prefix: str, text: str, width: int) -> bool:
    """Whether a word of `text` (`--mem-fraction-static=0.85`) is wider than the room beside `prefix`."""
    return max((len(word) for word in text.split()), default=0) > max(width - len(prefix), MIN_TEXT_WIDTH)


def fitted(prefix: str, text: str, width: int, under: bool | None = None) -> list[str]:
    """`prefix` then `text`, wrapped at `width` with the continuation lines under the text's start; when a
    word is wider than the room beside the prefix (`too_narrow`), or `under` says so (a table whose rows read
    one way), the text goes on the lines below it, indented, so that words stay whole; a word wider than
    even that is cut where the line ends, never lost (it goes on the next line)."""
    room = max(width - len(prefix), MIN_TEXT_WIDTH)
    if under is None:
        under = too_narrow(prefix, text, width)
    if prefix.strip() and under:
        return [prefix.rstrip(), *fitted(" " * UNDER_ROW_INDENT, text, width)]
    parts = textwrap.wrap(text, room, break_long_words=True, break_on_hyphens=False) or [""]
    return [prefix + parts[0], *(" " * len(prefix) + part for part in parts[1:])]


def nccl_stage(
    study: Study, storage: str, optuna_study: optuna.Study | None = None
) -> tuple[list[str], dict[str, Any]]:
    """The study's NCCL stage as status shows it once, above the table: its result and the values every
    server trial holds (as the study recorded them once its search began: a pass cut short, or one that
    left out what the node's links could not change), or, while it is not finished (a Ctrl-C during it),
    how many of its all-reduce trials are measured; and the values held (the rows leave them out).
    Nothing without a stage."""
    import optuna

    from autotune.study import stages
    from autotune.study.records import StudyRecord

    recorded = StudyRecord.of(optuna_study) if optuna_study is not None else None
    knobs = stages.stage_knobs(study, nvlink=recorded is not None and recorded.nvlink)
    name = study.name + stages.STAGE_SUFFIX
    if not knobs or name not in optuna.get_all_study_names(storage):
        return [], {}
    record = recorded.nccl_stage if recorded is not None else None
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    result = stages.StageResult.from_record(record) if record else stages.stage_result(knobs, trials)
    if result is not None:
        return result.lines(name), {n: v for n, v in result.held.items() if v is not None}
    done = sum(t.state.is_finished() for t in trials)
    left = [t.number for t in trials if not t.state.is_finished()]
    unfinished = f" ({len(left)} interrupted or queued: trials {', '.join(map(str, left))})" if left else ""
    return [
        f"NCCL stage {name}: {done} of {stages.ascent_size(knobs)} all-reduce trials measured{unfinished}; "
        f"not finished: `autotune resume {study.path}` continues it, then the server trials"
    ], {}
