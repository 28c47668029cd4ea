"""The exit statuses: one table (autotune.cli.common.EXIT_STATUSES), printed by `autotune --help` and held
by the README."""

from __future__ import annotations

from pathlib import Path

from autotune.cli import _parser
from autotune.cli.common import EXIT_STATUSES

README = Path(__file__).resolve().parents[1] / "README.md"


def test_help_and_the_readme_list_every_exit_status() -> None:
    epilog = _parser().format_help()
    readme = README.read_text()
    for code, meaning in EXIT_STATUSES:
        assert f"  {code:<4} {meaning}" in epilog
        assert f"| {code} | {meaning} |" in readme
    assert len({code for code, _ in EXIT_STATUSES}) == len(EXIT_STATUSES)
