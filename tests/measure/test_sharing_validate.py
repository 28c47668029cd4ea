"""`autotune validate` as a user runs it on a study whose objective sends each kind of shared prefixes: a
good file passes, a bad one is one line naming the file, the field, the value and the fix, and nothing is
created."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import REPO

pytestmark = pytest.mark.integration  # the CLI runs as a process

TRACE = REPO / "traces" / "agentic-sessions.jsonl"
KINDS = {
    "shared_prefix": "  shared_prefix: {num_groups: 4, prompts_per_group: 8, system_prompt_len: 2048, "
    "question_len: 128, output_len: 256}\n  concurrency: 16\n",
    "sessions": "  sessions: {num_sessions: 4, turns: 3, first_prompt_len: 28000, user_len: 500, "
    "output_len: 1000, think_time_s: 2}\n",
    "trace": f"  trace: {{path: {TRACE}, speedup: 4}}\n  concurrency: 16\n",
}


def _validate(tmp_path: Path, workload: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "objective.yaml").write_text(f"name: t\nmetric: output_throughput\nworkload:\n{workload}")
    study = (REPO / "examples" / "agentic-sessions.yaml").read_text()
    study = study.replace(
        "../search_spaces/prefix-cache.yaml", str(REPO / "search_spaces" / "prefix-cache.yaml")
    )
    (tmp_path / "study.yaml").write_text(
        study.replace("../objectives/agentic-sessions.yaml", "objective.yaml")
    )
    return subprocess.run(
        [sys.executable, "-m", "autotune", "validate", "study.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_validates(tmp_path: Path, kind: str) -> None:
    done = _validate(tmp_path, KINDS[kind])
    assert done.returncode == 0, done.stderr
    assert "study agentic-sessions: OK" in done.stdout


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        (
            KINDS["sessions"].replace("turns: 3", "turns: 0"),
            "objective.yaml: workload.sessions.turns: must be > 0 (got 0). Use a value > 0.",
        ),
        (
            KINDS["trace"].replace("speedup: 4", "speedup: 4, block_size: 1024"),
            "objective.yaml: workload.trace.path: line 1: hash_ids: more blocks than",
        ),
        (
            KINDS["shared_prefix"] + "  output_len: 10\n",
            "objective.yaml: workload.output_len: shared_prefix sets output_len (256) (got 10). Leave "
            "workload.output_len out; set the lengths in workload.shared_prefix.",
        ),
    ],
    ids=["sessions-turns", "trace-block-size", "shared-prefix-output-len"],
)
def test_a_bad_kind_is_one_line_naming_the_field(tmp_path: Path, workload: str, expected: str) -> None:
    done = _validate(tmp_path, workload)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("autotune: error: "), done.stderr
    assert expected in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["objective.yaml", "study.yaml"]  # nothing created
