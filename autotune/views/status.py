"""`autotune status` for a person: each failure said in a sentence, and rows that fit the terminal.

The full text of every field stays in `autotune status --json`; here long rows wrap at the terminal's
width (`shutil.get_terminal_size`: the COLUMNS variable, then the terminal, else 80 columns).
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from typing import Any

# Failures whose fix is in SGLang's own message (a rejected flag, an unsupported feature): status quotes it.
SHOWN_WITH_MESSAGE = frozenset({"invalid_arguments", "unsupported"})
# Trials never launched: autotune's own reason is the sentence (it names the setting refused).
NEVER_LAUNCHED = frozenset({"forbidden", "predicted_oom", "known_incompatible"})
# The narrowest a wrapped column gets, however wide the columns before it are.
MIN_TEXT_WIDTH = 24


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


def fitted(prefix: str, text: str, width: int) -> list[str]:
    """`prefix` then `text`, wrapped at `width` with the continuation lines under the text's start; a
    word longer than the room left is cut where the line ends, never lost (it goes on the next line)."""
    room = max(width - len(prefix), MIN_TEXT_WIDTH)
    parts = textwrap.wrap(text, room, break_long_words=True, break_on_hyphens=False) or [""]
    return [prefix + parts[0], *(" " * len(prefix) + part for part in parts[1:])]
