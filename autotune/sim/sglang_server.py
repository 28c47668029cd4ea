"""A simulated SGLang server, 0.5.17 or 0.5.23: `python -m autotune.sim.sglang_server [sglang serve flags]`.

It stands in for `sglang serve` (`python -m sglang.launch_server`) with the same command line: it parses
SGLang's flags (argparse's exit 2 on an unknown one), prints SGLang's startup log with real-time pauses, dies
with SGLang's exact fatal lines and exit status, serves SGLang's HTTP API, and generates fake tokens at the
pace the performance model (`autotune.sim.model`) gives for the launch settings and NCCL environment.

Simulator-only settings come from the environment:

- `SGLANG_SIM_VERSION`: the SGLang release to emulate, `0.5.17` (default) or `0.5.23`: its flags, its log
  wording and its behaviour (`autotune.sim.versions`).
- `SGLANG_SIM_HARDWARE`: hardware profile name or YAML path (default `rtx-pro-6000-pcie-x8`).
- `SGLANG_SIM_MODEL`: model profile name or YAML path (default: the model at `--model-path`, as its
  config.json and weights describe it, `autotune.sim.model_folder`; `kimi-k2.5-int4` where the folder has
  no config.json).
- `SGLANG_SIM_TIME_SCALE`: positive float, default 1.0; every modelled duration (init, weight loading,
  graph capture, each scheduler step) lasts its model length times this in real time. 0.001 makes a
  ten-minute weight load take 0.6 s.
- `SGLANG_SIM_STARTUP_TIME_SCALE`: the scale of start-up alone (init, weight loading, graph capture),
  default `SGLANG_SIM_TIME_SCALE`. Start-up does not enter the benchmark, so it can run faster than
  serving.
- `SGLANG_SIM_SEED`: integer seed of the run-to-run noise (default: `--random-seed`, else a fresh seed per
  launch, as two launches of a real server differ).
- `SGLANG_SIM_NOISE`: run-to-run noise: `off` (the default: deterministic), `calibrated` (the hardware
  profile's `noise` section, from the real H200 runs; autotune.sim.model.noise), or a relative spread of
  a launch's speed, e.g. 0.03.
- `SGLANG_SIM_LEASE`: the lease (machine, session) the launch runs on, for calibrated noise (default 0).
- `SGLANG_SIM_FAULT`: comma-separated test faults: `hang_load` (weight loading stops making progress at
  about 19% and the server never becomes ready), `crash_benchmark[:N]` (after N tokens generated once the
  server is ready, default 200, it logs a CUDA error and dies with `os._exit(1)`), `slow_health`
  (`/health` and `/health_generate` take 2 real seconds to answer), `linger` (after a fatal line the
  process stays alive and stops answering, as the seed's server did, instead of killing its tree).
- `SGLANG_SIM_FORCE_CUSTOM_ALLREDUCE=1` and `NCCL_*`: read by the model from the environment, after the
  defaults SGLang sets itself when they are unset (`NCCL_CUMEM_ENABLE`, `NCCL_NVLS_ENABLE`; see
  `sglang_environment`).

Conventions. Durations the server reports (log lines, `e2e_latency`, `last_gen_throughput`) are in model
time, what the real node would report; a client's own clock sees them multiplied by the time scale, which
`/get_server_info` returns as `time_scale`. Each streamed chunk's `meta_info` also carries the model clock
(`sim_received`, `sim_time`: seconds since the launch when the request came and when the chunk's tokens were
made; not SGLang's). SGLang's warm-up waits one real second (a host-side sleep, not
GPU work) before its first request, so that wait is not scaled. The fake tokenizer counts one token per
whitespace-separated word of a text prompt; `input_ids` count as given. There is no EOS: every request
generates exactly its `max_new_tokens`.

Fidelity of measured throughput: a client that times the server by its own clock adds its own overhead
(about a millisecond per request, more on a busy machine) magnified by 1 / time scale: at 0.05 a benchmark
of the default launch lands within about 4% of the model's answer, at 0.01 within about 10%. autotune's
client times a simulated server by the chunks' model clock instead, so its figures are the model's at any
scale, the same on every run of a seeded launch: a request with an `X-Autotune-Arrival` header (its place
in the client's schedule, `autotune.measure.arrival`) is admitted at the model time it is due (`schedule`);
for others, when requests end, the next step waits (until nothing has happened for 0.25 s of wall time) for
the client's next ones, so a closed loop's reply takes no model time and the batches do not depend on when
a request happened to arrive (`serving.Serving.run_engine`); a session's think time shorter than that wait
counts as none. 0.001 is for startup and failure tests.

Exit statuses: 0 after SIGTERM or SIGINT; -9 (SIGKILL of itself, as SGLang's launcher kills its own
tree) after a startup failure or an out-of-memory under load; 1 for `crash_benchmark`, for a `ValueError`
SGLang raises while handling its arguments, and for a bad simulator setting; 2 for an argparse error.

The process is put together from `autotune.sim.server`: `options` (the `SGLANG_SIM_*` settings and the
arguments SGLang resolves), `startup` (the start-up phases), `serving` (the engine in real time),
`schedule` (requests admitted when their client scheduled them), `api` (the HTTP routes) and `ranks` (the
scheduler ranks' log prefixes and fatal exits).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from autotune.errors import ConfigError
from autotune.sim.logfmt import WARNING, SimLog
from autotune.sim.model import LaunchSettings, NodePerformanceModel
from autotune.sim.model_folder import served_model
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.sim.server.api import HttpApi
from autotune.sim.server.launch import Launch
from autotune.sim.server.options import (
    DEFAULT_CRASH_AFTER_TOKENS,
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    FAULTS,
    SimOptions,
    resolved_server_args,
    sglang_environment,
)
from autotune.sim.server.ranks import SchedulerRanks
from autotune.sim.server.serving import Serving, count_text_tokens, fake_token_id
from autotune.sim.server.startup import Startup
from autotune.sim.server_args import build_parser, check_server_args
from autotune.sim.versions import sglang_version

__all__ = [
    "DEFAULT_CRASH_AFTER_TOKENS",
    "DEFAULT_HARDWARE",
    "DEFAULT_MODEL",
    "FAULTS",
    "SimOptions",
    "SimulatedServer",
    "count_text_tokens",
    "fake_token_id",
    "main",
    "resolved_server_args",
    "sglang_environment",
]


def __getattr__(name: str) -> str:
    """`__version__`, what the node check reads as the SGLang version: the one `SGLANG_SIM_VERSION` selects
    (a bad value is the `ConfigError` naming it, so the node check reports it)."""
    if name == "__version__":
        return sglang_version(os.environ).name
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SimulatedServer:
    """One simulated SGLang launch: startup phases, the HTTP API, and the engine loop in real time."""

    def __init__(
        self, ns: argparse.Namespace, node: NodePerformanceModel, options: SimOptions, log: SimLog
    ) -> None:
        self.log = log
        args = resolved_server_args(ns, node, options.seed)
        ranks = SchedulerRanks(ns, log, options.faults)
        launch = Launch(ns, node, options, args, log, ranks)
        self.startup = Startup(launch)
        self.serving = Serving(launch)
        self.api = HttpApi(launch, self.serving)

    async def run(self) -> int:
        """Start, serve until SIGTERM or SIGINT, and return the exit status (a fatal error never returns)."""
        loop = asyncio.get_running_loop()
        lifecycle = asyncio.current_task()
        assert lifecycle is not None  # run() is awaited by asyncio.run
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, lifecycle.cancel)
        engine_task: asyncio.Task[None] | None = None
        try:
            await self.startup.run()
            engine_task = asyncio.create_task(self.serving.run_engine())
            await self.api.start()
            await self.startup.warm_up(self.api.base_url())
            self.serving.ready = True
            self.log.info("The server is fired up and ready to roll!")
            await asyncio.Event().wait()  # serve until a signal cancels this task
        except asyncio.CancelledError:
            pass
        finally:
            if engine_task is not None:
                engine_task.cancel()
            await self.api.stop()
        return 0


# -- entry point -------------------------------------------------------------------------------------------
def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)  # a stop before the event loop runs is still SGLang's clean shutdown


def main(argv: list[str] | None = None) -> int:
    """Run one simulated launch with SGLang's command line; return the exit status."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        version = sglang_version(os.environ)
    except ConfigError as exc:
        print(f"autotune.sim.sglang_server: {exc}", file=sys.stderr)
        return 1
    ns = build_parser(version).parse_args(argv)
    log = SimLog(sys.stderr, ns.log_level, ns.log_level_http)
    try:
        options = SimOptions.from_env(os.environ, default_seed=ns.random_seed)
        hardware = load_hardware_profile(options.hardware)
        found = served_model(ns.model_path) if options.model is None else None
        model = found or load_model_profile(options.model or DEFAULT_MODEL)
    except ConfigError as exc:
        print(f"autotune.sim.sglang_server: {exc}", file=sys.stderr)
        return 1
    settings = LaunchSettings.from_args(ns, sglang_environment(ns, os.environ))
    node = NodePerformanceModel(hardware, model, settings, version)
    # ServerArgs warns before logging is configured, so Python prints these bare; its errors propagate.
    for warning in check_server_args(ns, node.attention_backend):
        log.raw(warning, WARNING)
    return asyncio.run(_serve(ns, node, options, log))


async def _serve(ns: argparse.Namespace, node: NodePerformanceModel, options: SimOptions, log: SimLog) -> int:
    # The server owns asyncio objects, so it is built inside the running loop.
    return await SimulatedServer(ns, node, options, log).run()


if __name__ == "__main__":
    raise SystemExit(main())
