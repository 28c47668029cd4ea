"""The README and docs/ as a new user meets them: the README opens with the two commands that work on a fresh
machine and fits on a screen, and every link and repository path the pages name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.builders import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 100  # one screen, roughly: the rest belongs in docs/
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path in backticks that starts at a top-level folder of the repository, e.g. `benchmarks/RESULTS.md`.
TOP_LEVEL = sorted(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith("."))
REPO_PATH = re.compile(r"`((?:" + "|".join(map(re.escape, TOP_LEVEL)) + r")/[^`\s]*)`")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # a `#` in a code block is no heading
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (REPO / "README.md").read_text()
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands == ["scripts/quickstart", "scripts/test"], f"README.md's first code block runs {commands}"
    assert readme.index("```") < readme.index("\n## ", readme.index("## Two commands") + 1)
    for script in commands:
        assert (REPO / script).stat().st_mode & 0o111, f"{script} is not executable"
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == "exec scripts/test", "CI no longer runs the README's test command"


def test_the_readme_fits_on_a_screen() -> None:
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail to a page in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_anchor_exists(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_named_exists(page: Path) -> None:
    missing = [
        name
        for name in REPO_PATH.findall(page.read_text())
        # Placeholders (<study>, *, {i}) and what a study writes (.autotune/) are not in the repository.
        if not any(c in name for c in "<*{") and ".autotune/" not in name and not (REPO / name).exists()
    ]
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_the_link_check_finds_a_missing_page_and_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A heading: `with code`\n")
    page.write_text("[ok](other.md#a-heading-with-code) [gone](nowhere.md) [no heading](other.md#missing)\n")
    with pytest.raises(AssertionError, match=r"nowhere\.md: no file .*other\.md#missing: no heading"):
        test_every_link_and_anchor_exists(page)
