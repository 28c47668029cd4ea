"""Requests that say when the client scheduled them (`autotune.measure.arrival`), admitted at that model time.

A client sends such a request at its time on the wall clock; at a clock sped up 50 times its few
milliseconds late are whole steps, and a burst held for replies would swallow arrivals closer than the hold.
So the server reads the schedule instead: the run's first request fixes where its start lies on the model
clock, each request is due at the start plus its offset (or, when the client had no slot free then, when
one freed: at most `concurrency` in flight), and the engine runs no step that starts at or after the time
the next request is due before that request has come, while the client has a slot free for it (counting
what was in flight by the schedule, not by what came: a request due later can overtake one due sooner on
its way). The same run is then served in the same batches at the same model times on every run, however
late a busy machine delivers its requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from autotune.measure.arrival import ScheduledArrival

T = TypeVar("T")


@dataclass(order=True)
class Due(Generic[T]):
    """A request of a run that has come, and the model time from which the engine may admit it."""

    at: float
    index: int
    item: T = field(compare=False)


@dataclass
class _Run(Generic[T]):
    run: str
    concurrency: int
    start: float | None = None  # the model time of the run's start (its offset 0), from its first request
    following: dict[int, float | None] = field(default_factory=dict)  # index -> when the next one is due
    missing: int = 0  # the lowest index that has not come
    early: list[tuple[ScheduledArrival, T | None]] = field(default_factory=list)  # came before index 0
    sent: dict[int, float] = field(default_factory=dict)  # come and not finished: index -> when it was sent
    freed_at: float = -math.inf  # when a slot last freed while all were taken (model time)
    over: bool = False  # its client went away: what still comes is admitted as it comes

    def in_flight(self, at: float) -> int:
        """The client's requests in flight at model time `at`: sent by then and not finished. One that came
        early on the wall clock (a request due later can overtake one due sooner on its way) is not yet."""
        return sum(sent <= at for sent in self.sent.values())


class ArrivalSchedule(Generic[T]):
    """The current run of scheduled requests (a request of a new run ends the one before). `on_clock` puts
    a time in seconds on the model clock's grid."""

    def __init__(self, on_clock: Callable[[float], float]) -> None:
        self._on_clock = on_clock
        self._run: _Run[T] | None = None

    def starts_run(self, arrival: ScheduledArrival) -> bool:
        """Whether `arrival` is the first of its run: its coming fixes where the run starts."""
        run = self._run
        return arrival.index == 0 and (run is None or run.run != arrival.run or run.start is None)

    def came(self, arrival: ScheduledArrival, now: float, item: T | None) -> list[Due[T]]:
        """`arrival` came when the engine's clock read `now`; `item` None: it was refused (it is not in
        flight). Returns the requests the engine may now admit, each from its due time: this one, and those of
        its run that came before the run's first."""
        run = self._run
        if run is None or run.run != arrival.run:
            run = self._run = _Run(arrival.run, arrival.concurrency)
        if run.over:
            return [Due(now, arrival.index, item)] if item is not None else []
        run.following[arrival.index] = arrival.next_s
        while run.missing in run.following:
            run.missing += 1
        if run.start is None:
            if arrival.index != 0:
                run.early.append((arrival, item))
                return []
            run.start = now - self._on_clock(arrival.at_s)
        came, run.early = [(arrival, item), *run.early], []
        due = []
        for one, what in came:
            if what is None:
                continue
            # Due at its time, or later when the client waited for a slot that freed later.
            sent = run.sent[one.index] = max(run.start + self._on_clock(one.at_s), run.freed_at)
            due.append(Due(sent, one.index, what))
        return due

    def ended(self, arrival: ScheduledArrival, now: float) -> None:
        """A request of `arrival`'s run finished (or was aborted) at model time `now`: its slot is free."""
        run = self._run
        if run is None or run.run != arrival.run or run.start is None:
            return
        if run.in_flight(now) >= run.concurrency:
            run.freed_at = now
        run.sent.pop(arrival.index, None)

    def waits(self, step_at: float) -> bool:
        """Whether a step starting at model time `step_at` must wait for a request that has not come: the
        next one due is due by then, and the client has a slot free to send it."""
        run = self._run
        if run is None or run.over or run.start is None or run.missing == 0:
            return False
        following = run.following[run.missing - 1]
        if following is None:
            return False  # the run's last request has come
        due = run.start + self._on_clock(following)
        return due <= step_at and run.in_flight(step_at) < run.concurrency

    def give_up(self) -> None:
        """The request waited for did not come (its client went away): the run's schedule is over."""
        if self._run is not None:
            self._run.over = True
