"""What every part of one simulated launch works from: its command line, node model, options, resolved
server arguments, log and scheduler ranks."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from autotune.sim.logfmt import SimLog
from autotune.sim.model import NodePerformanceModel
from autotune.sim.server.options import SimOptions
from autotune.sim.server.ranks import SchedulerRanks


@dataclass(frozen=True)
class Launch:
    """The inputs of one launch, shared by its start-up, serving and HTTP API."""

    ns: argparse.Namespace
    node: NodePerformanceModel
    options: SimOptions
    args: dict[str, Any]
    log: SimLog
    ranks: SchedulerRanks


class LaunchPart:
    """A part of one launch (start-up, serving, the HTTP API), with the launch's inputs as attributes."""

    def __init__(self, launch: Launch) -> None:
        self.ns = launch.ns
        self.node = launch.node
        self.plan = launch.node.plan
        self.options = launch.options
        self.args = launch.args
        self.log = launch.log
        self.ranks = launch.ranks
