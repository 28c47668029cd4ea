"""docs/troubleshooting.md's failure kinds are the failure catalogue's: every kind has an entry, each log
line shown is one the pattern table classifies as that kind, and the page holds what the catalogue writes."""

from __future__ import annotations

import pytest

from autotune.trial.failures import FailureKind, classify
from autotune.views.troubleshooting import SEEN, section
from tests.builders import REPO


def test_every_failure_kind_has_an_entry() -> None:
    assert set(SEEN) == set(FailureKind)
    for seen in SEEN.values():
        assert (seen.log_line is None) != (seen.sentence is None), seen


@pytest.mark.parametrize("kind", [kind for kind, seen in SEEN.items() if seen.log_line is not None])
def test_each_log_line_shown_is_classified_as_its_kind(kind: FailureKind) -> None:
    seen = SEEN[kind]
    assert seen.log_text is not None
    failure = classify(seen.log_text, seen.phase)
    assert failure is not None and failure.kind is kind, failure


def test_the_troubleshooting_page_holds_the_section_the_catalogue_writes() -> None:
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    assert section() in page, "docs/troubleshooting.md differs: run python scripts/troubleshooting.py"


def test_a_kind_without_an_entry_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(SEEN, FailureKind.NODE_LOST)
    with pytest.raises(KeyError, match="node_lost"):
        section()
