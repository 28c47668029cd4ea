"""The scheduler processes of one simulated launch: their log prefixes, and how one of them dies."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import NoReturn

from autotune.sim.logfmt import INFO, WARNING, SimLog, rank_prefix


class SchedulerRanks:
    """Every scheduler rank's log prefix, logging on all of them or one, and a rank's fatal exit."""

    def __init__(self, ns: argparse.Namespace, log: SimLog, faults: frozenset[str]) -> None:
        self.ns = ns
        self.log = log
        self.faults = faults
        self.prefixes = self._rank_prefixes()

    def _rank_prefixes(self) -> list[tuple[int, str]]:
        """(tp_rank, log prefix) of every scheduler process, in rank order."""
        ns = self.ns
        tp, dp = ns.tp_size, ns.dp_size
        ep = tp if ns.moe_a2a_backend in ("deepep", "mooncake") else ns.ep_size
        if ns.enable_dp_attention:
            # DP attention splits the TP group: scheduler rank r serves attention DP rank r // (tp / dp).
            return [(r, rank_prefix(r, tp, r // max(tp // dp, 1), dp, ep)) for r in range(tp)]
        return [(r, rank_prefix(r, tp, d, dp, ep)) for d in range(dp) for r in range(tp)]

    @property
    def first(self) -> str:
        """The log prefix of rank 0, which logs what only one scheduler reports."""
        return self.prefixes[0][1]

    def all(self, message: str, warning: bool = False) -> None:
        for _, prefix in self.prefixes:
            self.log.log(message, prefix, WARNING if warning else INFO)

    def rank0(self, message: str) -> None:
        self.log.info(message, self.first)

    def prefix_of(self, tp_rank: int) -> str:
        for rank, prefix in self.prefixes:
            if rank == tp_rank:
                return prefix
        return self.first

    def error(self, tp_rank: int, message: str) -> None:
        """One error record of one rank (its first line carries the date and rank)."""
        self.log.error(message, self.prefix_of(tp_rank))

    def die(self, tp_rank: int, lines: list[str]) -> NoReturn:
        """A scheduler raised: log its traceback, the launcher's reaction, and kill this process tree."""
        traceback = (
            lines
            if lines and lines[0].startswith("Traceback")
            else ["Traceback (most recent call last):", *lines]
        )
        # One logging record: only its first line carries the date and rank; it ends with a newline.
        self.error(tp_rank, "\n".join([f"Scheduler hit an exception: {traceback[0]}", *traceback[1:], ""]))
        self.log.error("Received sigquit from a child process. It usually means the child failed.")
        self.linger_if_asked()
        os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(-9)  # unreachable: SIGKILL cannot be caught

    def linger_if_asked(self) -> None:
        """`linger`: stay alive without answering (the event loop blocks) until SIGTERM ends the process."""
        if "linger" in self.faults:
            sys.stderr.flush()
            while True:
                time.sleep(3600)
