"""NCCL inside one node: the transport, channels, protocol and memory NCCL picks under its `NCCL_*`
environment, and the time of one all-reduce over them.

Only NCCL lives here; whether SGLang sends an all-reduce to NCCL at all (custom all-reduce first) is
`timing.allreduce_us`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.sim.model.settings import GB, MIB, NcclSettings
from autotune.sim.profiles import P2P_LEVELS, HardwareProfile, LinkProfile

LL_MAX_BYTES = 64 * 1024  # NCCL's tuner picks LL below this on one node, LL128 (NVLink) or Simple above
LL128_MAX_BYTES = 8 * MIB
CHANNEL_BYTES = 256 * 1024  # NCCL spreads a message over more channels only once it is this large
LINK_SATURATING_CHANNELS = 2
NCCL_BASE_GB = 0.25  # communicator, proxy and work FIFOs, whatever the channels
SHM_GPU_MIB_PER_CONNECTION = 0.5  # shared-memory buffers live in host memory; only flags stay on the GPU
LL_MIB, LL128_MIB = 0.25, 4.6


@dataclass(frozen=True)
class NcclModel:
    """NCCL's choices and costs for the tensor-parallel group of `tp` GPUs under `settings`."""

    settings: NcclSettings
    hw: HardwareProfile
    tp: int

    def link(self) -> tuple[str, LinkProfile]:
        """The transport NCCL uses between the node's GPUs under these settings."""
        nccl, hw = self.settings, self.hw
        level = nccl.p2p_level or "PXB"  # by default NCCL does not use P2P across host bridges
        if not nccl.p2p_disable and P2P_LEVELS.index(level) >= P2P_LEVELS.index(hw.gpu_path):
            return "p2p", hw.p2p
        if not nccl.shm_disable:
            return "shm", hw.shm
        return "socket", hw.socket

    def channels(self) -> int:
        nccl = self.settings
        channels = self.hw.nccl_default_channels
        if nccl.max_channels:
            channels = min(channels, nccl.max_channels)
        if nccl.min_channels:
            channels = max(channels, nccl.min_channels)
        return max(1, min(64, channels))  # NCCL clamps silently

    def memory_gb(self) -> float:
        nccl = self.settings
        transport, _ = self.link()
        connections = 2 if nccl.algo else 4  # ring send/recv, plus tree up/down unless one is forced
        if transport != "p2p":
            per_connection_mib = SHM_GPU_MIB_PER_CONNECTION
        else:
            ll128 = self.hw.interconnect == "nvlink" or nccl.proto == "LL128"
            per_connection_mib = nccl.buffsize / MIB + LL_MIB + (LL128_MIB if ll128 else 0.0)
        return NCCL_BASE_GB + self.channels() * connections * per_connection_mib * MIB / GB

    def protocol(self, nbytes: float) -> tuple[str, str]:
        """NCCL's (algorithm, protocol) for one all-reduce: forced by the env, else NCCL's size thresholds."""
        nccl = self.settings
        if nccl.proto:
            proto = nccl.proto
        elif nbytes <= LL_MAX_BYTES:
            proto = "LL"
        elif self.hw.interconnect == "nvlink" and nbytes <= LL128_MAX_BYTES:
            proto = "LL128"  # NCCL only enables LL128 over NVLink
        else:
            proto = "Simple"
        return nccl.algo or "Ring", proto  # within one node NCCL's tuner keeps to rings

    def allreduce_us(self, nbytes: float) -> float:
        """One NCCL all-reduce of `nbytes` on all TP ranks over the transport these settings give."""
        n = self.tp
        _, link = self.link()
        algo, proto = self.protocol(nbytes)
        hops = 2 * (n - 1) if algo == "Ring" else 2 * math.ceil(math.log2(n))
        moved = 2 * (n - 1) / n * nbytes if algo == "Ring" else 2 * nbytes
        if proto == "LL":
            hop_us, bw_share = link.ll_hop_us, 0.5  # LL sends a flag with every 4 bytes of data
        elif proto == "LL128" and self.hw.interconnect == "nvlink":
            hop_us, bw_share = link.ll_hop_us * 1.3, 0.92
        elif proto == "LL128":
            hop_us, bw_share = link.simple_hop_us * 1.3, 0.92  # forced off NVLink: no fast path
        else:
            hop_us, bw_share = link.simple_hop_us, 1.0
        if algo == "Tree":
            bw_share *= 0.5  # a tree's links carry the data up and down
        channels = self.channels()
        used = max(1, min(channels, math.ceil(nbytes / CHANNEL_BYTES)))
        bandwidth = link.bandwidth_gbps * 1e3 * bw_share * min(used, LINK_SATURATING_CHANNELS)
        bandwidth /= LINK_SATURATING_CHANNELS  # bytes per us
        sync_us = hops * 0.1 * (used - 1) + 0.05 * channels  # every channel is polled on every op
        refills = 0.0
        if proto == "Simple":  # Simple moves data in buffsize/8 slices; each extra slice is a hop's wait
            refills = max(0.0, moved / used / (self.settings.buffsize / 8) - 1) * hop_us * 0.25
        return hops * hop_us + moved / bandwidth + sync_us + refills
