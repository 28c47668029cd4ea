"""The console of a whole study, in process on the model of the seed's node: the baseline, the NCCL stage,
the search and the confirmation rounds each announced before their first row, rows with units, confirmation
rows labelled."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

from autotune.cli.console import ConsoleReporter, with_unit
from autotune.config import Study, load_study
from autotune.node.pool import LocalNodePool, NodePool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.loop import StudyDriver
from autotune.study.stages import STAGE_SUFFIX
from tests.builders import StudyFiles


def model_pool() -> Callable[[Study], NodePool]:
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    return lambda _study: LocalNodePool(
        {"n0": ModelNodeExecutor("n0", hw, model, noise=0.01)}, {"n0": node_report("n0", hw, model)}
    )


def test_each_stage_is_announced_before_its_rows_with_metric_unit_and_direction(tmp_path: Path) -> None:
    # Two rounds launched (none made of the search's launches), so both rounds' labels show.
    confirm = {"top": 1, "max_rounds": 2, "pair_search_launches": False}
    trust = {"repeat_baseline_after": 2, "confirm": confirm, "stop_early": False}
    path = StudyFiles(tmp_path)(n_trials=4, nccl_stage={"hidden_size": 7168}, trust=trust)
    stream = io.StringIO()
    StudyDriver(load_study(path), [ConsoleReporter(stream)], pool=model_pool(), tracking=None).run()
    lines = stream.getvalue().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("== ")]
    assert len(heads) == 4, lines
    study, stage, search, confirm = (lines[i] for i in heads)
    # The baseline first (a measured server after the first launch), then the stage, then the search.
    assert study.startswith("== study t: 4 trials of the server (trial 0 is SGLang's defaults, the baseline)")
    assert "output_throughput in tok/s, higher is better" in study
    assert lines[heads[0] + 1 : heads[1]] == [lines[heads[0] + 1]], "the baseline's row alone"
    assert lines[heads[0] + 1].startswith("[  1/4] baseline  COMPLETE") and " tok/s" in lines[heads[0] + 1]
    assert stage.startswith(f"== NCCL stage t{STAGE_SUFFIX}: ")
    assert "allreduce_us in µs, lower is better" in stage
    assert search.startswith("== study t, continued: the search, the NCCL stage's best held in every server")
    assert "output_throughput in tok/s, higher is better" in search
    assert confirm.startswith("== confirmation of t: the best 1 config(s) and SGLang's defaults")
    stage_rows = lines[heads[1] + 1 : heads[2]]
    assert stage_rows[0].startswith("[  1/26] defaults  COMPLETE") and " µs " in stage_rows[0]
    assert any(line.startswith("NCCL stage t") for line in stage_rows), "the stage's result before the search"
    search_rows = [line for line in lines[heads[2] + 1 : heads[3]] if line.startswith("[")]
    assert search_rows[0].startswith("[  2/4] trial 1 ") and " tok/s" in search_rows[0]
    assert search_rows[-1].startswith("[  4/4] "), "the search's counter ends at its budget"
    repeats = [row for row in search_rows if "baseline " in row.split("best")[0]]
    assert not repeats and any("(defaults again)" in row for row in search_rows), search_rows
    confirm_rows = lines[heads[3] + 1 :]
    assert len(confirm_rows) == 4 and not any(line.startswith("[") for line in confirm_rows), confirm_rows
    found = [re.search(r"\((confirm r\d · [^)]+)\)", line) for line in confirm_rows]
    labels = [match.group(1) for match in found if match is not None]
    assert len(labels) == 4
    assert {label.split(" · ")[0] for label in labels} == {"confirm r1", "confirm r2"}
    assert sum("SGLang's defaults" in label for label in labels) == 2
    configs = [label for label in labels if "defaults" not in label]
    assert all(re.fullmatch(r"confirm r\d · trial \d+'s config", label) for label in configs)
    assert all(" tok/s" in line for line in confirm_rows)


def test_on_a_terminal_a_progress_bar_shows_the_time_left_and_piped_output_has_none(tmp_path: Path) -> None:
    import fcntl
    import os
    import pty
    import struct
    import termios
    import threading

    path = StudyFiles(tmp_path)(n_trials=3, nccl_stage=False, trust=False)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    received: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            received.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with os.fdopen(slave, "w") as terminal:
        StudyDriver(load_study(path), [ConsoleReporter(terminal)], pool=model_pool(), tracking=None).run()
    reader.join(timeout=5)
    shown = b"".join(received).decode(errors="replace")
    assert re.search(r"\| [0-3]/3 trials \[\d\d:\d\d, [^\]]+ left\]", shown), shown[-2000:]
    assert "[  3/3] trial 2 " in shown  # the rows are there too
    piped = io.StringIO()
    StudyDriver(load_study(path), [ConsoleReporter(piped)], pool=model_pool(), tracking=None).run(4)
    assert " left]" not in piped.getvalue() and "\r" not in piped.getvalue()


def test_a_value_under_ten_shows_three_significant_digits() -> None:
    # A max_load of 0.099 req/s and one of 0.125 both showed as 0.1 (one decimal) on a slow node.
    assert [with_unit(v, "max_load") for v in (0.0987, 0.125, 16.0)] == ["0.0987", "0.125", "16.0"]
    assert with_unit(1234.56, "output_throughput") == "1234.6 tok/s" and with_unit(None, "max_load") == "-"
