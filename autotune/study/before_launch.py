"""Failures known before a launch, without having met them: a flag value the node's GPU architecture cannot
run (autotune.dialect.gpu_support), recorded with the study's known incompatibilities when a run starts
(`remember_known_failures`), and a KV pool too small for the workload's longest prompt, from the
baseline's own memory report. A proposal either rule refuses is recorded without a launch, as a known
incompatibility or a predicted OOM; what neither is certain of is left to the launch. Why the KV pool's
bound is certain: docs/design.md, "The KV pool known before a launch".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import SearchSpace, Study
from autotune.dialect.gpu_support import Capability, cannot_run, compute_capability, ignored
from autotune.node.check import NodeReport
from autotune.study.incompatible import KnownIncompatibilities
from autotune.study.records import StudyRecord, TrialRecord
from autotune.study.warm_start import known_failures
from autotune.trial.memory_fraction import config_fraction, running_fraction

# Memory other settings may free before SGLang sizes the pool, as a share of the static pool's memory (the
# simulated node's NCCL buffers and custom all-reduce workspace take 0.3-0.4 GB of 96 GB; 2% is 1.9 GB).
SLACK_SHARE = 0.02
# Settings that change the weights or the KV bytes per token: a launch setting one is not the baseline's.
LAYOUT_FLAGS = frozenset(
    {
        "--tp-size", "--tensor-parallel-size", "--tp", "--dp-size", "--data-parallel-size", "--dp",
        "--pp-size", "--pipeline-parallel-size", "--kv-cache-dtype", "--quantization", "--model-path",
        "--context-length",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """Why a proposal is not launched: `oom` for a predicted out-of-memory (pruned with the penalty),
    else a known incompatibility (failed)."""

    why: str
    oom: bool


def kv_pool_before_launch(
    study: Study, optuna_study: optuna.Study, trial: optuna.Trial | FrozenTrial, trials: Sequence[FrozenTrial]
) -> Refusal | None:
    """Why `trial`'s proposal certainly leaves a KV pool too small, from the baselines among the study's
    `trials` (as the gates read them once a proposal), or None. A trial asked for on purpose (the baseline,
    a config queued by hand, a confirmation round: `TrialRecord.deliberate`) runs as asked."""
    if TrialRecord.of(trial).deliberate:
        return None
    return kv_pool_too_small(
        trial.params,
        TrialRecord.of(trial).hardware,
        [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)],
        StudyRecord.of(optuna_study).server_choices,
        longest_prompt(study),
    )


def _gpu(facts: NodeReport | None) -> tuple[str, Capability] | None:
    """The node's GPU as its node check named it, and its compute capability; None where either is unknown."""
    if facts is None or not facts.gpus:
        return None
    name = facts.gpus[0].name
    capability = compute_capability(name)
    return None if capability is None else (name, capability)


def gpu_cannot_run(params: Mapping[str, object], facts: NodeReport | None) -> str | None:
    """Why a flag value among `params` cannot run on the node's GPU architecture (gpu_support.REQUIREMENTS),
    in the words a refused proposal is recorded with, or None."""
    gpu = _gpu(facts)
    if gpu is None:
        return None
    name, capability = gpu
    found = cannot_run(params, capability)
    if found is None:
        return None
    flag, value, requirement = found
    return (
        f"known incompatible with this node ({name}, SM{capability[0]}{capability[1]}): {flag}={value}: "
        f"{requirement.needs} (SGLang {requirement.source})"
    )


def gpu_cannot_run_values(space: SearchSpace, facts: NodeReport | None) -> dict[tuple[str, object], str]:
    """The (parameter, value) pairs of `space` the node's GPU architecture cannot run, each with why."""
    found = {
        (name, value): gpu_cannot_run({name: value}, facts)
        for name in space.spec.parameters
        for value in space.possible_values(name) or ()
    }
    return {pair: why for pair, why in found.items() if why is not None}


