"""A simulated SGLang server, 0.5.17 or 0.5.23: `python -m autotune.sim.sglang_server [sglang serve flags]`.

It stands in for `sglang serve` with the same command line, log lines, fatal messages and HTTP API, and
generates tokens at the pace the performance model (`autotune.sim.model`) gives, so that a study runs, and
the tests launch a real process, without a GPU. Its SGLANG_SIM_* settings and how it follows real SGLang:
docs/design.md, "The simulated server".
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
from autotune.sim.model_folder import node_profiles
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
from autotune.sim.weight_cache_daemon import held_gb, live_daemons

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


def share_gpu_with_daemon(ns: argparse.Namespace, node: NodePerformanceModel) -> None:
    """What a live simulated weight cache daemon on this launch's GPUs holds, and whether this launch (a
    `--weight-cache-mode client` of the same model and layout) maps its weights."""
    gpus = range(node.tp * ns.pp_size)  # from GPU 0: the simulated server takes no --base-gpu-id
    held = max((held_gb(os.environ, gpu) for gpu in gpus), default=0.0)
    served = any(
        d.model_path == ns.model_path and d.tp_size == node.tp and d.pp_size == ns.pp_size
        for d in live_daemons(os.environ)
    )
    mapped = ns.weight_cache_mode == "client" and served
    if held or mapped:
        node.share_gpu(held, mapped)


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
        options, hardware, model = node_profiles(ns.model_path, os.environ, ns.random_seed)
    except ConfigError as exc:
        print(f"autotune.sim.sglang_server: {exc}", file=sys.stderr)
        return 1
    settings = LaunchSettings.from_args(ns, sglang_environment(ns, os.environ))
    node = NodePerformanceModel(hardware, model, settings, version)
    share_gpu_with_daemon(ns, node)
    # ServerArgs warns before logging is configured, so Python prints these bare; its errors propagate.
    for warning in check_server_args(ns, node.attention_backend):
        log.raw(warning, WARNING)
    return asyncio.run(_serve(ns, node, options, log))


async def _serve(ns: argparse.Namespace, node: NodePerformanceModel, options: SimOptions, log: SimLog) -> int:
    # The server owns asyncio objects, so it is built inside the running loop.
    return await SimulatedServer(ns, node, options, log).run()


if __name__ == "__main__":
    raise SystemExit(main())
