"""scripts/test's two workers: which tests one worker runs together, and which go out first."""

from __future__ import annotations

from tests.builders import REPO
from tests.conftest import FIRST_GROUPS, xdist_group


def test_a_file_is_a_group_and_the_files_of_the_finished_study_are_one() -> None:
    assert xdist_group("tests/test_layers.py") == "tests/test_layers.py"
    readers = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        if "def test_" in (text := path.read_text()) and "finished_study" in text
    ]
    assert "tests/test_study_e2e.py" in readers and "tests/views/test_report.py" in readers
    assert {xdist_group(file) for file in readers} == {"finished_study"}


def test_the_groups_sent_first_exist() -> None:
    # A renamed file would silently go out last again.
    for group in FIRST_GROUPS:
        assert group == "finished_study" or (REPO / group).is_file(), group
