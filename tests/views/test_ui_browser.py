"""`autotune ui` in a real browser: headless Chromium (Debian's, installed by .ci/run) driven by Playwright
opens the MLflow UI on the finished test study, finds the experiment, reads the trial runs' names (number,
tok/s, state), opens a failed trial and sees its failure kind and advice, opens the study's plots, and saves
screenshots of each.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.node.runner import port_is_free
from autotune.study.trust.answer import study_answer
from tests.builders import StudyFiles, e2e_study
from tests.conftest import run_cli

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
URL_LINE = re.compile(r"MLflow UI for study 'e2e': (http://127\.0\.0\.1:(\d+)/\S*)")
START_TIMEOUT_S = 60
STEP_TIMEOUT_MS = 20_000

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

# The run-name cells whose text is cut (MLflow 3.17 renders the name in `a > span`, with an ellipsis).
NAMES_CUT = """cells => cells.filter(c => {
  const name = c.querySelector('a span') || c.querySelector('a');
  return name.scrollWidth > name.clientWidth + 1
    || name.getBoundingClientRect().right > c.getBoundingClientRect().right + 1;
}).map(c => c.querySelector('a').innerText)"""


def _browser_or_skip() -> None:
    """Chromium and Playwright come from .ci/run; elsewhere the test says what is missing. In CI it fails."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium chromium-driver)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if missing:
        message = "browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _read_url(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, int, str]:
    """The URL `autotune ui` prints once the server answers; everything it printed so far."""
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=0.5):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
            match = URL_LINE.search(line)
            if match:
                return match.group(1), int(match.group(2)), seen
    raise AssertionError(f"autotune ui printed no URL within {timeout_s} s: {seen!r}")


