"""What a node has, for `autotune init`: its GPUs and their links, its SGLang, and the model's files there.

Asked through the node's command runner with the node check's own queries (`autotune.node.check`), so the
same code reads a local node, one reached over SSH and the simulated node; the study loop never sees it.
Everything missing (no GPU, no SGLang, no config.json) is reported at once, each with what to do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config.init import InitError, ModelFacts, NodeFacts, model_facts
from autotune.node.check import (
    _GPUS,
    _TOPOLOGY,
    _WEIGHT_BYTES,
    _command_problems,
    _sh,
    gpu_problems,
    parse_gpus,
    server_flags,
    slowest_link,
    visible_gpus,
)
from autotune.node.runner import CommandRunner, NodeUnreachableError

__all__ = ["inspect_node", "read_model", "slowest_link"]

_CONFIG = 'cat "$1/config.json"'
# The first *.safetensors.index.json of the folder (exit 3 without one).
_INDEX = 'for f in "$1"/*.safetensors.index.json; do [ -f "$f" ] && exec cat "$f"; done; exit 3'


def read_model(runner: CommandRunner, path: str, what: str = "model") -> tuple[ModelFacts | None, str | None]:
    """The model folder `path` on the node as its config.json and weights describe it, or why it cannot be
    read (no config.json, or not JSON)."""
    done = _sh(runner, _CONFIG, [path])
    if done.returncode != 0:
        return None, (
            f"no config.json in the {what} folder {path} on the node. Point --{what} at the folder that "
            "holds config.json and the *.safetensors files (a Hugging Face model: download it first, e.g. "
            "`huggingface-cli download ID --local-dir DIR`)"
        )
    try:
        config = json.loads(done.stdout)
    except ValueError as exc:
        return None, f"{path}/config.json on the node is not JSON ({exc}). Fix or replace the file"
    if not isinstance(config, dict):
        return None, f"{path}/config.json on the node is not a JSON object. Fix or replace the file"
    found = _sh(runner, _WEIGHT_BYTES, [path]).stdout.strip()
    return model_facts(
        path,
        config,
        index_total_bytes=_index_total(runner, path),
        files_bytes=int(found) if found.isdigit() else None,
    ), None


def _index_total(runner: CommandRunner, path: str) -> int | None:
    done = _sh(runner, _INDEX, [path])
    if done.returncode != 0:
        return None
    try:
        metadata: Any = json.loads(done.stdout).get("metadata") or {}
    except (ValueError, AttributeError):
        return None
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    return int(total) if isinstance(total, int | float) and total > 0 else None


def inspect_node(
    runner: CommandRunner,
    *,
    name: str,
    address: str,
    command: Sequence[str],
    env: Mapping[str, str],
    nvidia_smi: Sequence[str],
    model_path: str,
    draft_path: str | None = None,
) -> tuple[NodeFacts, ModelFacts, ModelFacts | None]:
    """The node's GPUs, links and SGLang (run by `command` with `env`), and the model (and draft) folders
    there. Raises `InitError` naming everything missing, each with what to do."""
    missing: list[str] = []
    warnings: list[str] = []
    try:
        command_trouble, version = _command_problems(runner, command, env)
        missing += [str(problem) for problem in command_trouble]
        if command_trouble:
            missing.append(
                "autotune init takes the server command as --server-command and the node's environment as "
                "--env KEY=VALUE (e.g. --env PYTHONPATH=DIR where SGLang is installed outside the "
                "Python's own path)"
            )
        flags = server_flags(runner, command, env, version) if not command_trouble else None
        done = _sh(runner, _GPUS, nvidia_smi, env=env)
        gpus = (
            visible_gpus(parse_gpus(done.stdout), env.get("CUDA_VISIBLE_DEVICES"))
            if done.returncode == 0
            else []
        )
        if done.returncode == 3:
            missing.append(
                f"no {nvidia_smi[0]} on the node, so no NVIDIA GPU to tune. Install the NVIDIA driver there; "
                "without a GPU, try the simulated node: "
                "--server-command 'python -m autotune.sim.sglang_server' "
                "--env SGLANG_SIM_HARDWARE=h200-x1"
            )
        elif done.returncode != 0:
            text = (done.stderr or done.stdout).strip().splitlines()
            missing.append(
                f"{' '.join(nvidia_smi)} failed on the node "
                f"({text[-1][:200] if text else f'status {done.returncode}'})."
                " Check the NVIDIA driver there (run nvidia-smi by hand)"
            )
        elif not gpus:
            missing.append(
                "nvidia-smi lists no GPU the server would see on the node. Check the driver, and "
                "CUDA_VISIBLE_DEVICES if you pass it with --env"
            )
        else:
            warnings += [str(problem) for problem in gpu_problems(gpus)]
        links = None
        if len(gpus) > 1:
            topology = _sh(runner, _TOPOLOGY, nvidia_smi, env=env)
            links = (
                slowest_link(topology.stdout, [g.index for g in gpus]) if topology.returncode == 0 else None
            )
            if links is None:
                warnings.append("`nvidia-smi topo -m` did not say how the GPUs are linked: taken as PCIe")
        model, trouble = read_model(runner, model_path)
        missing += [trouble] if trouble else []
        draft = None
        if draft_path is not None:
            draft, trouble = read_model(runner, draft_path, "draft")
            missing += [trouble] if trouble else []
    except NodeUnreachableError as exc:
        raise InitError(f"cannot reach the node {name}: {exc.reason}. {exc.fix}") from None
    except TimeoutError as exc:
        raise InitError(f"the node {name} did not answer: {exc}. Check its load and network.") from None
    if missing or model is None:
        raise InitError(
            f"cannot write a study for {name}:\n" + "\n".join(f"  - {text.rstrip('.')}." for text in missing)
        )
    first = min(gpus, key=lambda g: g.total_mib)
    node = NodeFacts(
        name=name,
        address=address,
        gpus=len(gpus),
        gpu_name=first.name,
        gpu_memory_mib=first.total_mib,
        driver=first.driver,
        links=links,
        sglang_version=version,
        flags=flags,
        warnings=tuple(warnings),
    )
    return node, model, draft
