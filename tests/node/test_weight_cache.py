"""The weight cache's rules without a process: the matched fraction f', which launch the daemon serves, and
what a finished launch's log teaches (autotune.node.weight_cache)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autotune.config import load_study
from autotune.dialect import Dialect, committed_table, committed_versions, table_from_help
from autotune.errors import ConfigError
from autotune.node.weight_cache import (
    DaemonLayout,
    WeightCacheState,
    client_launch,
    daemon_layout,
    matched_fraction,
    read_load,
)
from autotune.trial.launch import ServerLaunch
from autotune.trial.startup import takes_weight_cache

# benchmarks/sglang-h200/weight_cache/: the disk-loaded server's log and a client's (SGLang 0.5.17, one H200).
H200 = Path(__file__).resolve().parents[2] / "benchmarks" / "sglang-h200" / "weight_cache"


def _launch(
    *flags: tuple[str, str | None], command: tuple[str, ...] = ("python", "-m", "sglang.launch_server")
):
    base = (("--model-path", "/models/m"), *flags, ("--host", "127.0.0.1"), ("--port", "30000"))
    return ServerLaunch(command, {}, "127.0.0.1", 30000, flags=base)


def test_the_matched_fraction_is_the_one_measured_on_the_h200() -> None:
    # (T x f - W) / T_c with the H200's readings: the client at 0.83794 got the disk-loaded pool to 0.01%.
    assert matched_fraction(0.85, 139.13, 13.51, 125.01) == 0.83794


def test_the_matched_fraction_reads_the_real_logs() -> None:
    normal = read_load((H200 / "server-normal.log").read_text())
    client = read_load((H200 / "server-client-0.85.log").read_text())
    assert normal == (139.13, 13.51) and client == (125.01, 0.0)
    assert matched_fraction(0.85, *normal, client[0]) == 0.83794


@pytest.mark.parametrize(
    ("f", "t", "w", "tc"),
    [(0.0, 100, 10, 90), (1.0, 100, 10, 90), (0.85, 0, 10, 90), (0.85, 100, 10, 0), (0.2, 100, 30, 70)],
)
def test_no_matched_fraction_where_there_is_none(f: float, t: float, w: float, tc: float) -> None:
    with pytest.raises(ValueError, match=r"must hold|outside"):
        matched_fraction(f, t, w, tc)


def test_the_daemon_serves_one_layout_and_refuses_speculation_and_quantizations() -> None:
    plain = daemon_layout(_launch(("--tp-size", "8"), ("--trust-remote-code", None)))
    assert isinstance(plain, DaemonLayout)
    assert plain.argv == [
        "python", "-m", "sglang.srt.weight_cache.daemon", "--model-path", "/models/m", "--tp-size", "8",
        "--pp-size", "1", "--dp-size", "1", "--ep-size", "1", "--trust-remote-code",
    ]  # fmt: skip
    assert daemon_layout(_launch(("--tp", "8"), ("--trust-remote-code", None))) == plain  # an alias
    assert daemon_layout(_launch(("--tp-size", "4"))) != plain
    assert "speculative" in str(daemon_layout(_launch(("--speculative-algorithm", "EAGLE3"))))
    assert "--quantization awq" in str(daemon_layout(_launch(("--quantization", "awq"))))
    assert isinstance(daemon_layout(_launch(("--quantization", "fp8"))), DaemonLayout)
    sim = daemon_layout(_launch(command=("python", "-m", "autotune.sim.sglang_server")))
    assert isinstance(sim, DaemonLayout) and sim.command[2] == "autotune.sim.weight_cache_daemon"
    assert "does not know" in str(daemon_layout(_launch(command=("sglang", "serve"))))


def _learned(state: WeightCacheState, launch: ServerLaunch, log: str, chose: float | None = None) -> None:
    choices = {"--mem-fraction-static": chose} if chose is not None else {}
    state.learn(launch, state.plan(launch), log, choices)


def test_the_first_launch_loads_from_disk_and_later_ones_are_clients_at_f_prime() -> None:
    state = WeightCacheState()
    first = _launch(("--mem-fraction-static", "0.85"))
    plan = state.plan(first)
    assert plan.layout is None and "the first launch of this layout" in (plan.note or "")
    _learned(state, first, (H200 / "server-normal.log").read_text())
    plan = state.plan(first)
    assert plan.layout is not None and plan.fraction == 0.85
    state.running = plan.layout
    state.readings[plan.layout].daemon_gb = 14453 / 1024  # nvidia-smi's MiB on the H200
    client = state.client(plan)
    assert not isinstance(client, str)
    launch, note = client
    # T_c predicted as T less the daemon's memory: 125.02 GB (f' 0.8379) against the 125.01 the client logged
    assert launch.flag("--mem-fraction-static") == "0.8379" and launch.flag("--weight-cache-mode") == "client"
    assert launch.argv.count("--mem-fraction-static") == 1 and "weights from the weight cache daemon" in note
    _learned(state, launch, (H200 / "server-client-fprime.log").read_text())
    client = state.client(plan)
    # T_c as the client logged it, T = T_c + the daemon's memory (the same launch's init in both)
    assert not isinstance(client, str) and client[0].flag("--mem-fraction-static") == "0.8379"
    state.readings[plan.layout].client_before_gb = 100.0  # another launch's init: T moves with T_c
    assert state.client(plan) == client  # this launch's environment has its own client reading
    client = state.client(replace(plan, launch=replace(plan.launch, env={"NCCL_BUFFSIZE": "1048576"})))
    expected = matched_fraction(0.85, 100.0 + 14453 / 1024, 13.51, 100.0)
    assert not isinstance(client, str) and client[0].flag(
        "--mem-fraction-static"
    ) == f"{expected:.5f}".rstrip("0")


def test_a_launch_that_leaves_the_fraction_to_sglang_is_served_once_its_choice_is_known() -> None:
    state = WeightCacheState()
    disk = _launch(("--mem-fraction-static", "0.85"))
    _learned(state, disk, (H200 / "server-normal.log").read_text())
    unset = _launch(("--cuda-graph-max-bs", "64"))
    plan = state.plan(unset)
    assert plan.layout is None and "leaves --mem-fraction-static to SGLang" in (plan.note or "")
    _learned(state, unset, (H200 / "server-normal.log").read_text(), chose=0.85)
    plan = state.plan(unset)
    assert plan.fraction == 0.85
    served = client_launch(unset, 0.8379)  # a client logs its own f' as SGLang's: not SGLang's choice
    state.learn(
        served, plan, (H200 / "server-client-fprime.log").read_text(), {"--mem-fraction-static": 0.8379}
    )
    assert state.plan(unset).fraction == 0.85
    assert state.plan(_launch(("--cuda-graph-max-bs", "32"))).layout is None  # other flags: not known


def test_a_speculative_launch_is_not_served_and_teaches_nothing() -> None:
    state = WeightCacheState()
    spec = _launch(("--mem-fraction-static", "0.85"), ("--speculative-algorithm", "EAGLE3"))
    _learned(state, spec, (H200 / "server-normal.log").read_text())
    assert not state.readings
    plan = state.plan(spec)
    assert plan.layout is None and "speculative decoding" in (plan.note or "")


def test_weight_cache_is_off_by_default_and_strict(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    text = (Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").read_text()
    root = Path(__file__).resolve().parents[2] / "examples"
    path.write_text(text.replace("../", f"{root.parent}/"))
    assert load_study(path).file.startup.weight_cache is False
    path.write_text(path.read_text() + "startup: {weight_cache: yes please}\n")
    with pytest.raises(ConfigError, match=r"startup\.weight_cache"):
        load_study(path)


def test_the_weight_cache_only_where_the_version_takes_it() -> None:
    for version in committed_versions():  # 0.5.17 to 0.5.23: --weight-cache-mode {off,daemon,client}
        assert takes_weight_cache(Dialect(committed_table(version)))
    older = table_from_help("  --model-loader-extra-config MODEL_LOADER_EXTRA_CONFIG\n", "0.5.4", "--help")
    assert not takes_weight_cache(Dialect(older))


def test_the_daemon_is_ready_and_refuses_as_real_sglang_logs_it() -> None:
    from autotune.node.weight_cache import DAEMON_LISTENING, DAEMON_READY, QUANT_REFUSED

    daemon = (H200 / "daemon.log").read_text()  # 0.5.17, single-rank mode: each rank's own lines
    assert DAEMON_LISTENING.findall(daemon) == ["0"]
    # the launcher's line in multi-rank mode (0.5.17 weight_cache/daemon.py:774-779)
    line = (
        "All 8 weight cache daemons on node 0 are ready (pp_ranks=0..0, tp_ranks=0..7, dist_init_method=None)"
    )
    assert DAEMON_READY.search(line)
    # 0.5.17 protocol.py check_ipc_quant_support, where="daemon"
    refusal = (
        "sglang.srt.weight_cache.protocol.UnsupportedQuantForIPCError: [weight_cache:daemon] quantization "
        "method 'awq' is not verified for CUDA IPC zero-copy weight sharing. Its "
    )
    found = QUANT_REFUSED.search(refusal)
    assert found is not None and found.group(1) == "awq"


def test_a_client_that_fell_back_to_disk_ends_the_daemon_for_its_layout() -> None:
    state = WeightCacheState()
    launch = _launch(("--mem-fraction-static", "0.85"))
    _learned(state, launch, (H200 / "server-normal.log").read_text())
    plan = state.plan(launch)
    client = state.client(replace(plan, layout=plan.layout))
    assert not isinstance(client, str) and plan.layout is not None
    # 0.5.17 ipc_loader.py:113-117, as a client logs it when the daemon's fingerprint does not match
    fell_back = (
        "[2026-12-05 13:15:10 TP0] [IpcModelLoader] Weight cache not available or config mismatch, falling "
        "back to disk load\n" + (H200 / "server-normal.log").read_text()
    )
    state.learn(client[0], plan, fell_back, {})
    again = state.plan(launch)
    assert again.layout is None and "loaded from disk instead" in (again.note or "")
