"""The pre-flight node check: can this node run the study's server at all, before any trial is spent?

`check_node` asks the node, through its command runner (so the same check serves local and SSH nodes):
is the node reachable and does it have the tools the runner needs, can the server command be found and
its module imported with the server's env, is the server's port free, which GPUs are there and is their
free memory balanced (SGLang refuses to start otherwise), is there disk for the logs, and, when the
benchmark runs on the node, can autotune's benchmark run there. Every problem comes with its fix.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.dialect import FlagTable, committed_table, table_from_help
from autotune.errors import AutotuneError
from autotune.node.runner import CommandRunner, LocalCommandRunner, NodeUnreachableError
from autotune.trial.launch import benchmark_python

__all__ = [
    "GPU",
    "MIN_FREE_LOG_BYTES",
    "NodeCheckError",
    "NodeProblem",
    "NodeReport",
    "benchmark_python",
    "check_node",
    "check_nodes",
    "gpu_problems",
    "model_folder_problems",
    "parse_gpus",
    "port_problems",
    "server_flags",
    "slowest_link",
    "visible_gpus",
]

MIN_FREE_LOG_BYTES = 256 << 20  # a server log is megabytes; a trial's worth of NCCL_DEBUG output, more
# SGLang (model_runner.py) raises "The memory capacity is unbalanced" when, with tp > 1, the smallest free
# memory of any rank is below 0.9 times a rank's own.
UNBALANCED_RATIO = 0.9
# Below this share of its memory free, a GPU is held by something else: trials would measure its leftovers.
BUSY_FREE_SHARE = 0.9
CHECK_TIMEOUT_S = 30.0
IMPORT_TIMEOUT_S = 180.0  # importing sglang pulls in torch: tens of seconds on a cold node
HELP_TIMEOUT_S = 240.0  # real SGLang's `--help` imports everything first: ~25 s warm, minutes cold
ACTORS_TIMEOUT_S = 900.0
BENCHMARK_MODULE = "autotune.measure.remote"

# Exit 3 when the server module cannot be found; else print the SGLang version it runs: the installed
# sglang distribution's, or the `__version__` that a stand-in for SGLang's launcher declares.
_SERVER_VERSION = """
import importlib, importlib.metadata, importlib.util, sys
try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
except ImportError:
    found = False
if not found:
    sys.exit(3)
try:
    print(importlib.metadata.version("sglang"))
except importlib.metadata.PackageNotFoundError:
    print(getattr(importlib.import_module(sys.argv[1]), "__version__", ""))
"""
_MISSING_TOOLS = 'for t in "$@"; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done'
_GPUS = (
    'command -v "$1" >/dev/null 2>&1 || exit 3; '
    'exec "$@" --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv,noheader,nounits'
)
# Bytes of safetensors weights under the model path (0 where it is not a local folder).
_WEIGHT_BYTES = (
    'find "$1" -maxdepth 2 -name "*.safetensors" -printf "%s\\n" 2>/dev/null '
    '| awk "{s+=\\$1} END {print s+0}"'
)

# Exit 3 where there is no nvidia-smi; else its GPU-to-GPU matrix.
_TOPOLOGY = 'command -v "$1" >/dev/null 2>&1 || exit 3; exec "$@" topo -m'

# Exit 3: no such folder; 4: a folder without config.json.
_MODEL_FOLDER = '[ -d "$1" ] || exit 3; [ -f "$1/config.json" ] || exit 4'
# A Hugging Face id (org/name), which SGLang downloads where no folder of that name is on the node.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")

# The free KiB of the file system a folder ($1, made first) is on: the log folder's here, a dump folder's in
# node.presharded.
FREE_KB = 'mkdir -p "$1" && df -Pk "$1" | awk \'NR == 2 { print $4 }\''


@dataclass(frozen=True)
class NodeProblem:
    """Something that keeps a node from running trials, and what to do about it."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}. {self.fix}"


@dataclass(frozen=True)
class GPU:
    """One GPU as nvidia-smi lists it (memory in MiB)."""

    index: int
    name: str
    total_mib: float
    free_mib: float
    driver: str = ""


