"""The exit statuses: one table (autotune.cli.common.EXIT_STATUSES), printed by `autotune --help` and held
by docs/cli.md."""

from __future__ import annotations

from pathlib import Path

from autotune.cli import _parser
from autotune.cli.common import EXIT_STATUSES

CLI_PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_help_and_the_cli_page_list_every_exit_status() -> None:
    epilog = _parser().format_help()
    page = CLI_PAGE.read_text()
    for code, meaning in EXIT_STATUSES:
        assert f"  {code:<4} {meaning}" in epilog
        assert f"| {code} | {meaning} |" in page
    assert len({code for code, _ in EXIT_STATUSES}) == len(EXIT_STATUSES)
