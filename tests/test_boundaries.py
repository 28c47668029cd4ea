"""What each side of the project loads, checked in a fresh interpreter (this one has loaded everything).

A node actor imports only what runs a trial: no Optuna, no MLflow, and Fabric only for a node reached over
SSH. The configuration layer is pure pydantic: reading a study file loads no sampler and no SSH library.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import autotune

pytestmark = pytest.mark.integration  # each test imports in a fresh interpreter: a process
# Everything a node actor imports to run a trial (the Ray actor is autotune.node.executor.NodeActor).
NODE_SIDE = (
    "autotune.node.executor",
    "autotune.node.pool",
    "autotune.node.check",
    "autotune.node.runner",
    "autotune.node.logwatch",
    "autotune.node.job",
    "autotune.node.lock",
    "autotune.trial.launch",
    "autotune.trial.wire",
    "autotune.trial.failures",
    "autotune.trial.redaction",
    "autotune.node.bench_serving",
    "autotune.measure.client",
    "autotune.measure.load_search",
    "autotune.measure.nccl",
    "autotune.measure.plan",
    "autotune.measure.remote",
    "autotune.measure.stats",
    "autotune.measure.workloads",
    "autotune.config",
    "autotune.dialect",
)
CONFIG = ("autotune.config",)
STUDY_SIDE_ONLY = ("optuna", "fabric", "paramiko", "mlflow", "ray")


def _loaded_after(modules: tuple[str, ...], watched: tuple[str, ...]) -> list[str]:
    """The `watched` top-level packages in sys.modules of a new interpreter after importing `modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps([w for w in {list(watched)!r} if w in sys.modules]))\n"
    )
    here = Path(autotune.__file__).resolve().parents[1]  # `python -c` imports from its working directory
    done = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_the_node_side_loads_neither_optuna_nor_fabric_nor_mlflow() -> None:
    assert _loaded_after(NODE_SIDE, STUDY_SIDE_ONLY) == []


def test_a_node_reached_over_ssh_is_what_loads_fabric() -> None:
    # The check above would pass for an import that failed silently: this one sees Fabric arrive.
    assert _loaded_after(("autotune.node.executor", "autotune.node.ssh"), STUDY_SIDE_ONLY) == [
        "fabric",
        "paramiko",
    ]


@pytest.mark.parametrize("modules", [CONFIG, ("autotune.config.study", "autotune.config.search_space")])
def test_the_configuration_layer_is_pure_pydantic(modules: tuple[str, ...]) -> None:
    assert _loaded_after(modules, STUDY_SIDE_ONLY) == []


def test_the_study_side_does_load_optuna() -> None:
    # The watch list is spelled right: the study loop's modules do bring Optuna in.
    assert _loaded_after(("autotune.study.samplers",), ("optuna",)) == ["optuna"]


def test_scipy_loads_on_first_use_of_the_statistics() -> None:
    # A GPU node's NCCL job and every CLI start would pay half a second for it otherwise.
    assert _loaded_after(NODE_SIDE, ("scipy",)) == []
    code = ("autotune.measure.stats",)
    assert _loaded_after(code, ("scipy",)) == []