def ignored_on_gpu(space: SearchSpace, facts: NodeReport | None) -> tuple[dict[str, object], str | None]:
    """The parameters of `space` with a value SGLang ignores on the node's GPU (gpu_support.IGNORED: it warns
    and runs without it), each held at the one value left, and what to tell the user; a trial of such a
    value would measure the config without it again."""
    gpu = _gpu(facts)
    if gpu is None:
        return {}, None
    gpu_name, capability = gpu
    held, said = {}, []
    for name in space.spec.parameters:
        values = space.possible_values(name) or []
        kept = [value for value in values if ignored({name: value}, capability) is None]
        if len(kept) == 1 and len(values) > 1:
            held[name] = kept[0]
            said += [f"{name}={value}" for value in values if value not in kept]
    if not held:
        return {}, None
    listed = ", ".join(said)
    return held, f"not proposed on this node's GPU ({gpu_name}), which SGLang runs without them: {listed}"


def remember_known_failures(
    known: KnownIncompatibilities,
    optuna_study: optuna.Study,
    space: SearchSpace,
    facts: NodeReport | None,
    hardware: str | None,
) -> str | None:
    """Record with `known`, before any launch, the values of `space` the node's GPU cannot run (with SGLang's
    reason: the gates refuse a proposal of one with it) and those the earlier study this one started from
    (`--from`) could not run on the same GPUs (the sampler then holds a parameter left with one value, as
    after a failure); what to tell the user, when something is new. The one check of a GPU's abilities."""
    reasons = gpu_cannot_run_values(space, facts)
    unrunnable = known.add(reasons, hardware, reasons)
    earlier = known.add(
        [(name, value) for name, value in known_failures(optuna_study, hardware) if name in space], hardware
    )
    lines = []
    if unrunnable and facts is not None and facts.gpus:
        values = ", ".join(f"{name}={value}" for name, value, _ in unrunnable)
        gpu = facts.gpus[0].name
        lines.append(f"not proposed on this node's GPU ({gpu}), which SGLang cannot run them on: {values}")
    if earlier:
        values = ", ".join(f"{name}={value}" for name, value, _ in earlier)
        lines.append(
            f"not proposed: the earlier study failed them on these GPUs: {values} (start without --from to "
            "try them on this SGLang)"
        )
    return "\n".join(lines) or None


def longest_prompt(study: Study) -> int | None:
    """The longest prompt the objective's workload sends, in tokens, when the study file says it (random
    prompts of at most `input_len`); None for prompts from a file or shared prefixes."""
    workload = study.objective.workload
    if workload is None or workload.prompts is not None or workload.sharing is not None:
        return None
    return workload.input_len


def kv_pool_too_small(
    params: Mapping[str, object],
    hardware: object,
    trials: list[FrozenTrial],
    server_choices: Mapping[str, float],
    longest: int | None,
) -> Refusal | None:
    """Why a proposal with `params` on `hardware` certainly leaves SGLang a KV pool with no room for the
    longest prompt (`longest` tokens; None: for one token), from the memory report of a baseline among
    `trials` on that hardware (its fraction: its own value, else `server_choices`, SGLang's), or None."""
    fraction = config_fraction(params)
    if fraction is None or any(params.get(flag) is not None for flag in LAYOUT_FLAGS):
        return None
    for baseline in trials:
        record = TrialRecord.of(baseline)
        memory = record.server_memory
        weights, kv_gb, kv_tokens = (memory.get(k) for k in ("weights_gb", "kv_cache_gb", "kv_cache_tokens"))
        m0 = running_fraction(baseline.params, server_choices)
        if (
            not record.baseline
            or record.hardware != hardware
            or not weights
            or not kv_gb
            or not kv_tokens
            or not m0
            or fraction >= m0
        ):
            continue
        per_token_gb = kv_gb / kv_tokens
        available = (weights + kv_gb) / m0  # at least the memory the static pool is a share of
        most = kv_gb - (m0 - fraction) * available + SLACK_SHARE * available
        needed = (longest or 0) + 1
        if most >= needed * per_token_gb:
            return None
        room = max(int(most / per_token_gb), 0)
        prompt = f"the longest prompt's {longest} tokens" if longest else "one token"
        return Refusal(
            f"predicted OOM: trial {baseline.number} (the baseline) held {weights:.1f} GB of weights and a "
            f"KV pool of {int(kv_tokens)} tokens ({kv_gb:.2f} GB) per GPU at --mem-fraction-static {m0:g}; "
            f"at {fraction:g} the pool holds at most {room} tokens, not {prompt} (kv_pool_too_small)",
            oom=True,
        )
    return None
