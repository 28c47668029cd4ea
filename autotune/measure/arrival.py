"""A request's place in its run's arrival schedule, as the built-in client tells the server in a header.

The client (`autotune.measure.client`) sends a run's requests at their scheduled times (all at once, at a
request rate, or a trace's; a session's turns follow their answers and carry none), at most `concurrency`
in flight, and says so in `X-Autotune-Arrival`: the run, the request's place in the schedule,
when it is due and when the next one is (server seconds from the run's start), and the concurrency. Real
SGLang ignores the header: 0.5.17's `/generate` reads the body and only the headers it names
(`Authorization` for --api-key, srt/utils/auth.py:176; `traceparent` and `tracestate`; the `x-override-*`
of srt/entrypoints/request_headers.py, and those only with SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES). The
simulated server reads it to admit each request at the model time it is due
(`autotune.sim.server.schedule`), so arrivals closer than a client's few milliseconds at a clock sped up 50
times stay as far apart as scheduled.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ARRIVAL_HEADER", "ScheduledArrival", "schedule"]

ARRIVAL_HEADER = "X-Autotune-Arrival"


@dataclass(frozen=True)
class ScheduledArrival:
    """One request of a run: its `index` in the run's schedule (by arrival time, from 0), when it is due
    (`at_s`) and when the next one is (`next_s`, None for the last), in server seconds from the run's start;
    the client has at most `concurrency` requests in flight (the next one due waits for a slot)."""

    run: str
    index: int
    at_s: float
    next_s: float | None
    concurrency: int

    def header(self) -> dict[str, str]:
        """The header that carries it (floats written so that they read back exactly)."""
        fields = [f"run={self.run}", f"index={self.index}", f"at={self.at_s!r}"]
        if self.next_s is not None:
            fields.append(f"next={self.next_s!r}")
        fields.append(f"concurrency={self.concurrency}")
        return {ARRIVAL_HEADER: "; ".join(fields)}

    @classmethod
    def parse(cls, value: str) -> ScheduledArrival:
        """Read what `header` wrote; ValueError names the header, the value and the expected form."""
        try:
            fields = dict(part.strip().split("=", 1) for part in value.split(";") if part.strip())
            arrival = cls(
                run=fields["run"],
                index=int(fields["index"]),
                at_s=float(fields["at"]),
                next_s=float(fields["next"]) if "next" in fields else None,
                concurrency=int(fields["concurrency"]),
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(
                f"{ARRIVAL_HEADER}: cannot read {value!r} ({type(exc).__name__}: {exc}); expected "
                "'run=ID; index=N; at=SECONDS; next=SECONDS; concurrency=N' (next left out for the last)"
            ) from None
        times = [arrival.at_s] + ([arrival.next_s] if arrival.next_s is not None else [])
        if (
            not arrival.run
            or arrival.index < 0
            or arrival.concurrency < 1
            or not all(math.isfinite(t) and t >= 0 for t in times)
        ):
            raise ValueError(
                f"{ARRIVAL_HEADER}: {value!r} is out of range: run must be set, index >= 0, at and next "
                "finite and >= 0, concurrency >= 1"
            )
        return arrival


def schedule(offsets: Sequence[float], concurrency: int) -> list[ScheduledArrival]:
    """The arrivals of one run whose requests are due at `offsets` (server seconds from its start), in the
    order of `offsets`; a fresh run id, so that the server tells this run from the one before."""
    run = uuid.uuid4().hex
    order = sorted(range(len(offsets)), key=lambda i: offsets[i])
    arrivals: list[ScheduledArrival | None] = [None] * len(offsets)
    for rank, i in enumerate(order):
        after = offsets[order[rank + 1]] if rank + 1 < len(order) else None
        arrivals[i] = ScheduledArrival(run, rank, offsets[i], after, concurrency)
    return [a for a in arrivals if a is not None]
