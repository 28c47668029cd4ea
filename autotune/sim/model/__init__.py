"""What a launch of SGLang would do on a profiled node: memory plan, startup failure, step times.

Everything here is a pure function of (hardware profile, model profile, launch settings): the simulated
server prints and serves what this package says, and tests and benchmarks ask it directly. Times are in
model seconds (the server scales them); memory is in GB (1e9 bytes) per GPU.

One module per concern: `settings` (what the model reads from flags and environment), `memory` (the
start-up memory plan and SGLang's automatic defaults), `nccl` (NCCL's transport, protocol and cost),
`failures` (start-up failures and out-of-memory under load, with SGLang's lines), `timing` (start-up
phases and step times), and `node` (`NodePerformanceModel`, the one answer per launch that puts them
together).
"""

from autotune.sim.model.failures import StartupFailure
from autotune.sim.model.memory import MemoryPlan, captured_batch_sizes, prefill_graph_token_sizes
from autotune.sim.model.nccl import NcclModel
from autotune.sim.model.node import NodePerformanceModel
from autotune.sim.model.settings import GB, MIB, LaunchSettings, NcclSettings, SpecSettings, accept_length

__all__ = [
    "GB",
    "MIB",
    "LaunchSettings",
    "MemoryPlan",
    "NcclModel",
    "NcclSettings",
    "NodePerformanceModel",
    "SpecSettings",
    "StartupFailure",
    "accept_length",
    "captured_batch_sizes",
    "prefill_graph_token_sizes",
]