@dataclass(frozen=True)
class NodeReport:
    """What the check found on one node: its problems, GPUs (None without nvidia-smi) and free log disk."""

    node: str
    problems: tuple[NodeProblem, ...] = ()
    gpus: tuple[GPU, ...] | None = None
    free_log_bytes: int | None = None
    weight_bytes: int | None = None  # the model's safetensors under model_path, when found there
    server_version: str | None = None  # the SGLang version the server command runs, when it says
    # The flags the server command accepts: the committed table of its version, else read from its --help.
    server_flags: FlagTable | None = None
    # Servers a dead actor or driver left running on the node, stopped before the check (process groups).
    stopped_left_behind: tuple[int, ...] = ()
    # The slowest path between two of the server's GPUs (`slowest_link`: NV18, SYS, ...); None for one GPU
    # or where `nvidia-smi topo -m` did not say.
    gpu_links: str | None = None

    @property
    def nvlink(self) -> bool:
        """Whether every pair of the server's GPUs is linked by NVLink."""
        return bool(self.gpu_links and self.gpu_links.startswith("NV"))

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def hardware(self) -> str | None:
        """The node's hardware fingerprint with the server's version and flag set, what decides whether a
        feature is supported: e.g. '8x NVIDIA H200 (140 GiB, driver 580.159.04), SGLang 0.5.17, flags
        381d4305'."""
        if not self.gpus:
            return None
        first = self.gpus[0]
        driver = f", driver {first.driver}" if first.driver else ""
        version = f", SGLang {self.server_version}" if self.server_version else ""
        flags = f", flags {self.server_flags.digest}" if self.server_flags is not None else ""
        return f"{len(self.gpus)}x {first.name} ({first.total_mib / 1024:.0f} GiB{driver}){version}{flags}"

    @property
    def gpu_memory_gb(self) -> float | None:
        """Memory of the node's smallest GPU, in GB (1e9 bytes)."""
        return min(g.total_mib for g in self.gpus) * 1.048576 / 1000 if self.gpus else None


class NodeCheckError(AutotuneError):
    """A node cannot run the study: every problem found, each with its fix."""

    def __init__(self, reports: Sequence[NodeReport]) -> None:
        self.reports = list(reports)
        lines = ["node check failed before any trial ran:"]
        lines += [f"  {r.node}: {problem}" for r in self.reports for problem in r.problems]
        super().__init__("\n".join(lines))


def check_node(
    node: str,
    runner: CommandRunner,
    *,
    command: Sequence[str],
    env: Mapping[str, str],
    host: str,
    port: int | None,
    log_dir: str,
    benchmark_on_node: bool = False,
    nvidia_smi: Sequence[str] = ("nvidia-smi",),
    model_path: str | None = None,
    model_folders: Mapping[str, str] | None = None,
) -> NodeReport:
    """Check that `node` can start `command` with `env` on (host, port), logging to `log_dir` there.

    `nvidia_smi` is the command that answers nvidia-smi's GPU query there; the report also carries the
    size of the safetensors weights under `model_path`, for the pre-flight memory check; `model_folders`
    (`ServerSpec.model_folders`) must be folders SGLang can load there."""
    problems: list[NodeProblem] = []
    gpus: tuple[GPU, ...] | None = None
    free: int | None = None
    weights: int | None = None
    version: str | None = None
    flags: FlagTable | None = None
    links: str | None = None
    try:
        # The first command also connects: an unreachable node ends the check here.
        tools: Sequence[str] = getattr(runner, "required_tools", ())
        missing = _sh(runner, _MISSING_TOOLS, tools).stdout.split()
        if missing:
            problems.append(
                NodeProblem(
                    f"{', '.join(missing)} not found on the node",
                    "Install them (setsid is in util-linux): autotune starts and stops servers with them.",
                )
            )
        command_trouble, version = _command_problems(runner, command, env)
        problems += command_trouble
        if not command_trouble:
            flags = server_flags(runner, command, env, version)
        problems += port_problems(runner, host, port)
        problems += model_folder_problems(runner, model_folders or {})
        gpus, gpu_trouble = _gpus(runner, env, nvidia_smi)
        problems += gpu_trouble
        links = _links(runner, env, nvidia_smi, gpus) if not gpu_trouble else None
        if model_path:
            found = _sh(runner, _WEIGHT_BYTES, [model_path]).stdout.strip()
            weights = int(found) if found.isdigit() and int(found) > 0 else None
        free, disk_trouble = _free_log_bytes(runner, log_dir)
        problems += disk_trouble
        if benchmark_on_node:
            problems += _benchmark_problems(runner, command, env)
    except NodeUnreachableError as exc:
        problems.append(NodeProblem(f"cannot reach the node: {exc.reason}", exc.fix))
    except TimeoutError as exc:
        problems.append(
            NodeProblem(f"the node did not answer a check: {exc}", "Check the node's load and network.")
        )
    return NodeReport(node, tuple(problems), gpus, free, weights, version, flags, gpu_links=links)


