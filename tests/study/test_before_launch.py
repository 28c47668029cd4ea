"""Failures known before a launch: a flag the node's GPU cannot run, a KV pool too small by the baseline's own
memory report. Checked against the simulated node's model (it never refuses a launch that would serve the
longest prompt) and through the study loop on the seed's node (the refused proposals never reach it)."""

from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config import load_search_space, load_study
from autotune.node.check import GPU, NodeReport
from autotune.sim.model_node import server_memory
from autotune.sim.predict import predict
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.before_launch import (
    gpu_cannot_run,
    ignored_on_gpu,
    kv_pool_too_small,
    remember_known_failures,
)
from autotune.study.incompatible import KnownIncompatibilities
from autotune.study.loop import StudyDriver
from autotune.study.storage import open_study
from autotune.trial.failures import Failure, FailureKind
from tests.builders import TRUST_OFF, Said, StudyFiles, launched, model_pool, seed_node

SEED_PROMPT = 28000  # the quickstart objective's prompts, the seed's


def _facts(name: str) -> NodeReport:
    return NodeReport("n0", gpus=tuple(GPU(i, name, 97_887.0, 97_000.0) for i in range(8)))


def test_a_flag_the_nodes_gpu_cannot_run_is_refused_with_sglangs_reason() -> None:
    refused = gpu_cannot_run(
        {"--enable-flashinfer-allreduce-fusion": True}, _facts("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    )
    assert refused is not None
    assert refused.startswith(
        "known incompatible with this node (NVIDIA RTX PRO 6000 Blackwell Server Edition, SM120): "
        "--enable-flashinfer-allreduce-fusion=True: FlashInfer allreduce fusion requires SM90 or SM10X"
    )
    assert gpu_cannot_run({"--enable-flashinfer-allreduce-fusion": True}, _facts("NVIDIA H200")) is None
    # Without nvidia-smi's answer, or for a GPU the table does not know, the launch decides.
    assert gpu_cannot_run({"--enable-flashinfer-allreduce-fusion": True}, None) is None
    assert gpu_cannot_run({"--attention-backend": "fa3"}, _facts("Some Future GPU")) is None


def _baseline(hw: str, model: str, **attrs: object) -> FrozenTrial:
    """The baseline as a study records it: its memory report, from the simulated server's model of it."""
    answer = predict(load_hardware_profile(hw), load_model_profile(model), ["--tp-size", "8"])
    trial = create_trial(
        state=TrialState.COMPLETE,
        value=1.0,
        user_attrs={"baseline": True, "hardware": hw, "server_memory": server_memory(answer.node), **attrs},
    )
    trial.number = 0
    return trial


def _choices(hw: str, model: str) -> dict[str, float]:
    answer = predict(load_hardware_profile(hw), load_model_profile(model), ["--tp-size", "8"])
    return {"--mem-fraction-static": answer.plan.mem_fraction_static}


SEED = ("rtx-pro-6000-pcie-x8", "kimi-k2.5-int4")


def test_the_seeds_small_fractions_are_refused_from_the_baselines_memory_report() -> None:
    baseline, choices = _baseline(*SEED), _choices(*SEED)
    assert choices == {"--mem-fraction-static": 0.845}
    assert baseline.user_attrs["server_memory"] == {
        "weights_gb": 68.38,
        "kv_cache_tokens": 109025.0,
        "kv_cache_gb": 7.66,
    }

    def refused(fraction: float, **params: object) -> str | None:
        found = kv_pool_too_small(
            {"--mem-fraction-static": fraction, **params}, SEED[0], [baseline], choices, SEED_PROMPT
        )
        return found.why if found is not None else None

    # The seed's 0.76 (no KV pool at all on the node) and 0.73 with EAGLE-3 (its draft only takes more).
    why = refused(0.76)
    assert why is not None and why.startswith(
        "predicted OOM: trial 0 (the baseline) held 68.4 GB of weights and a KV pool of 109025 tokens "
        "(7.66 GB) per GPU at --mem-fraction-static 0.845; at 0.76 the pool holds at most "
    )
    assert why.endswith("tokens, not the longest prompt's 28000 tokens (kv_pool_too_small)")
    assert refused(0.73, **{"--speculative-algorithm": "EAGLE3"}) is not None
    # Roomier pools are left to the launch, and so is what the baseline's layout does not tell.
    assert refused(0.80) is None and refused(0.845) is None and refused(0.9) is None
    assert refused(0.74, **{"--tp-size": 4}) is None
    assert refused(0.74, **{"--kv-cache-dtype": "fp8_e4m3"}) is None
    # Another node's baseline, or none: nothing is predicted.
    assert (
        kv_pool_too_small({"--mem-fraction-static": 0.74}, "other", [baseline], choices, SEED_PROMPT) is None
    )
    assert kv_pool_too_small({"--mem-fraction-static": 0.74}, SEED[0], [], choices, SEED_PROMPT) is None
    # A workload whose longest prompt is not known: only a pool with no room for one token is refused.
    assert kv_pool_too_small({"--mem-fraction-static": 0.76}, SEED[0], [baseline], choices, None) is None
    assert kv_pool_too_small({"--mem-fraction-static": 0.72}, SEED[0], [baseline], choices, None) is not None


@pytest.mark.parametrize(
    ("hw", "model", "longest"),
    [
        (*SEED, SEED_PROMPT),
        ("h200-nvlink-x8", "llama-70b-bf16", 2048),
        ("h200-nvlink-x8", "llama-70b-bf16", 120_000),
    ],
)
def test_it_never_refuses_a_launch_whose_pool_holds_the_longest_prompt(
    hw: str, model: str, longest: int
) -> None:
    hardware, profile = load_hardware_profile(hw), load_model_profile(model)
    baseline, choices = _baseline(hw, model), _choices(hw, model)
    rng = random.Random(0)
    refused = wrongly = 0
    for _ in range(300):
        fraction = round(rng.uniform(0.05, 0.95), 2)
        argv = ["--tp-size", "8", "--mem-fraction-static", str(fraction)]
        params: dict[str, object] = {"--mem-fraction-static": fraction}
        for flag, values in (
            ("--max-running-requests", ["8", "64"]),
            ("--cuda-graph-max-bs-decode", ["32", "512"]),
            ("--chunked-prefill-size", ["2048", "16384"]),
        ):
            if rng.random() < 0.5:
                argv += [flag, value := rng.choice(values)]
                params[flag] = int(value)
        if rng.random() < 0.5:
            argv.append("--disable-custom-all-reduce")
        if rng.random() < 0.5 and profile.draft is not None:
            argv += ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
            argv += ["--speculative-eagle-topk", "1"]
        env = {"NCCL_BUFFSIZE": rng.choice(["131072", "16777216"])} if rng.random() < 0.5 else {}
        if kv_pool_too_small(params, hw, [baseline], choices, longest) is None:
            continue
        refused += 1
        if predict(hardware, profile, argv, env).plan.kv_tokens > longest:
            wrongly += 1
    assert wrongly == 0
    assert refused >= 5


def test_the_study_never_launches_what_is_known_to_fail_before_a_launch(study_file: StudyFiles) -> None:
    hw, _ = seed_node()
    space = {
        "parameters": {
            "--enable-flashinfer-allreduce-fusion": {"kind": "sglang", "type": "bool"},
            "--mem-fraction-static": {"kind": "sglang", "type": "categorical", "choices": [0.74, 0.76, 0.85]},
        }
    }
    study = load_study(study_file(n_trials=3, search_space=space, trust=TRUST_OFF))
    optuna_study = open_study(study)
    for params in (  # proposals (not queued by hand: `autotune enqueue` runs what a user asks for)
        {"--enable-flashinfer-allreduce-fusion": True, "--mem-fraction-static": 0.85},
        {"--enable-flashinfer-allreduce-fusion": False, "--mem-fraction-static": 0.74},
        {"--enable-flashinfer-allreduce-fusion": False, "--mem-fraction-static": 0.76},
    ):
        optuna_study.enqueue_trial(params)
    optuna_study = StudyDriver(study, pool=model_pool()).run()
    ran = launched(optuna_study)
    assert ran[0].user_attrs["baseline"] and ran[0].user_attrs["server_memory"]["kv_cache_tokens"] > 0
    assert all(t.params.get("--enable-flashinfer-allreduce-fusion") is not True for t in ran)
    assert all(t.params.get("--mem-fraction-static") in (None, 0.85) for t in ran), "0.74, 0.76: no KV pool"
    assert len(ran) == 3 and all(t.state is TrialState.COMPLETE for t in ran)
    refused = {t.number: t for t in optuna_study.trials if "node" not in t.user_attrs}
    assert [t.user_attrs["failure_kind"] for t in refused.values()] == [
        "known_incompatible",
        "predicted_oom",
        "predicted_oom",
    ]
    fusion, *small = refused.values()
    assert fusion.state is TrialState.FAIL and "requires SM90 or SM10X" in fusion.user_attrs["failure"]
    assert all(
        t.state is TrialState.PRUNED and "(the baseline) held" in t.user_attrs["failure"] for t in small
    )
    # The fusion is known incompatible before any launch, with the node's hardware: the sampler holds it.
    (pair,) = optuna_study.user_attrs["incompatible"]
    assert pair[:2] == ["--enable-flashinfer-allreduce-fusion", True] and hw.gpu_name in pair[2]


def test_without_the_checks_the_same_proposals_are_launched_and_fail(study_file: StudyFiles) -> None:
    space = {
        "parameters": {
            "--enable-flashinfer-allreduce-fusion": {
                "kind": "sglang",
                "type": "categorical",
                "choices": [True],
            },
            "--mem-fraction-static": {"kind": "sglang", "type": "categorical", "choices": [0.76]},
        }
    }
    study = load_study(study_file(n_trials=2, search_space=space, trust=TRUST_OFF))
    optuna_study = StudyDriver(study, pool=model_pool(), preflight=False, remember_incompatible=False).run()
    assert [t.user_attrs.get("failure_kind") for t in launched(optuna_study)] == [None, "kv_pool_too_small"]


def test_a_value_the_gpu_cannot_run_is_checked_once_at_the_start_and_refused_with_sglangs_reason(
    tmp_path: Path,
) -> None:
    """The GPU's abilities are read once, when a run starts: its known incompatibilities hold each value
    with SGLang's reason, and a proposal of one is refused from there, before the KV pool check; a value
    that failed on the hardware is refused after it, in the words it was learned with."""
    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "parameters:\n  --enable-flashinfer-allreduce-fusion: {kind: sglang, type: bool}\n"
        "  --ep-size: {kind: sglang, type: categorical, choices: [null, 8]}\n"
    )
    space = load_search_space(space_file)
    known = KnownIncompatibilities(optuna.create_study(direction="maximize"), space)
    gpu = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    notice = remember_known_failures(known, optuna.create_study(), space, _facts(gpu), "sm120")
    assert notice == f"not proposed on this node's GPU ({gpu}), which SGLang cannot run them on: " + (
        "--enable-flashinfer-allreduce-fusion=True"
    )
    fusion = {"--enable-flashinfer-allreduce-fusion": True}
    pair = known.blocking(fusion, "sm120", before_launch=True)
    assert pair == ("--enable-flashinfer-allreduce-fusion", True, "sm120")
    assert known.why(pair) == gpu_cannot_run(fusion, _facts(gpu))
    assert "FlashInfer allreduce fusion requires SM90 or SM10X" in known.why(pair)
    failure = Failure.of(FailureKind.UNSUPPORTED, "EP 8 is not supported", "unsupported", ("--ep-size",))
    assert known.learn({"--ep-size": 8}, failure, "sm120") == [("--ep-size", 8, "sm120")]
    assert known.blocking({"--ep-size": 8}, "sm120", before_launch=True) is None
    learned = known.blocking({"--ep-size": 8}, "sm120")
    assert learned is not None
    assert known.why(learned) == "known incompatible with this node (sm120): --ep-size=8"


SYMM = "--enable-torch-symm-mem"


def test_a_value_sglang_ignores_on_the_nodes_gpu_is_held_not_refused(tmp_path: Path) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        f"parameters:\n  {SYMM}: {{kind: sglang, type: bool}}\n"
        "  NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring]}\n"
    )
    space = load_search_space(space_file)
    gpu = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    held, said = ignored_on_gpu(space, _facts(gpu))
    assert held == {SYMM: False}
    assert said == f"not proposed on this node's GPU ({gpu}), which SGLang runs without them: {SYMM}=True"
    assert ignored_on_gpu(space, _facts("NVIDIA H200")) == ({}, None)
    assert ignored_on_gpu(space, None) == ({}, None)  # no node check: nothing is held
    # It is no failure: a trial queued with it is not refused (SGLang runs it, without the communicator).
    assert gpu_cannot_run({SYMM: True}, _facts(gpu)) is None


def test_the_study_on_the_seeds_node_never_proposes_torch_symmetric_memory(study_file: StudyFiles) -> None:
    space = {
        "parameters": {
            SYMM: {"kind": "sglang", "type": "bool"},
            "--mem-fraction-static": {"kind": "sglang", "type": "categorical", "choices": [0.84, 0.86, 0.87]},
        }
    }
    study = load_study(study_file(n_trials=8, search_space=space, trust=TRUST_OFF))
    notices = Said()
    # A sampler that would propose it in about half the trials, the held value fixed over it.
    sampler = optuna.samplers.RandomSampler(seed=0)
    optuna_study = StudyDriver(study, pool=model_pool(), sampler=sampler, callbacks=[notices]).run()
    ran = launched(optuna_study)
    assert len(ran) >= 6 and all(t.params.get(SYMM) is not True for t in ran)
    assert any(line.endswith(f"which SGLang runs without them: {SYMM}=True") for line in notices.lines)
