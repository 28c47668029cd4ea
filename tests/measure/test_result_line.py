"""A job's main through `print_result`: the result line on success, `program: error` and 1 on the job's own
errors, anything else a bug that propagates; the real NCCL job and the simulated one share it."""

from __future__ import annotations

import pytest

from autotune.measure.result_line import parse_result, print_result
from autotune.sim import nccl_job


class JobError(Exception):
    pass


def test_a_measured_payload_is_printed_as_the_result_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert print_result("job", lambda: {"metrics": {"allreduce_us": 12.5}}, (JobError,)) == 0
    assert parse_result(capsys.readouterr().out) == {"metrics": {"allreduce_us": 12.5}}


def test_an_expected_error_is_one_line_on_stderr_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    def fails() -> dict[str, object]:
        raise JobError("rank 3 died")

    assert print_result("job", fails, (JobError,)) == 1
    out = capsys.readouterr()
    assert out.err == "job: rank 3 died\n" and parse_result(out.out) is None
    with pytest.raises(KeyError):  # not the job's error: a bug, with its traceback
        print_result("job", lambda: {}["missing"], (JobError,))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SGLANG_SIM_HARDWARE": "no-such-gpu"}, "no-such-gpu"),
        ({"SGLANG_SIM_HARDWARE": "rtx-pro-6000-pcie-x8"}, "--gpus 16 needs 16 GPUs, but 8 are visible"),
    ],
)
def test_the_simulated_job_reports_a_bad_profile_and_too_many_gpus(
    env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert nccl_job.main(["--gpus", "16", "--messages", "14K:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("autotune.sim.nccl_job: ") and message in err
