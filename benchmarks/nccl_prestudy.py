"""A staged study's first stage on the simulated node: the NCCL all-reduce objective (`kind:
nccl_allreduce`, autotune.measure.nccl on a real node) over the NCCL knobs of the search space, on the
messages the server will all-reduce, its best settings then held in the server study (a careful engineer's
order: seconds per trial before minutes per trial; `staged` in autotune.study.samplers.tpe).

The messages and their weights (an all-reduce objective's `messages: {size: weight}`) follow the model and
the workload, per request served as SGLang serves it by default: a decode step's hidden states (bf16,
one token for each of the `concurrency` requests in flight, in a CUDA graph) per output token, shared by
the requests of the step; and the prompt's prefill chunks (the server's own --chunked-prefill-size,
eagerly). Speculative decoding, which the server study may turn on, would replace decode steps by fewer
verify passes of more tokens; the stage does not guess how many. Each trial
costs `TRIAL_S` of node time, as nccl_bench's start, NCCL's init and its timed replays take on a node; the
server study's node time counts these seconds too.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from model_studies import Profile, search_space_for

from autotune.config import parse_search_space
from autotune.sim.model import NodeModel
from autotune.sim.predict import settings_for
from autotune.sim.profiles import load_hardware_profile, load_model_profile

TRIAL_S = 30.0  # one nccl_bench run: process start, NCCL init, warm-up, the timed replays
Message = tuple[int, bool]  # bytes, timed in a CUDA graph


def messages(profile: Profile, chunk: int) -> dict[Message, float]:
    """The all-reduces one request of the profile's workload costs a server decoding as SGLang does by
    default, and how many of each: a decode step's (its requests' tokens, in a CUDA graph) per output token,
    and the prompt's prefill chunks (eagerly). Each forward pass all-reduces as often per layer, so the
    layers do not change the weights."""
    workload = yaml.safe_load(profile.objective.read_text())["workload"]
    model = load_model_profile(profile.model)
    requests, prompt, output = (int(workload[k]) for k in ("concurrency", "input_len", "output_len"))
    token = model.hidden_size * 2  # bf16 hidden states
    weights: dict[Message, float] = {(token * requests, True): output / requests}  # a step serves them all
    full, rest = divmod(prompt, chunk)
    weights[(token * chunk, False)] = full
    if rest:
        weights[(token * rest, False)] = 1
    return weights


def nccl_prestudy(profile: Profile) -> tuple[dict[str, Any], float]:
    """The best NCCL settings of one pass of coordinate ascent from NCCL's defaults (each knob's every value,
    the others at the best so far; about 30 trials on the shipped space), and their node seconds."""
    hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    space = parse_search_space(search_space_for(profile), f"the search space for {profile.key}")
    knobs = [name for name, parameter in space.parameters.items() if parameter.kind == "nccl"]
    nccl = {name: space.possible_values(name) or [] for name in knobs}
    flags = ["--tp-size", str(profile.tp), "--disable-custom-all-reduce"]  # NCCL's all-reduces alone
    chunk = NodeModel(hardware, model, settings_for(flags, {})).plan.chunked_prefill_size  # the server's own
    weights = messages(profile, chunk)
    measured: dict[tuple[tuple[str, str], ...], float] = {}

    def allreduce_us(values: dict[str, Any]) -> float:
        env = {name: str(value) for name, value in values.items() if value is not None}
        key = tuple(sorted(env.items()))
        if key not in measured:
            node = NodeModel(hardware, model, settings_for(flags, env))
            times = (weight * node.allreduce_us(size, graph) for (size, graph), weight in weights.items())
            measured[key] = math.fsum(times)
        return measured[key]

    best: dict[str, Any] = {name: None for name in nccl}  # NCCL's own settings first
    for name, values in nccl.items():
        best[name] = min(values, key=lambda value: allreduce_us({**best, name: value}))
    return best, len(measured) * TRIAL_S