def port_problems(runner: CommandRunner, host: str, port: int | None) -> list[NodeProblem]:
    """The server's fixed `port` taken on the node (None: a free one is found at each launch)."""
    if port is None or runner.wait_port_free(host, port, 0):
        return []
    return [
        NodeProblem(
            f"port {port} is already in use on the node",
            f"Stop what listens there (ss -ltnp 'sport = :{port}' shows it; a server left from an "
            "earlier run?) or set server.port to a free port, or to auto.",
        )
    ]


def model_folder_problems(runner: CommandRunner, folders: Mapping[str, str]) -> list[NodeProblem]:
    """The model folders (`ServerSpec.model_folders`: field -> path) that SGLang cannot load on the node:
    missing there, or without config.json. A Hugging Face id that is no folder there is SGLang's to
    download."""
    problems = []
    for field, path in folders.items():
        done = _sh(runner, _MODEL_FOLDER, [path])
        if done.returncode == 3 and not _HUB_ID.fullmatch(path):
            problems.append(
                NodeProblem(
                    f"{field} {path} does not exist on the node",
                    f"Set {field} to the model's folder there (the one with config.json and the "
                    "*.safetensors files), or to a Hugging Face id (org/name) for SGLang to download",
                )
            )
        elif done.returncode == 4:
            problems.append(
                NodeProblem(
                    f"{field} {path} on the node has no config.json",
                    f"Set {field} to the folder that holds config.json and the *.safetensors files (a "
                    "Hugging Face model: `huggingface-cli download ID --local-dir DIR`)",
                )
            )
    return problems


