"""`autotune validate`, `diagnose` and `init`: the commands about one file (a study to check, a server
log to classify, a study to write); none opens a study's storage.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from autotune.cli.common import EXIT_FAILED
from autotune.config import load_study
from autotune.errors import AutotuneError, ConfigError
from autotune.tracking.store import check_store
from autotune.trial.launch import describe_launch
from autotune.trial.redaction import is_secret_name

# Where init's own options come from, as its errors name it (the --out file does not exist yet).
COMMAND_LINE = Path("autotune init")


def cmd_validate(args: argparse.Namespace) -> int:
    from autotune.node.executor import quick_node_check
    from autotune.node.pool import nodes_checked_here
    from autotune.sim.model_folder import what_is_served

    study = load_study(args.study_file, for_launch=False)
    study.check_flags()  # `run` checks again with the node's own flags, before any trial
    check_store(study.tracking_uri, study.path)  # `run` checks again unless --no-tracking
    server, space = study.file.server, study.search_space
    if not server.simulated and not study.objective.is_job:  # SGLang's model folders, asked of each node
        quick_node_check(nodes_checked_here(study), server, port=False)
    print(f"study {study.name}: OK")
    for unset in study.unset_env:  # status, best, report need none of them; run does
        print(f"  {unset.path}: {unset.field}: {unset.problem}: the commands that launch servers need it")
    print(
        f"  search space: {len(space.parameters)} parameters "
        f"({', '.join(sorted({p.kind for p in space.parameters.values()}))})"
    )
    print(f"  objective: {study.objective.goal} {study.objective.metric}")
    print(f"  storage: {study.storage}")
    print(f"  tracking: {study.tracking_uri}")
    if server.simulated and not study.objective.is_job:
        print(f"  model: {what_is_served(server.env)}")
    elif server.model_folders:
        print(f"  model: {', '.join(server.model_folders.values())}: config.json found on the node")
    print("baseline launch:")
    print("  " + describe_launch(study.server_launch(space.baseline())))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    import shlex
    from datetime import date

    from autotune.config import init
    from autotune.node.executor import runner_for
    from autotune.node.inspect import inspect_node

    if args.out.exists() and not args.force:
        raise ConfigError(args.out, "--out", str(args.out), "the file exists", "Pass --force to replace it.")
    command, env = shlex.split(args.server_command), init.parse_env(args.env, COMMAND_LINE)
    node = init.node_spec(args.node, COMMAND_LINE, key_file=args.key_file, known_hosts=args.known_hosts)
    local = node.address == "local"
    found, model, draft = inspect_node(
        runner_for(node),
        name=node.name,
        address=node.address,
        command=command,
        env=env,
        nvidia_smi=init.simulated_nvidia_smi(command) if init.is_simulated(command) else ["nvidia-smi"],
        model_path=init.node_path(args.model, local),
        draft_path=None if args.draft is None else init.node_path(args.draft, local),
    )
    text = init.study_text(
        out=args.out,
        name=args.name or init.study_name(model, found),
        node=found,
        model=model,
        draft=draft,
        command=command,
        env=env,
        spec=node,
        port=init.default_port(command) if args.port is None else init.parse_port(args.port, COMMAND_LINE),
        written_on=f" on {date.today().isoformat()}",
    )
    choice = init.choose(found, model, draft)
    print(f"node {found.name}: {found.describe()}\n  {found.describe_sglang()}")
    print(f"model {model.describe()}" + (f"\ndraft {draft.describe()}" if draft else ""))
    print(f"search space: {choice.search_space.relative_to(init.SHIPPED_DIR)} ({choice.why})")
    print(f"objective: {choice.objective.relative_to(init.SHIPPED_DIR)}")
    for warning in found.warnings:
        print(f"warning: {warning}")
    args.out.write_text(text)
    secrets = [name for name in env if is_secret_name(name)]
    for name in secrets:  # written as ${NAME}: the check below reads it as `run` will, from the environment
        os.environ.setdefault(name, env[name])
        print(f"note: {name} is written as ${{{name}}}: export it where you run autotune")
    try:
        study = load_study(args.out)  # what `autotune validate` reads: a file it refuses is not left behind
    except AutotuneError:
        args.out.unlink()
        raise
    for held in init.held_knobs(study.search_space, found.flags) if found.flags is not None else []:
        print(f"note: {held.notice()}")
    print(f"wrote {args.out}: `autotune validate` accepts it. Next:")
    print(f"  autotune validate {args.out}    # the baseline launch; launches nothing")
    print(f"  autotune run {args.out}         # the study")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from autotune.node.logwatch import READY_LINE
    from autotune.trial.failures import Phase, classify

    try:
        text = args.log_file.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError(args.log_file, "", str(args.log_file), "cannot read the log", str(exc)) from None
    # After the ready line, a CUDA out-of-memory error happened under load, not at start.
    phase: Phase = "benchmarking" if READY_LINE in text else "starting"
    failure = classify(text, phase)
    if args.json:
        found = (
            None
            if failure is None
            else {
                "kind": failure.kind.value,
                "line": failure.line,
                "description": failure.description,
                "advice": failure.advice,
                "culprits": list(failure.culprits),
            }
        )
        print(json.dumps({"log": str(args.log_file), "phase": phase, "failure": found}, indent=2))
    elif failure is None:
        state = "it had served requests" if phase == "benchmarking" else "it never became ready"
        print(f"{args.log_file}: no known failure pattern ({state})")
    else:
        print(f"{args.log_file}: {failure.kind.value}: {failure.description}")
        print(f"  line:   {failure.line}")
        if failure.culprits:
            print(f"  culprits: {' '.join(failure.culprits)}")
        print(f"  advice: {failure.advice}")
    return 0 if failure is None else EXIT_FAILED
