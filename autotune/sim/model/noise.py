"""Run-to-run noise: what makes two launches of one config measure differently on real GPUs.

A launch's draws (for the run, for the lease of the machine, for each step) depend only on its seed and
its lease number, so a seed reproduces a measurement. `SGLANG_SIM_NOISE` switches it (off by default,
`calibrated`, or a relative spread) and `SGLANG_SIM_LEASE` names the lease. The sources and the real runs
they are calibrated on: docs/design.md, "Run-to-run noise".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from autotune.sim.profiles import NoiseProfile

__all__ = ["NO_NOISE", "SimNoise"]

OFF = ("", "0", "off")
CALIBRATED = "calibrated"


@dataclass(frozen=True)
class SimNoise:
    """The spreads a launch draws from (relative standard deviations) and the lease it runs on."""

    run: float = 0.0
    step: float = 0.0
    lease: float = 0.0
    eager_host: float = 0.0
    lease_number: int = 0

    @classmethod
    def calibrated(cls, profile: NoiseProfile, lease_number: int = 0) -> SimNoise:
        return cls(profile.run, profile.step, profile.lease, profile.eager_host, lease_number)

    @classmethod
    def of(cls, noise: SimNoise | float) -> SimNoise:
        """A number is the older setting: that spread per launch, a third of it per step, no lease."""
        if isinstance(noise, SimNoise):
            return noise
        return cls(run=noise, step=noise / 3) if noise else NO_NOISE

    @classmethod
    def parse(cls, text: str, profile: NoiseProfile, lease_number: int = 0) -> SimNoise:
        """`SGLANG_SIM_NOISE`'s value (see the module doc); ValueError for anything else."""
        word = text.strip().lower()
        if word in OFF:
            return NO_NOISE
        if word == CALIBRATED:
            return cls.calibrated(profile, lease_number)
        spread = float(word)  # ValueError for another word
        if not 0 <= spread < 1:
            raise ValueError(f"a spread must be in [0, 1), got {spread}")
        return cls.of(spread)

    @property
    def on(self) -> bool:
        return bool(self.run or self.step or self.lease or self.eager_host)

    def at_lease(self, lease_number: int) -> SimNoise:
        return SimNoise(self.run, self.step, self.lease, self.eager_host, lease_number)

    def lease_factors(self, hardware: str) -> tuple[float, float]:
        """The lease's GPU time factor and its host's eager dispatch factor: the same for every launch on
        that lease of that hardware."""
        if not (self.lease or self.eager_host):
            return 1.0, 1.0
        rng = random.Random(f"{hardware}/lease/{self.lease_number}")
        gpu = max(0.5, rng.gauss(1.0, self.lease))
        # The profile's eager dispatch is the fastest host measured: a lease's host is that or slower.
        return gpu, math.exp(abs(rng.gauss(0.0, self.eager_host)))

    def describe(self) -> dict[str, float]:
        """For /server_info: the spreads and the lease."""
        return {
            "run": self.run,
            "step": self.step,
            "lease": self.lease,
            "eager_host": self.eager_host,
            "lease_number": self.lease_number,
        }


NO_NOISE = SimNoise()