def _sh(
    runner: CommandRunner,
    script: str,
    args: Sequence[str] = (),
    timeout_s: float = CHECK_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> Any:
    return runner.run(["sh", "-c", script, "sh", *args], env, timeout_s=timeout_s)


def _last_line(text: str) -> str:
    return next((line for line in reversed(text.splitlines()) if line.strip()), "").strip()[:300]


def _command_problems(
    runner: CommandRunner, command: Sequence[str], env: Mapping[str, str]
) -> tuple[list[NodeProblem], str | None]:
    """What keeps the server command from starting, and the SGLang version it runs (when `PY -m ...`)."""
    if len(command) >= 3 and command[1] == "-m":
        python, module = command[0], command[2]
        done = runner.run([python, "-c", _SERVER_VERSION, module], env, IMPORT_TIMEOUT_S)
        other = _other_python(runner, python, module, env) if done.returncode else ""
        if done.returncode in (126, 127):
            return [
                NodeProblem(
                    f"the server command's Python {python!r} is not found on the node",
                    "Install it there or set server.command to the node's interpreter, "
                    f"e.g. [/opt/venv/bin/python, -m, {module}].",
                )
            ], None
        if done.returncode == 3:
            return [
                NodeProblem(
                    f"server command module {module!r} cannot be imported by {python} on the node",
                    f"Install it into that environment (pip install {module.split('.')[0]}) or set "
                    "server.command to the Python that has it." + other,
                )
            ], None
        if done.returncode != 0:
            return [
                NodeProblem(
                    f"{python} failed looking up {module!r} on the node: {_last_line(done.stderr)}",
                    f"Run `{python} -c 'import {module}'` on the node to see why." + other,
                )
            ], None
        return [], done.stdout.strip() or None
    done = _sh(runner, 'command -v "$1"', [command[0]])
    if done.returncode != 0:
        return [
            NodeProblem(
                f"server command {command[0]!r} is not found on the node",
                "Install it there or give its full path in server.command.",
            )
        ], None
    return [], None


def _other_python(runner: CommandRunner, python: str, module: str, env: Mapping[str, str]) -> str:
    """On this machine, where the server command's `python` is not the interpreter autotune runs in (its
    virtual environment not activated, as `.venv/bin/autotune run ...` leaves it): a sentence saying so."""
    if not isinstance(runner, LocalCommandRunner):
        return ""
    found = shutil.which(python, path=env.get("PATH", os.environ.get("PATH")))
    if found is None or os.path.abspath(found) == os.path.abspath(sys.executable):
        return ""
    return (
        f" Here `{python}` is {found}, not the Python autotune runs in ({sys.executable}): activate that "
        f"environment first (e.g. `source .venv/bin/activate`) or set server.command to "
        f"[{sys.executable}, -m, {module}]."
    )


def server_flags(
    runner: CommandRunner, command: Sequence[str], env: Mapping[str, str], version: str | None
) -> FlagTable | None:
    """The flags `command` accepts: the committed table of exactly `version`, else its `--help` (None
    when that fails, or for a command that is no SGLang: launches then pass the flags unchanged)."""
    table = committed_table(version) if version else None
    if table is not None:
        return table
    if not version and not any("sglang" in word for word in command):
        return None  # a job's command (autotune.measure.nccl): its --help could run it
    try:
        done = runner.run([*command, "--help"], env, HELP_TIMEOUT_S)
    except TimeoutError:
        return None  # flags pass unchanged: a slow --help must not fail the node check
    if done.returncode != 0:
        return None
    learned = table_from_help(done.stdout, version, f"{' '.join(command)} --help")
    return learned if learned.flags else None


def _gpus(
    runner: CommandRunner, env: Mapping[str, str], nvidia_smi: Sequence[str]
) -> tuple[tuple[GPU, ...] | None, list[NodeProblem]]:
    done = _sh(runner, _GPUS, nvidia_smi, env=env)
    if done.returncode == 3:
        return None, []  # no NVIDIA driver tools: a simulated node, or GPUs nvidia-smi does not manage
    if done.returncode != 0:
        return None, [
            NodeProblem(
                f"nvidia-smi failed on the node: {_last_line(done.stderr or done.stdout)}",
                "Check the NVIDIA driver there (run nvidia-smi by hand).",
            )
        ]
    gpus = parse_gpus(done.stdout)
    return gpus, gpu_problems(gpus, env.get("CUDA_VISIBLE_DEVICES"))


def _links(
    runner: CommandRunner, env: Mapping[str, str], nvidia_smi: Sequence[str], gpus: Sequence[GPU] | None
) -> str | None:
    """The slowest path between two of the GPUs the server sees (None for fewer than two, or where
    `nvidia-smi topo -m` does not say)."""
    visible = visible_gpus(gpus or (), env.get("CUDA_VISIBLE_DEVICES"))
    if len(visible) < 2:
        return None
    done = _sh(runner, _TOPOLOGY, nvidia_smi, env=env)
    return slowest_link(done.stdout, [g.index for g in visible]) if done.returncode == 0 else None


def parse_gpus(text: str) -> tuple[GPU, ...]:
    """GPUs from nvidia-smi's `--query-gpu=index,name,memory.total,memory.free,driver_version` as
    csv,noheader,nounits (the driver column may be missing)."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        driver = fields.pop() if len(fields) >= 5 else ""  # the last column asked for
        try:
            gpus.append(
                GPU(int(fields[0]), ", ".join(fields[1:-2]), float(fields[-2]), float(fields[-1]), driver)
            )
        except ValueError:
            continue  # "[N/A]" or "[Not Supported]" fields
    return tuple(gpus)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU_NAME = re.compile(r"^GPU(\d+)$")
# `nvidia-smi topo -m`'s path types between two GPUs, fastest first after NVLink (its legend's order).
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")


def slowest_link(text: str, indices: Sequence[int] | None = None) -> str | None:
    """The slowest path between two GPUs (of `indices`, when given) in `nvidia-smi topo -m`'s matrix:
    `NV<n>` (n bonded NVLinks, the fewest of any pair) when every pair has NVLink, else the farthest PCIe
    path (PIX < PXB < PHB < NODE < SYS). None for a single GPU or a matrix it cannot read."""
    rows = [_ANSI.sub("", line).split("\t") for line in text.splitlines()]
    header = next((row for row in rows if any(_GPU_NAME.match(cell.strip()) for cell in row)), None)
    if header is None:
        return None
    columns = {i: int(m.group(1)) for i, cell in enumerate(header) if (m := _GPU_NAME.match(cell.strip()))}
    wanted = set(indices) if indices is not None else set(columns.values())
    links: list[str] = []
    for row in rows:
        label = _GPU_NAME.match(row[0].strip()) if row and row is not header else None
        if label is None or int(label.group(1)) not in wanted:
            continue
        for i, gpu in columns.items():
            if gpu in wanted and gpu != int(label.group(1)) and i < len(row):
                links.append(row[i].strip())
    if not links:
        return None
    pcie = [link for link in links if link in PCIE_PATHS]
    if pcie:
        return max(pcie, key=PCIE_PATHS.index)
    nvlinks = [int(link[2:]) for link in links if link.startswith("NV") and link[2:].isdigit()]
    return f"NV{min(nvlinks)}" if nvlinks else None


def visible_gpus(gpus: Sequence[GPU], visible: str | None) -> list[GPU]:
    """The GPUs a server sees: those CUDA_VISIBLE_DEVICES (`visible`) lists by index, else all."""
    if visible and all(part.strip().isdigit() for part in visible.split(",")):
        wanted = {int(part) for part in visible.split(",")}
        return [g for g in gpus if g.index in wanted]
    return list(gpus)


def gpu_problems(gpus: Sequence[GPU], visible: str | None = None) -> list[NodeProblem]:
    """What keeps these GPUs (those in CUDA_VISIBLE_DEVICES `visible`, when it lists indices) from a trial."""
    gpus = visible_gpus(gpus, visible)
    if not gpus:
        return [
            NodeProblem(
                "nvidia-smi lists no usable GPU on the node",
                "Check the driver, and CUDA_VISIBLE_DEVICES in server.env.",
            )
        ]
    problems = []
    busy = [g for g in gpus if g.free_mib < BUSY_FREE_SHARE * g.total_mib]
    if busy:
        held = ", ".join(f"GPU {g.index}: {(g.total_mib - g.free_mib) / 1024:.1f} GiB in use" for g in busy)
        problems.append(
            NodeProblem(
                f"another process holds GPU memory ({held})",
                "Stop it before tuning (nvidia-smi lists the processes): trials would run out of memory or "
                "measure a smaller KV cache.",
            )
        )
    low, high = min(gpus, key=lambda g: g.free_mib), max(gpus, key=lambda g: g.free_mib)
    if len(gpus) > 1 and low.free_mib < UNBALANCED_RATIO * high.free_mib:
        problems.append(
            NodeProblem(
                f"free GPU memory is unbalanced (GPU {low.index}: {low.free_mib / 1024:.1f} GiB free, "
                f"GPU {high.index}: {high.free_mib / 1024:.1f} GiB); SGLang refuses to start with "
                "'The memory capacity is unbalanced'",
                "Stop the processes holding memory on the fuller GPUs, or leave those GPUs out with "
                "CUDA_VISIBLE_DEVICES in server.env.",
            )
        )
    return problems


def _free_log_bytes(runner: CommandRunner, log_dir: str) -> tuple[int | None, list[NodeProblem]]:
    done = _sh(runner, FREE_KB, [log_dir])
    text = done.stdout.strip()
    if done.returncode != 0 or not text.isdigit():
        return None, [
            NodeProblem(
                f"cannot use the log folder {log_dir} on the node: "
                f"{_last_line(done.stderr) or 'no df output'}",
                "Make it writable, or for an ssh:// node set remote_dir to a folder the login can write.",
            )
        ]
    free = int(text) * 1024
    if free < MIN_FREE_LOG_BYTES:
        return free, [
            NodeProblem(
                f"only {free >> 20} MiB free for logs in {log_dir} on the node",
                f"Free at least {MIN_FREE_LOG_BYTES >> 20} MiB there, or for an ssh:// node set remote_dir "
                "to a folder on a larger disk.",
            )
        ]
    return free, []


def _benchmark_problems(
    runner: CommandRunner, command: Sequence[str], env: Mapping[str, str]
) -> list[NodeProblem]:
    python = benchmark_python(command)
    done = runner.run([python, "-c", f"import {BENCHMARK_MODULE}"], env, IMPORT_TIMEOUT_S)
    if done.returncode == 0:
        return []
    return [
        NodeProblem(
            f"benchmark_from: node, but {python} on the node cannot import {BENCHMARK_MODULE} "
            f"({_last_line(done.stderr) or f'status {done.returncode}'})",
            f"Install autotune into that environment ({python} -m pip install autotune), or set "
            "benchmark_from: driver.",
        )
    ]


def check_nodes(
    server: Any, actors: Mapping[str, Any], timeout_s: float = ACTORS_TIMEOUT_S
) -> list[NodeReport]:
    """Run every node actor's check (`NodeActor.check(server)`) at once; raises `NodeCheckError` when any
    node has a problem or does not answer within `timeout_s`."""
    import ray

    refs = {name: actor.check.remote(server) for name, actor in actors.items()}
    reports: list[NodeReport] = []
    for name, ref in refs.items():
        try:
            reports.append(ray.get(ref, timeout=timeout_s))
        except ray.exceptions.GetTimeoutError:
            problem = NodeProblem(
                f"its actor did not answer within {timeout_s:g} s",
                "Check that the Ray cluster has a free node with the gpu_node resource for it.",
            )
            reports.append(NodeReport(name, (problem,)))
        except ray.exceptions.RayActorError as exc:
            problem = NodeProblem(f"its actor died: {str(exc)[:300]}", "Read the Ray logs of that node.")
            reports.append(NodeReport(name, (problem,)))
    failed = [r for r in reports if not r.ok]
    if failed:
        for actor in actors.values():
            ray.kill(actor, no_restart=True)
        raise NodeCheckError(failed)
    return reports
