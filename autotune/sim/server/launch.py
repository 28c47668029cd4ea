"""What every part of one simulated launch works from: its command line, node model, options, resolved
server arguments, log and scheduler ranks."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.sim.logfmt import SimLog
from autotune.sim.model import NodeModel
from autotune.sim.server.options import SimOptions
from autotune.sim.server.ranks import SchedulerRanks


class LaunchPart:
    """A part of one launch (start-up, serving, the HTTP API), holding the launch's shared inputs."""

    def __init__(
        self,
        ns: argparse.Namespace,
        node: NodeModel,
        options: SimOptions,
        args: dict[str, Any],
        log: SimLog,
        ranks: SchedulerRanks,
    ) -> None:
        self.ns = ns
        self.node = node
        self.plan = node.plan
        self.options = options
        self.args = args
        self.log = log
        self.ranks = ranks
