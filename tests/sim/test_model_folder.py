"""The model the simulated server serves where SGLANG_SIM_MODEL names none: the one its --model-path's
config.json and weights describe (the tests' model folders: real config.json files of known shapes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from autotune.config.init import ModelFacts, model_facts
from autotune.sim.model_folder import profile_from_config, served_model, shipped_profile_for
from autotune.sim.profiles import load_model_profile
from tests.builders import REPO

MODELS = REPO / "tests" / "data" / "models"


def _folder(name: str, index: int | None) -> tuple[ModelFacts, dict[str, Any]]:
    config = json.loads((MODELS / name / "config.json").read_text())
    return model_facts(str(MODELS / name), config, index_total_bytes=index, files_bytes=152), config


def test_a_folder_of_a_shipped_shape_serves_that_profile() -> None:
    facts, config = _folder("llama-3-8b-shape", 14496047104)
    assert shipped_profile_for(facts, config) == load_model_profile("llama-8b-dummy")
    # Another size of the same shape is not that model.
    bigger, _ = _folder("llama-3-8b-shape", 30_000_000_000)
    assert shipped_profile_for(bigger, config) is None


def test_a_folder_of_another_shape_serves_a_profile_built_from_it() -> None:
    facts, config = _folder("mixtral-8x7b-shape", 93405585408)
    assert shipped_profile_for(facts, config) is None
    profile = profile_from_config(facts, config)
    assert (profile.architecture, profile.num_layers, profile.hidden_size) == ("MixtralForCausalLM", 32, 4096)
    assert (profile.num_experts, profile.experts_per_token, profile.weight_gb) == (8, 2, 93.41)
    assert profile.kv_bytes_per_token == 2 * 8 * 128 * 2 * 32 and profile.context_len == 32768
    # Two of eight experts and the dense part read per token: Mixtral's 12.9B active parameters.
    assert profile.active_params_b == pytest.approx(12.9, rel=0.1)


@pytest.mark.integration  # read_model asks the folder through a local runner's processes, as init does
def test_the_server_reads_the_folder_it_is_given() -> None:
    served = served_model(str(MODELS / "llama-3-8b-shape"))
    assert served is not None and served.name == "llama-8b-dummy"
    assert served.served_model_name == str(MODELS / "llama-3-8b-shape")
    assert served_model("/models/Kimi-K2.5") is None  # not on disk: the default profile
