"""Screenshots of a finished study's answer for the docs: the first screen of `autotune report`
(docs/report.png) and the study's MLflow parent run in `autotune ui` (docs/mlflow-parent-run.png).

    python scripts/screenshots.py examples/quickstart.yaml [--out docs]

Headless Chromium (/usr/bin/chromium) driven by Playwright (a dev dependency), launched as
tests/views/test_ui_browser.py does. Each screenshot is one 1280x800 screen; the script fails, writing
nothing more, when the study's answer (the parent run's `autotune.answer` tag: verdict and interval) is not
on that first screen. The MLflow server it starts runs in its own process group and is stopped on the way out.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import ViewportSize

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
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
STEP_TIMEOUT_MS = 30_000
SETTLE_MS = 2_000  # for the run page's other panels (metrics, tags) to draw after the description
REPORT_PNG = "report.png"
PARENT_RUN_PNG = "mlflow-parent-run.png"
# Enough of the answer's sentence to find it on a page: its verdict and the start of its interval.
ANSWER_PREFIX_CHARS = 60


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/screenshots.py",
        description="Screenshot a finished study's report (first screen) and its MLflow parent run.",
    )
    parser.add_argument("study_file", type=Path, metavar="STUDY.yaml", help="a study that has finished")
    parser.add_argument("--out", type=Path, default=Path("docs"), metavar="DIR", help="folder for the PNGs")
    return parser.parse_args(argv)


def parent_run(tracking_uri: str, study_name: str) -> tuple[str, str, dict[str, str]]:
    """The study's MLflow parent run: its experiment id, run id and tags."""
    from mlflow.tracking import MlflowClient

    from autotune.tracking.tracker import STUDY_TAG

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(study_name)
    if experiment is None:
        sys.exit(
            f"scripts/screenshots.py: no MLflow experiment {study_name!r} at {tracking_uri}: run the study"
        )
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{STUDY_TAG}` = '{study_name}' and tags.`autotune.role` = 'study'",
        order_by=["attributes.start_time ASC"],
    )
    if not runs:
        sys.exit(f"scripts/screenshots.py: study {study_name!r} has no parent run at {tracking_uri}")
    run = runs[0]
    if "autotune.answer" not in run.data.tags:
        sys.exit(f"scripts/screenshots.py: study {study_name!r} has no answer yet: let `autotune run` finish")
    return str(experiment.experiment_id), run.info.run_id, dict(run.data.tags)


def require_on_first_screen(page: Any, text: str, what: str) -> None:
    """Fail unless `text` is shown inside the viewport, as a reader sees it without scrolling."""
    target = page.get_by_text(text).first
    target.wait_for()
    box = target.bounding_box()
    if box is None or box["y"] < 0 or box["y"] + box["height"] > VIEWPORT["height"]:
        sys.exit(f"scripts/screenshots.py: {what}: {text!r} is not on the first screen (box {box})")


def close_assistant(page: Any) -> None:
    """Close the MLflow UI's "MLflow Assistant" side panel (3.17 opens it by itself), which takes a third
    of the screen; where this MLflow shows none, nothing to do."""
    # The panel's own buttons: "New Chat", "Settings", "Close" in its header, its provider picker below.
    provider = page.get_by_role("button", name="Change assistant provider")
    try:
        provider.first.wait_for(timeout=5_000)
    except Exception:  # no assistant panel in this MLflow version
        return
    page.locator("button[aria-label='New Chat'] ~ button[aria-label='Close']").first.click()
    provider.first.wait_for(state="hidden")


def show_whole_description(page: Any) -> None:
    """Unfold the run's description (its rows under the answer: the config, gain, baseline, noise)."""
    more = page.get_by_text("Show more", exact=True)
    try:
        more.first.wait_for(timeout=10_000)
    except Exception:  # a description short enough to be shown whole
        return
    more.first.click()
    page.get_by_text("Show less", exact=True).first.wait_for()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from playwright.sync_api import sync_playwright

    from autotune.config import load_study
    from autotune.views.ui import start_ui

    study = load_study(args.study_file)
    experiment, run_id, tags = parent_run(study.tracking_uri, study.name)
    answer = tags["autotune.answer"].splitlines()[0][:ANSWER_PREFIX_CHARS]
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="autotune-report-") as folder:
        subprocess.run(
            [sys.executable, "-m", "autotune", "report", str(args.study_file), "--out", folder], check=True
        )
        report = Path(folder) / "report.html"
        server = start_ui(study)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
                )
                try:
                    page = browser.new_page(viewport=VIEWPORT)
                    page.set_default_timeout(STEP_TIMEOUT_MS)
                    page.goto(report.as_uri())
                    require_on_first_screen(page, answer, "the report")
                    page.screenshot(path=args.out / REPORT_PNG)

                    page.goto(f"{server.url}#/experiments/{experiment}/runs/{run_id}")
                    close_assistant(page)
                    show_whole_description(page)
                    require_on_first_screen(page, answer, "the MLflow parent run")
                    page.wait_for_timeout(SETTLE_MS)  # MLflow polls forever: no "network idle" comes
                    page.screenshot(path=args.out / PARENT_RUN_PNG)
                finally:
                    browser.close()
        finally:
            server.stop()
    for name in (REPORT_PNG, PARENT_RUN_PNG):
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
