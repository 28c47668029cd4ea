"""The configuration layer: study files, search spaces and objectives, validated into ready objects."""

from __future__ import annotations

from autotune.config._yaml import config_error_from_validation, load_yaml, load_yaml_text
from autotune.config.objective import METRICS, Objective, Workload, load_objective, parse_objective
from autotune.config.search_space import (
    SearchSpace,
    SearchSpaceFile,
    SpeculativeRules,
    load_search_space,
    parse_search_space,
)
from autotune.config.study import (
    DEFAULT_NEVER_LAUNCH_ENV,
    DEFAULT_NEVER_LAUNCH_FLAGS,
    SAMPLER_NAMES,
    Budget,
    NeverLaunch,
    NodeSpec,
    SamplerSpec,
    ServerSpec,
    Study,
    StudyFile,
    Timeouts,
    load_study,
)

__all__ = [
    "DEFAULT_NEVER_LAUNCH_ENV",
    "DEFAULT_NEVER_LAUNCH_FLAGS",
    "METRICS",
    "SAMPLER_NAMES",
    "Budget",
    "NeverLaunch",
    "NodeSpec",
    "Objective",
    "SamplerSpec",
    "SearchSpace",
    "SearchSpaceFile",
    "ServerSpec",
    "SpeculativeRules",
    "Study",
    "StudyFile",
    "Timeouts",
    "Workload",
    "config_error_from_validation",
    "load_objective",
    "load_search_space",
    "load_study",
    "load_yaml",
    "load_yaml_text",
    "parse_objective",
    "parse_search_space",
]