@pytest.fixture(scope="module")
def ui(finished_study) -> Iterator[tuple[str, int]]:
    """`autotune ui STUDY.yaml` as a user runs it; stopped with Ctrl-C (SIGINT) afterwards, which must stop
    the MLflow server and free its port."""
    _browser_or_skip()
    path, proc = finished_study
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    server = subprocess.Popen(
        [sys.executable, "-m", "autotune", "ui", str(path)],
        cwd=path.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        url, port, _ = _read_url(server, START_TIMEOUT_S)
        yield url, port
    finally:
        server.send_signal(signal.SIGINT)
        try:
            rc = server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            raise
    assert rc == 0
    assert port_is_free("127.0.0.1", port), "the MLflow server outlived `autotune ui`"
    ours = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--port {port}" not in ours


def _click_past_popovers(page, target) -> None:  # type: ignore[no-untyped-def]
    """Click `target`; if something covers the page ('<html> intercepts pointer events': MLflow 3.17 at
    times opens its "Detect Issues in Your Traces" tour, which only "Got it" closes), close it as a user
    would and click again, naming what covered it if that fails."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        target.click(timeout=STEP_TIMEOUT_MS // 4)
        return
    except PlaywrightTimeout:
        got_it = page.get_by_role("button", name="Got it")
        if got_it.count():
            got_it.first.click()
        else:
            page.keyboard.press("Escape")
    try:
        target.click()
    except PlaywrightTimeout as exc:
        dialogs = page.locator("[role=dialog], [role=menu], [role=tooltip]").all_inner_texts()
        raise AssertionError(f"the page stayed covered; open dialogs/menus: {dialogs}") from exc


def test_a_user_finds_the_trials_and_why_one_failed(ui, finished_study, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    url, _ = ui
    base = url.split("#", 1)[0]
    path, _ = finished_study
    optuna_study = optuna.load_study(
        study_name="e2e", storage=f"sqlite:///{path.parent / '.autotune/e2e/optuna.db'}"
    )
    ran = [t for t in optuna_study.get_trials() if not t.user_attrs.get("skipped")]
    failed = [t for t in ran if t.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)]
    assert failed, "the finished_study fixture must contain a failed or pruned trial for this test"
    target = failed[0]
    kind = target.user_attrs["failure_kind"]

    started = time.monotonic()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(STEP_TIMEOUT_MS)

            # The experiment list shows the study's experiment; the run list is its "Model training" view.
            page.goto(base + "#/experiments")
            page.get_by_role("link", name="e2e", exact=True).first.click()
            _click_past_popovers(page, page.get_by_text("Model training", exact=True))
            parent = page.locator("[col-id='attributes.`Run Name`']").filter(has_text="study e2e")
            parent.get_by_role("button").click()  # the trials are child runs, folded under the study's run
            page.get_by_text("#000 baseline").first.wait_for()
            names = page.locator("[col-id='attributes.`Run Name`'] a").all_inner_texts()
            page.screenshot(path=tmp_path / "runs.png")

            for trial in ran:
                name = next((n for n in names if n.startswith(f"#{trial.number:03d}")), None)
                assert name is not None, f"no run for trial {trial.number} in {names}"
                assert trial.state.name in name
                if trial.state == optuna.trial.TrialState.COMPLETE:
                    assert f"{trial.value:.1f} tok/s" in name
                else:
                    assert trial.user_attrs["failure_kind"] in name

            page.get_by_role("link", name=re.compile(rf"^#{target.number:03d} ")).first.click()
            page.get_by_text("autotune.failure_kind").first.wait_for()
            body = page.inner_text("body")
            assert f"{target.state.name}: {kind}" in body  # the run's description
            assert target.user_attrs["advice"][:40] in body
            assert kind in body
            page.screenshot(path=tmp_path / "failed-trial.png", full_page=True)

            # The study's run carries the plots, served from the study's artifact folder.
            page.go_back()
            page.get_by_role("link", name="study e2e").first.click()
            page.get_by_text("Artifacts", exact=True).first.click()
            page.get_by_text("plots", exact=True).click()
            page.get_by_text("optimization_history.png").click()
            plot = page.locator("img[src^='blob:']").first
            plot.wait_for()
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=plot.element_handle())
            page.screenshot(path=tmp_path / "study-plots.png")
        finally:
            browser.close()
    for shot in ("runs.png", "failed-trial.png", "study-plots.png"):
        data = (tmp_path / shot).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 20_000
    assert time.monotonic() - started < 60, "the browser part must stay under a minute"


def _cells(page, column: str, inner: str = "") -> list[str]:  # type: ignore[no-untyped-def]
    """The run table's cells of `column` (its ag-grid col-id; their `inner` element), top row first."""
    rows = page.locator(".ag-center-cols-container .ag-row, .ag-pinned-left-cols-container .ag-row")
    by_index: dict[int, str] = {}
    for row in rows.all():
        cell = row.locator(f"[col-id='{column}'] {inner}".strip())
        if cell.count():
            by_index[int(row.get_attribute("row-index") or -1)] = cell.first.inner_text().strip()
    return [by_index[i] for i in sorted(by_index)]


def test_the_ui_opens_on_the_trials_sorted_best_first(ui, finished_study, tmp_path: Path) -> None:
    """Without a click: every trial a row (not folded under the study's run), its objective value, state,
    failure kind and best mark as columns, the best value first."""
    from playwright.sync_api import sync_playwright

    url, _ = ui
    path, _ = finished_study
    optuna_study = optuna.load_study(
        study_name="e2e", storage=f"sqlite:///{path.parent / '.autotune/e2e/optuna.db'}"
    )
    ran = [t for t in optuna_study.get_trials() if not t.user_attrs.get("skipped")]
    answer = study_answer(optuna_study)  # study_rank 1 is the answer's trial, as `autotune best` gives it
    assert answer is not None and answer.trial is not None
    best = optuna_study.trials[answer.trial]
    assert best.value is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1920, "height": 760})
            page.set_default_timeout(STEP_TIMEOUT_MS)
            page.goto(url)
            page.get_by_text("#000 baseline").first.wait_for()
            page.get_by_text("autotune.failure_kind").first.wait_for()
            header = page.locator(".ag-header").inner_text()
            for column in ("study_rank", "output_throughput", "state", "failure_kind", "autotune.best"):
                assert column in header, header
            names = _cells(page, "attributes.`Run Name`", "a")
            # Each name whole: its text neither cut by an ellipsis nor running past its cell.
            cut = page.locator(".ag-row [col-id='attributes.`Run Name`']").evaluate_all(NAMES_CUT)
            assert not cut, cut
            # docs/results.md's picture: AUTOTUNE_UI_SCREENSHOT=docs/autotune-ui.png
            page.screenshot(path=os.environ.get("AUTOTUNE_UI_SCREENSHOT") or tmp_path / "trials.png")
            assert not any(name.startswith("study ") for name in names), names
            assert len(names) == len(ran), names
            assert names[0].startswith(f"#{best.number:03d}"), names
            ranks = [int(v) for v in _cells(page, "metrics.`study_rank`") if v not in ("", "-")]
            assert ranks == list(range(1, len(ranks) + 1)), (names, ranks)
            value = _cells(page, "metrics.`output_throughput`")[0]
            assert float(value.rstrip(".…")) == pytest.approx(best.value, abs=0.01)
            states = _cells(page, "tags.`autotune.state`")
            assert set(states) == {t.state.name for t in ran}, states
            kinds = _cells(page, "tags.`autotune.failure_kind`")
            assert {t.user_attrs["failure_kind"] for t in ran if "failure_kind" in t.user_attrs} <= set(kinds)
            marks = _cells(page, "tags.`autotune.best`")
            assert marks[0] == "true", (names, marks)
        finally:
            browser.close()


def test_ui_refuses_to_listen_beyond_loopback_without_allow_remote(finished_study) -> None:
    path, _ = finished_study
    proc = run_cli("ui", str(path), "--host", "0.0.0.0", cwd=path.parent)
    assert proc.returncode == 2
    assert "--allow-remote" in proc.stderr and "no login" in proc.stderr


def test_ui_on_a_study_that_never_ran_says_how_to_start_it(tmp_path: Path, study_file: StudyFiles) -> None:
    path = study_file(e2e_study())
    proc = run_cli("ui", str(path), cwd=tmp_path)
    assert proc.returncode == 1
    assert "autotune run" in proc.stderr


def test_ui_serves_the_study_store_and_its_artifact_folder(study_file: StudyFiles) -> None:
    from autotune.config import load_study
    from autotune.config.hosts import is_loopback
    from autotune.views.ui import server_command

    study = load_study(study_file(e2e_study()))
    command = server_command(study, "127.0.0.1", 5123)
    artifacts = (study.workdir / "artifacts").resolve()
    assert command[command.index("--backend-store-uri") + 1] == study.tracking_uri
    assert command[command.index("--artifacts-destination") + 1] == str(artifacts)
    assert command[command.index("--default-artifact-root") + 1] == artifacts.as_uri()
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "::", "example.org"))
