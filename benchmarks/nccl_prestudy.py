"""A staged study's first stage on the simulated node: the NCCL all-reduce objective (`kind:
nccl_allreduce`, autotune.measure.nccl on a real node) over the NCCL knobs of the search space, on the
model's own message sizes, its best settings then carried into the server study's start (a careful
engineer's order: seconds per trial before minutes per trial).

Each trial's value is the model's time for NCCL all-reduces of a decode step's hidden states (bf16, one
token, one per request, and the requests times SGLang's documented 8 draft tokens for a verify pass),
in a CUDA graph and eagerly, summed; it costs `TRIAL_S` of node time, as nccl_bench's start, NCCL's init
and its timed replays
take on a node. The server study's node time counts these seconds too.
"""

from __future__ import annotations

from typing import Any

from model_studies import Profile, search_space_for

from autotune.config import parse_search_space
from autotune.sim.model import NodeModel
from autotune.sim.predict import settings_for
from autotune.sim.profiles import load_hardware_profile, load_model_profile

TRIAL_S = 30.0  # one nccl_bench run: process start, NCCL init, warm-up, the timed replays
DRAFT_TOKENS = 8  # SGLang's documented default --speculative-num-draft-tokens (a verify pass's tokens)


def nccl_prestudy(profile: Profile, concurrency: int) -> tuple[dict[str, Any], float]:
    """The best NCCL settings of one pass of coordinate ascent from NCCL's defaults (each knob's every value,
    the others at the best so far; about 30 trials on the shipped space), and their node seconds."""
    hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    space = parse_search_space(search_space_for(profile), f"the search space for {profile.key}")
    knobs = [name for name, parameter in space.parameters.items() if parameter.kind == "nccl"]
    nccl = {name: space.possible_values(name) or [] for name in knobs}
    sizes = [model.hidden_size * 2 * tokens for tokens in (1, concurrency, concurrency * DRAFT_TOKENS)]
    flags = ["--tp-size", str(profile.tp), "--disable-custom-all-reduce"]  # NCCL's all-reduces alone
    measured: dict[tuple[tuple[str, str], ...], float] = {}

    def allreduce_us(values: dict[str, Any]) -> float:
        env = {name: str(value) for name, value in values.items() if value is not None}
        key = tuple(sorted(env.items()))
        if key not in measured:
            node = NodeModel(hardware, model, settings_for(flags, env))
            # Timed in a CUDA graph and eagerly (nccl_bench's two timings): a server runs some passes eagerly.
            measured[key] = sum(node.allreduce_us(size, graph) for size in sizes for graph in (True, False))
        return measured[key]

    best: dict[str, Any] = {name: None for name in nccl}  # NCCL's own settings first
    for name, values in nccl.items():
        best[name] = min(values, key=lambda value: allreduce_us({**best, name: value}))
    return best, len(measured) * TRIAL_S
